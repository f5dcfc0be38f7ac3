//! The state a daemon must never forget: its id, the current epoch, its
//! vote per group and the config (master and config epoch) of each group.
//!
//! Every change is written to `data_dir/state.json` with write, fsync,
//! rename and fsync of the directory *before* the change becomes visible
//! in memory, so nothing that depends on it (a vote reply, a hello) can
//! go out before it is durable (invariant 1). A file that cannot be read
//! or parsed stops the daemon: resetting it could mean voting twice.
//!
//! A write that fails later (a full disk, a read-only remount) is not fatal:
//! the change is refused, so the daemon neither votes nor starts elections
//! until a write succeeds again, and the failure is reported
//! ([`StateStore::write_error`], `picket_state_writable`, `/readyz`).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::addr::Addr;
use crate::metrics as m;
pub use crate::quorum::election::Vote;
use crate::quorum::election::{VoteRecord, cast_vote, new_epoch};

/// File name inside `data_dir`.
pub const STATE_FILE: &str = "state.json";
const FORMAT_VERSION: u32 = 1;

/// Errors of the state file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The data directory cannot be created or used.
    #[error("data_dir {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The state file exists but cannot be read.
    #[error(
        "state file {path} cannot be read: {source} (refusing to start: a reset could let this daemon vote twice)"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The state file is not valid.
    #[error(
        "state file {path} is corrupt: {reason} (refusing to start: a reset could let this daemon vote twice; restore it from a backup or remove it deliberately)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Writing the state failed; the change was not applied.
    #[error("cannot persist state to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The id in the config differs from the persisted one.
    #[error(
        "daemon.id {configured:?} differs from the id {persisted:?} persisted in {path}; peers know this daemon by the persisted id"
    )]
    IdMismatch {
        /// From the config.
        configured: String,
        /// From the file.
        persisted: String,
        /// The file.
        path: PathBuf,
    },
}

/// What is persisted for one group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The epoch in which `master` was chosen (0: the configured master).
    pub config_epoch: u64,
    /// The current master, once a failover (or a peer) set it.
    pub master: Option<Addr>,
    /// The epoch of this daemon's last vote for this group.
    pub vote_epoch: u64,
    /// Whom it voted for in `vote_epoch` (a daemon id).
    pub voted_for: Option<String>,
}

impl GroupRecord {
    fn vote_record(&self) -> VoteRecord {
        VoteRecord {
            vote_epoch: self.vote_epoch,
            voted_for: self.voted_for.clone(),
        }
    }

    fn set_vote_record(&mut self, r: VoteRecord) {
        self.vote_epoch = r.vote_epoch;
        self.voted_for = r.voted_for;
    }
}

/// The whole persisted state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedState {
    /// File format version.
    pub version: u32,
    /// This daemon's id.
    pub daemon_id: String,
    /// The highest epoch seen or started.
    pub current_epoch: u64,
    /// Per group.
    pub groups: BTreeMap<String, GroupRecord>,
}

/// Owner of the state file. Shared by all group tasks; every update is
/// durable before it returns.
#[derive(Debug)]
pub struct StateStore {
    path: PathBuf,
    dir: PathBuf,
    state: Mutex<PersistedState>,
    /// The last write's error, while writes fail.
    write_error: Mutex<Option<String>>,
}

fn new_daemon_id() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..40)
        .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
        .collect()
}

impl StateStore {
    /// Open (or create) the state in `dir`. `configured_id` is `daemon.id`
    /// from the config; without one a random 40-hex id is generated once.
    pub fn open(dir: &Path, configured_id: Option<&str>) -> Result<StateStore, StateError> {
        fs::create_dir_all(dir).map_err(|source| StateError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(STATE_FILE);
        let existing = match fs::read(&path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(StateError::Read { path, source }),
        };
        let store = match existing {
            Some(bytes) => {
                let state: PersistedState =
                    serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                if state.version != FORMAT_VERSION {
                    return Err(StateError::Corrupt {
                        path,
                        reason: format!("unsupported format version {}", state.version),
                    });
                }
                if state.daemon_id.is_empty() {
                    return Err(StateError::Corrupt {
                        path,
                        reason: "empty daemon_id".into(),
                    });
                }
                if let Some(id) = configured_id
                    && id != state.daemon_id
                {
                    return Err(StateError::IdMismatch {
                        configured: id.to_string(),
                        persisted: state.daemon_id,
                        path,
                    });
                }
                StateStore {
                    path,
                    dir: dir.to_path_buf(),
                    state: Mutex::new(state),
                    write_error: Mutex::new(None),
                }
            }
            None => {
                let state = PersistedState {
                    version: FORMAT_VERSION,
                    daemon_id: configured_id
                        .map(str::to_string)
                        .unwrap_or_else(new_daemon_id),
                    current_epoch: 0,
                    groups: BTreeMap::new(),
                };
                let store = StateStore {
                    path,
                    dir: dir.to_path_buf(),
                    state: Mutex::new(state.clone()),
                    write_error: Mutex::new(None),
                };
                store.write(&state)?;
                store
            }
        };
        // Leftovers of a write interrupted before its rename.
        let _ = fs::remove_file(store.tmp_path());
        metrics::gauge!(m::STATE_WRITABLE).set(1.0);
        Ok(store)
    }

    fn tmp_path(&self) -> PathBuf {
        self.dir.join(format!("{STATE_FILE}.tmp"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PersistedState> {
        // Updates are applied only after a successful write, so a panic
        // while holding the lock cannot leave a half-applied state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why the last write of the state failed, while writes keep failing
    /// (None once one succeeds).
    pub fn write_error(&self) -> Option<String> {
        self.write_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record the outcome of a write; log only the transitions, because
    /// every hello and vote request retries while the disk is full.
    fn note_write(&self, result: &Result<(), StateError>) {
        let mut last = self.write_error.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) => {
                if last.take().is_some() {
                    tracing::info!(path = %self.path.display(), "the state file is writable again; voting and elections resume");
                    metrics::gauge!(m::STATE_WRITABLE).set(1.0);
                }
            }
            Err(e) => {
                metrics::counter!(m::STATE_WRITE_ERRORS).increment(1);
                if last.is_none() {
                    tracing::error!(error = %e, "cannot write the state file; this daemon neither votes nor starts elections until it can");
                    metrics::gauge!(m::STATE_WRITABLE).set(0.0);
                }
                *last = Some(e.to_string());
            }
        }
    }

    /// A copy of the current state.
    pub fn snapshot(&self) -> PersistedState {
        self.lock().clone()
    }

    /// This daemon's id.
    pub fn daemon_id(&self) -> String {
        self.lock().daemon_id.clone()
    }

    /// The current epoch.
    pub fn current_epoch(&self) -> u64 {
        self.lock().current_epoch
    }

    /// The record of one group (default when never written).
    pub fn group(&self, name: &str) -> GroupRecord {
        self.lock().groups.get(name).cloned().unwrap_or_default()
    }

    /// Apply `f` to a copy, persist the copy, then make it current. When `f`
    /// reports no change (returns `(r, false)`) nothing is written.
    pub fn update<R>(
        &self,
        f: impl FnOnce(&mut PersistedState) -> (R, bool),
    ) -> Result<R, StateError> {
        let mut guard = self.lock();
        let mut next = guard.clone();
        let (r, changed) = f(&mut next);
        if changed && next != *guard {
            let written = self.write(&next);
            self.note_write(&written);
            written?;
            *guard = next;
        }
        Ok(r)
    }

    /// Raise the current epoch to at least `epoch`. Returns whether it rose.
    pub fn observe_epoch(&self, epoch: u64) -> Result<bool, StateError> {
        self.update(|s| {
            if epoch > s.current_epoch {
                s.current_epoch = epoch;
                (true, true)
            } else {
                (false, false)
            }
        })
    }

    /// Start an election: a new epoch, and this daemon's own vote in it.
    pub fn start_election(&self, group: &str) -> Result<u64, StateError> {
        self.update(|s| {
            let id = s.daemon_id.clone();
            let g = s.groups.entry(group.to_string()).or_default();
            let mut rec = g.vote_record();
            let epoch = new_epoch(&mut s.current_epoch, &mut rec, &id);
            g.set_vote_record(rec);
            (epoch, true)
        })
    }

    /// Sentinel's vote rule ([`cast_vote`]): one vote per (group, epoch),
    /// never for an epoch lower than the current one. The vote is durable
    /// before this returns; the result is the vote on record (possibly an
    /// earlier one).
    pub fn vote(&self, group: &str, epoch: u64, candidate: &str) -> Result<Vote, StateError> {
        self.update(|s| {
            let g = s.groups.entry(group.to_string()).or_default();
            let mut rec = g.vote_record();
            let (vote, changed) = cast_vote(&mut s.current_epoch, &mut rec, epoch, candidate);
            g.set_vote_record(rec);
            (vote, changed)
        })
    }

    /// Record a group's new config (master chosen in `config_epoch`) if it is
    /// newer than the recorded one. Returns whether it was adopted.
    pub fn set_config(
        &self,
        group: &str,
        config_epoch: u64,
        master: &Addr,
    ) -> Result<bool, StateError> {
        self.update(|s| {
            if config_epoch > s.current_epoch {
                s.current_epoch = config_epoch;
            }
            let g = s.groups.entry(group.to_string()).or_default();
            if config_epoch > g.config_epoch
                || (config_epoch == g.config_epoch && g.master.is_none())
            {
                g.config_epoch = config_epoch;
                g.master = Some(master.clone());
                (true, true)
            } else {
                (false, false)
            }
        })
    }

    /// Forget the config of a group that is no longer configured. Its vote
    /// is kept: were the group added back while that epoch is current, a
    /// forgotten vote could be cast a second time.
    pub fn remove_group(&self, group: &str) -> Result<(), StateError> {
        self.update(|s| match s.groups.get_mut(group) {
            Some(g) if g.master.is_some() || g.config_epoch != 0 => {
                g.master = None;
                g.config_epoch = 0;
                ((), true)
            }
            _ => ((), false),
        })
    }

    fn write(&self, state: &PersistedState) -> Result<(), StateError> {
        let written = self.write_via_tmp(state);
        if written.is_err() {
            // A partial temporary file would only hold on to the space that
            // the next attempt needs.
            let _ = fs::remove_file(self.tmp_path());
        }
        written
    }

    fn write_via_tmp(&self, state: &PersistedState) -> Result<(), StateError> {
        let err = |source| StateError::Write {
            path: self.path.clone(),
            source,
        };
        let bytes = serde_json::to_vec_pretty(state)
            .map_err(|e| err(std::io::Error::other(e.to_string())))?;
        let tmp = self.tmp_path();
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(err)?;
        f.write_all(&bytes).map_err(err)?;
        f.sync_all().map_err(err)?;
        drop(f);
        fs::rename(&tmp, &self.path).map_err(err)?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), None).unwrap();
        let id = s.daemon_id();
        assert_eq!(id.len(), 40);
        assert_eq!(s.start_election("g").unwrap(), 1);
        drop(s);
        let s = StateStore::open(dir.path(), None).unwrap();
        assert_eq!(s.daemon_id(), id);
        assert_eq!(s.current_epoch(), 1);
        assert_eq!(s.group("g").voted_for.as_deref(), Some(id.as_str()));
    }

    #[test]
    fn one_vote_per_epoch_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let v = s.vote("g", 5, "b").unwrap();
        assert_eq!(
            v,
            Vote {
                leader: Some("b".into()),
                epoch: 5
            }
        );
        // A second candidate in the same epoch gets the recorded vote back.
        let v = s.vote("g", 5, "c").unwrap();
        assert_eq!(v.leader.as_deref(), Some("b"));
        drop(s);
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let v = s.vote("g", 5, "c").unwrap();
        assert_eq!(
            v.leader.as_deref(),
            Some("b"),
            "vote must survive a restart"
        );
        // An older epoch never gets a vote.
        let v = s.vote("g", 4, "c").unwrap();
        assert_eq!(
            v,
            Vote {
                leader: Some("b".into()),
                epoch: 5
            }
        );
        // A newer epoch does.
        let v = s.vote("g", 6, "c").unwrap();
        assert_eq!(
            v,
            Vote {
                leader: Some("c".into()),
                epoch: 6
            }
        );
        // Votes are per group.
        let v = s.vote("h", 6, "d").unwrap();
        assert_eq!(v.leader.as_deref(), Some("d"));
    }

    #[test]
    fn no_vote_below_the_current_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        s.observe_epoch(10).unwrap();
        let v = s.vote("g", 9, "b").unwrap();
        assert_eq!(v.leader, None);
    }

    #[test]
    fn corrupt_file_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(STATE_FILE), b"{not json").unwrap();
        let err = StateStore::open(dir.path(), None).unwrap_err();
        assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("refusing to start"));
        // The file is left as it was.
        assert_eq!(fs::read(dir.path().join(STATE_FILE)).unwrap(), b"{not json");
    }

    #[test]
    fn id_mismatch_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        StateStore::open(dir.path(), Some("a")).unwrap();
        let err = StateStore::open(dir.path(), Some("b")).unwrap_err();
        assert!(matches!(err, StateError::IdMismatch { .. }));
    }

    #[test]
    fn config_only_moves_forward() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let m1 = Addr::new("127.0.0.2", 1);
        let m2 = Addr::new("127.0.0.3", 1);
        assert!(s.set_config("g", 3, &m1).unwrap());
        assert!(!s.set_config("g", 2, &m2).unwrap());
        assert!(!s.set_config("g", 3, &m2).unwrap());
        assert_eq!(s.group("g").master, Some(m1));
        assert_eq!(s.current_epoch(), 3);
    }

    #[test]
    fn removing_a_group_keeps_its_vote() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        s.set_config("g", 2, &Addr::new("127.0.0.2", 1)).unwrap();
        s.vote("g", 3, "b").unwrap();
        s.remove_group("g").unwrap();
        assert_eq!(s.group("g").master, None);
        assert_eq!(s.group("g").config_epoch, 0);
        let v = s.vote("g", 3, "c").unwrap();
        assert_eq!(v.leader.as_deref(), Some("b"), "no second vote in epoch 3");
    }

    #[test]
    fn failed_write_leaves_memory_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        // Make the directory unwritable by replacing the temp path with a
        // directory: the create fails.
        fs::create_dir(dir.path().join(format!("{STATE_FILE}.tmp"))).unwrap();
        let err = s.vote("g", 1, "b");
        assert!(err.is_err());
        assert_eq!(s.group("g").voted_for, None);
        assert_eq!(s.current_epoch(), 0);
    }
}
