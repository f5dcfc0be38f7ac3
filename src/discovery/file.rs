//! The file backend: the topology as a small JSON document, replaced
//! atomically, for anything that can watch a file (HAProxy helpers,
//! consul-template, systemd path units, a sidecar).
//!
//! The document (see `docs/discovery.md`):
//!
//! ```json
//! {"group":"cache","epoch":7,"master":"10.1.0.6:6379","master_host":"10.1.0.6",
//!  "master_port":6379,"replicas":["10.1.0.5:6379"],"reporter":"leader",
//!  "updated_at":"2025-05-01T12:00:00.123Z"}
//! ```
//!
//! Invariant 3 is enforced by comparing before renaming: the existing file
//! is read first, and a higher epoch there refuses the write. Readers only
//! ever see a whole old document or a whole new one (temp file in the same
//! directory, fsync, rename, fsync of the directory), also across a crash.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{Backend, BoxFuture, DiscoveryError, Fence, Reporter, Topology};
use crate::addr::Addr;
use crate::config::FileConfig;

/// The JSON document the file backend writes.
///
/// `master`, `master_host` and `master_port` are `null` while the group is
/// fenced (between the fence of the old master and the publication of the
/// new one): a reader must then route writes nowhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDocument {
    /// The group.
    pub group: String,
    /// The config epoch of this content.
    pub epoch: u64,
    /// `ip:port` of the master, or `null` while fenced.
    pub master: Option<Addr>,
    /// The master's host alone.
    pub master_host: Option<String>,
    /// The master's port alone.
    pub master_port: Option<u16>,
    /// `ip:port` of the known replicas, sorted.
    pub replicas: Vec<Addr>,
    /// `leader` or `observer`: which kind of daemon wrote this content.
    pub reporter: Reporter,
    /// When the file was written (RFC 3339, UTC).
    pub updated_at: String,
}

impl FileDocument {
    /// Whether two documents advertise the same routing: everything but
    /// who wrote it and when. Equal routing at an equal epoch is not
    /// rewritten, so that the leader and every observer publishing the same
    /// outcome cause one write, not one per daemon.
    fn same_routing(&self, other: &FileDocument) -> bool {
        self.group == other.group
            && self.epoch == other.epoch
            && self.master == other.master
            && self.replicas == other.replicas
    }
}

/// Writes the topology of one group to one JSON file.
#[derive(Debug, Clone)]
pub struct FileBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    required: bool,
    /// Serializes read-compare-rename inside this process. It is a std
    /// mutex taken on the blocking thread, so a write whose future was
    /// dropped (superseded) still finishes before the next one reads.
    lock: Mutex<()>,
    /// Makes temp file names unique within the process.
    seq: AtomicU64,
}

impl FileBackend {
    /// A backend for `cfg.path`. Fails when the path has no file name.
    pub fn new(cfg: &FileConfig) -> Result<Self, DiscoveryError> {
        if cfg.path.file_name().is_none() {
            return Err(DiscoveryError::Permanent(format!(
                "file backend: {} has no file name",
                cfg.path.display()
            )));
        }
        Ok(FileBackend {
            inner: Arc::new(Inner {
                path: cfg.path.clone(),
                required: cfg.required,
                lock: Mutex::new(()),
                seq: AtomicU64::new(0),
            }),
        })
    }

    /// The file written.
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `decide` on the current document and writes what it returns, on
    /// a blocking thread (file I/O and fsync block).
    async fn update<F>(&self, decide: F) -> Result<(), DiscoveryError>
    where
        F: FnOnce(Option<FileDocument>) -> Result<Option<FileDocument>, DiscoveryError>
            + Send
            + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.update(decide))
            .await
            .map_err(|e| {
                DiscoveryError::Transient(format!("file backend: write task failed: {e}"))
            })?
    }
}

impl Inner {
    fn update<F>(&self, decide: F) -> Result<(), DiscoveryError>
    where
        F: FnOnce(Option<FileDocument>) -> Result<Option<FileDocument>, DiscoveryError>,
    {
        // A poisoned lock means a panic in a previous write; the file itself
        // is still whole (rename is atomic), so carry on.
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.read_current()?;
        match decide(current)? {
            Some(doc) => self.replace(&doc),
            None => Ok(()),
        }
    }

    /// The current document; `None` when there is no file or it is empty
    /// (an operator may pre-create it with `touch`). Anything else that
    /// does not parse is refused: it may hold an epoch we cannot see.
    fn read_current(&self) -> Result<Option<FileDocument>, DiscoveryError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("read", &self.path, &e)),
        };
        if text.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&text).map(Some).map_err(|e| {
            DiscoveryError::Permanent(format!(
                "file backend: {} is not a picket topology document ({e}); \
                 refusing to overwrite it",
                self.path.display()
            ))
        })
    }

    /// Write `doc` to a temp file beside the target, fsync, rename over the
    /// target, fsync the directory.
    fn replace(&self, doc: &FileDocument) -> Result<(), DiscoveryError> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.{}.{seq}.tmp", std::process::id()));
        let mut body = serde_json::to_vec_pretty(doc)
            .map_err(|e| DiscoveryError::Permanent(format!("file backend: encode: {e}")))?;
        body.push(b'\n');

        let result = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(|e| io_error("create", &tmp, &e))?;
            f.write_all(&body)
                .map_err(|e| io_error("write", &tmp, &e))?;
            f.sync_all().map_err(|e| io_error("fsync", &tmp, &e))?;
            drop(f);
            fs::rename(&tmp, &self.path).map_err(|e| io_error("rename", &self.path, &e))?;
            Ok(())
        })();
        if result.is_err() {
            // Best effort: a leftover temp file is harmless but untidy.
            let _ = fs::remove_file(&tmp);
            return result;
        }
        // Without this the rename itself may be lost in a crash, and a
        // reader after reboot would see the old master.
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("fsync directory", &dir, &e))
    }
}

/// I/O errors are retried, except those an operator has to fix.
fn io_error(what: &str, path: &Path, e: &io::Error) -> DiscoveryError {
    let msg = format!("file backend: {what} {}: {e}", path.display());
    match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            DiscoveryError::Permanent(msg)
        }
        _ => DiscoveryError::Transient(msg),
    }
}

/// Current time as RFC 3339 with milliseconds, UTC. Wall-clock time is what
/// a reader wants here; nothing in picket times itself with it.
pub(crate) fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// A refused write when the file belongs to another group.
fn check_group(current: &FileDocument, group: &str, path: &Path) -> Result<(), DiscoveryError> {
    if current.group == group {
        Ok(())
    } else {
        Err(DiscoveryError::Permanent(format!(
            "file backend: {} belongs to group {:?}, not {:?}",
            path.display(),
            current.group,
            group
        )))
    }
}

impl Backend for FileBackend {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn name(&self) -> String {
        format!("file:{}", self.inner.path.display())
    }

    fn required(&self) -> bool {
        self.inner.required
    }

    fn fence<'a>(&'a self, fence: &'a Fence) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        let fence = fence.clone();
        let path = self.inner.path.clone();
        Box::pin(self.update(move |current| {
            let replicas = match &current {
                Some(cur) => {
                    check_group(cur, &fence.group, &path)?;
                    if cur.epoch > fence.epoch {
                        return Err(DiscoveryError::Stale {
                            stored: cur.epoch,
                            ours: fence.epoch,
                        });
                    }
                    // At the same epoch, only the fenced master is removed:
                    // another master there was published by this very
                    // failover (a late fence must not undo it), and `null`
                    // means the fence already happened.
                    if cur.epoch == fence.epoch && cur.master.as_ref() != Some(&fence.old_master) {
                        return Ok(None);
                    }
                    let mut r = cur.replicas.clone();
                    r.retain(|a| *a != fence.old_master);
                    r
                }
                None => Vec::new(),
            };
            Ok(Some(FileDocument {
                group: fence.group.clone(),
                epoch: fence.epoch,
                master: None,
                master_host: None,
                master_port: None,
                replicas,
                // Only the failover leader fences.
                reporter: Reporter::Leader,
                updated_at: now_rfc3339(),
            }))
        }))
    }

    fn publish<'a>(&'a self, t: &'a Topology) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        let mut replicas = t.replicas.clone();
        replicas.sort();
        replicas.dedup();
        let doc = FileDocument {
            group: t.group.clone(),
            epoch: t.epoch,
            master: Some(t.master.clone()),
            master_host: Some(t.master.host.clone()),
            master_port: Some(t.master.port),
            replicas,
            reporter: t.reporter,
            updated_at: String::new(),
        };
        let path = self.inner.path.clone();
        Box::pin(self.update(move |current| {
            if let Some(cur) = &current {
                check_group(cur, &doc.group, &path)?;
                if cur.epoch > doc.epoch {
                    return Err(DiscoveryError::Stale {
                        stored: cur.epoch,
                        ours: doc.epoch,
                    });
                }
                if cur.same_routing(&doc) {
                    return Ok(None);
                }
            }
            Ok(Some(FileDocument {
                updated_at: now_rfc3339(),
                ..doc
            }))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn backend(dir: &Path) -> FileBackend {
        FileBackend::new(&FileConfig {
            path: dir.join("cache.json"),
            required: true,
        })
        .unwrap()
    }

    fn topo(epoch: u64, master: &str, replicas: &[&str], reporter: Reporter) -> Topology {
        Topology {
            group: "cache".into(),
            epoch,
            master: master.parse().unwrap(),
            old_master: None,
            replicas: replicas.iter().map(|r| r.parse().unwrap()).collect(),
            reporter,
        }
    }

    fn read_json(b: &FileBackend) -> serde_json::Value {
        serde_json::from_str(&fs::read_to_string(b.path()).unwrap()).unwrap()
    }

    /// The document without its timestamp, after checking the timestamp is
    /// a recent RFC 3339 time.
    fn without_time(mut v: serde_json::Value) -> serde_json::Value {
        let at = v["updated_at"].as_str().unwrap().to_string();
        let t = humantime::parse_rfc3339(&at).unwrap();
        let age = std::time::SystemTime::now().duration_since(t).unwrap();
        assert!(
            age < std::time::Duration::from_secs(60),
            "updated_at {at} is old"
        );
        v.as_object_mut().unwrap().remove("updated_at");
        v
    }

    fn dir_entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn publish_writes_the_documented_document() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        b.publish(&topo(
            7,
            "10.1.0.6:6379",
            &["10.1.0.7:6379", "10.1.0.5:6379"],
            Reporter::Leader,
        ))
        .await
        .unwrap();
        let v = read_json(&b);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 8, "exactly the documented keys: {keys:?}");
        assert_eq!(
            without_time(v),
            json!({
                "group": "cache",
                "epoch": 7,
                "master": "10.1.0.6:6379",
                "master_host": "10.1.0.6",
                "master_port": 6379,
                "replicas": ["10.1.0.5:6379", "10.1.0.7:6379"],
                "reporter": "leader",
            })
        );
        // No temp file left behind.
        assert_eq!(dir_entries(dir.path()), vec!["cache.json".to_string()]);
    }

    #[tokio::test]
    async fn ipv6_master_is_bracketed() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        b.publish(&topo(1, "[fd00::1]:6379", &[], Reporter::Observer))
            .await
            .unwrap();
        let v = read_json(&b);
        assert_eq!(v["master"], "[fd00::1]:6379");
        assert_eq!(v["master_host"], "fd00::1");
        assert_eq!(v["reporter"], "observer");
    }

    #[tokio::test]
    async fn replace_is_atomic_a_new_inode() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        b.publish(&topo(1, "10.0.0.1:6379", &[], Reporter::Leader))
            .await
            .unwrap();
        // A reader holding the old file keeps reading the old, whole content.
        let old_inode = fs::metadata(b.path()).unwrap().ino();
        let old_text = fs::read_to_string(b.path()).unwrap();
        let held = File::open(b.path()).unwrap();
        b.publish(&topo(2, "10.0.0.2:6379", &[], Reporter::Leader))
            .await
            .unwrap();
        let new_inode = fs::metadata(b.path()).unwrap().ino();
        assert_ne!(old_inode, new_inode, "rename, not rewrite in place");
        assert_eq!(held.metadata().unwrap().ino(), old_inode);
        assert_eq!(
            io::read_to_string(&held).unwrap(),
            old_text,
            "the old file is untouched"
        );
        assert_eq!(read_json(&b)["master"], "10.0.0.2:6379");
        assert_eq!(dir_entries(dir.path()), vec!["cache.json".to_string()]);
    }

    #[tokio::test]
    async fn refuses_a_lower_epoch_and_leaves_the_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        b.publish(&topo(5, "10.0.0.5:6379", &[], Reporter::Leader))
            .await
            .unwrap();
        let before = fs::read(b.path()).unwrap();
        let err = b
            .publish(&topo(4, "10.0.0.4:6379", &[], Reporter::Leader))
            .await
            .unwrap_err();
        assert_eq!(err, DiscoveryError::Stale { stored: 5, ours: 4 });
        let err = b
            .fence(&Fence {
                group: "cache".into(),
                epoch: 3,
                old_master: "10.0.0.5:6379".parse().unwrap(),
            })
            .await
            .unwrap_err();
        assert_eq!(err, DiscoveryError::Stale { stored: 5, ours: 3 });
        assert_eq!(fs::read(b.path()).unwrap(), before);
    }

    #[tokio::test]
    async fn equal_epoch_and_content_is_not_rewritten() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        b.publish(&topo(
            3,
            "10.0.0.3:6379",
            &["10.0.0.4:6379"],
            Reporter::Leader,
        ))
        .await
        .unwrap();
        let before = fs::read(b.path()).unwrap();
        let inode = fs::metadata(b.path()).unwrap().ino();
        // An observer reports the same outcome: nothing changes, not even
        // the reporter or the timestamp.
        b.publish(&topo(
            3,
            "10.0.0.3:6379",
            &["10.0.0.4:6379"],
            Reporter::Observer,
        ))
        .await
        .unwrap();
        assert_eq!(fs::read(b.path()).unwrap(), before);
        assert_eq!(fs::metadata(b.path()).unwrap().ino(), inode);
        // New replicas at the same epoch are written.
        b.publish(&topo(
            3,
            "10.0.0.3:6379",
            &["10.0.0.4:6379", "10.0.0.9:6379"],
            Reporter::Observer,
        ))
        .await
        .unwrap();
        let v = read_json(&b);
        assert_eq!(v["replicas"], json!(["10.0.0.4:6379", "10.0.0.9:6379"]));
        assert_eq!(v["epoch"], 3);
    }

    #[tokio::test]
    async fn fence_clears_the_master_then_publish_sets_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        b.publish(&topo(
            1,
            "10.0.0.1:6379",
            &["10.0.0.2:6379"],
            Reporter::Leader,
        ))
        .await
        .unwrap();
        let fence = Fence {
            group: "cache".into(),
            epoch: 2,
            old_master: "10.0.0.1:6379".parse().unwrap(),
        };
        b.fence(&fence).await.unwrap();
        assert_eq!(
            without_time(read_json(&b)),
            json!({
                "group": "cache",
                "epoch": 2,
                "master": null,
                "master_host": null,
                "master_port": null,
                "replicas": ["10.0.0.2:6379"],
                "reporter": "leader",
            })
        );
        // Fencing again at the same epoch is a no-op.
        let before = fs::read(b.path()).unwrap();
        b.fence(&fence).await.unwrap();
        assert_eq!(fs::read(b.path()).unwrap(), before);

        b.publish(&topo(2, "10.0.0.2:6379", &[], Reporter::Leader))
            .await
            .unwrap();
        assert_eq!(read_json(&b)["master"], "10.0.0.2:6379");
        // A late retry of the fence must not take the new master out.
        b.fence(&fence).await.unwrap();
        assert_eq!(read_json(&b)["master"], "10.0.0.2:6379");
    }

    #[tokio::test]
    async fn fence_of_another_master_at_an_older_epoch_still_clears() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        b.publish(&topo(1, "10.0.0.1:6379", &[], Reporter::Leader))
            .await
            .unwrap();
        // The file lags behind (it still shows epoch 1's master) while the
        // leader of epoch 3 fences the master of epoch 2: the newer decision
        // wins and nothing is advertised.
        b.fence(&Fence {
            group: "cache".into(),
            epoch: 3,
            old_master: "10.0.0.2:6379".parse().unwrap(),
        })
        .await
        .unwrap();
        let v = read_json(&b);
        assert_eq!(v["master"], serde_json::Value::Null);
        assert_eq!(v["epoch"], 3);
    }

    #[tokio::test]
    async fn fence_without_a_file_writes_no_master() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        b.fence(&Fence {
            group: "cache".into(),
            epoch: 4,
            old_master: "10.0.0.1:6379".parse().unwrap(),
        })
        .await
        .unwrap();
        let v = read_json(&b);
        assert_eq!(v["master"], serde_json::Value::Null);
        assert_eq!(v["epoch"], 4);
    }

    #[tokio::test]
    async fn corrupt_file_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        fs::write(b.path(), b"{\"group\": \"cache\", \"epoch\": 9, trunc").unwrap();
        let err = b
            .publish(&topo(10, "10.0.0.1:6379", &[], Reporter::Leader))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, DiscoveryError::Permanent(m) if m.contains("refusing to overwrite")),
            "{err:?}"
        );
        let err = b
            .fence(&Fence {
                group: "cache".into(),
                epoch: 10,
                old_master: "10.0.0.1:6379".parse().unwrap(),
            })
            .await
            .unwrap_err();
        assert!(matches!(err, DiscoveryError::Permanent(_)), "{err:?}");
        assert_eq!(
            fs::read(b.path()).unwrap(),
            b"{\"group\": \"cache\", \"epoch\": 9, trunc"
        );
        assert_eq!(dir_entries(dir.path()), vec!["cache.json".to_string()]);
    }

    #[tokio::test]
    async fn empty_file_counts_as_absent() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        fs::write(b.path(), b"").unwrap();
        b.publish(&topo(1, "10.0.0.1:6379", &[], Reporter::Leader))
            .await
            .unwrap();
        assert_eq!(read_json(&b)["epoch"], 1);
    }

    #[tokio::test]
    async fn another_groups_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        let mut t = topo(1, "10.0.0.1:6379", &[], Reporter::Leader);
        t.group = "sessions".into();
        b.publish(&t).await.unwrap();
        let err = b
            .publish(&topo(2, "10.0.0.2:6379", &[], Reporter::Leader))
            .await
            .unwrap_err();
        assert!(matches!(err, DiscoveryError::Permanent(_)), "{err:?}");
        assert_eq!(read_json(&b)["group"], "sessions");
    }

    #[tokio::test]
    async fn missing_directory_is_transient() {
        let dir = tempfile::tempdir().unwrap();
        let b = FileBackend::new(&FileConfig {
            path: dir.path().join("not-yet").join("cache.json"),
            required: false,
        })
        .unwrap();
        assert!(!b.required());
        assert_eq!(b.kind(), "file");
        let err = b
            .publish(&topo(1, "10.0.0.1:6379", &[], Reporter::Leader))
            .await
            .unwrap_err();
        assert!(matches!(err, DiscoveryError::Transient(_)), "{err:?}");
        // Once the directory exists the same write goes through.
        fs::create_dir(dir.path().join("not-yet")).unwrap();
        b.publish(&topo(1, "10.0.0.1:6379", &[], Reporter::Leader))
            .await
            .unwrap();
        assert_eq!(read_json(&b)["epoch"], 1);
    }

    #[tokio::test]
    async fn concurrent_writes_keep_the_highest_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path());
        let mut tasks = Vec::new();
        for epoch in 1..=20u64 {
            let b = b.clone();
            tasks.push(tokio::spawn(async move {
                let master = format!("10.0.0.{epoch}:6379");
                b.publish(&topo(epoch, &master, &[], Reporter::Leader))
                    .await
            }));
        }
        for t in tasks {
            match t.await.unwrap() {
                Ok(()) | Err(DiscoveryError::Stale { .. }) => {}
                Err(e) => panic!("{e:?}"),
            }
        }
        let v = read_json(&b);
        assert_eq!(v["epoch"], 20);
        assert_eq!(v["master"], "10.0.0.20:6379");
        assert_eq!(dir_entries(dir.path()), vec!["cache.json".to_string()]);
    }
}
