//! The state a daemon must never forget: its id, the current epoch, its
//! vote per group and the config (master and config epoch) of each group.
//!
//! Every change is written to `data_dir/state.json` with write, fsync,
//! rename and fsync of the directory *before* the change becomes visible
//! in memory, so nothing that depends on it (a vote reply, a hello) can
//! go out before it is durable (invariant 1). A file that cannot be read
//! or parsed stops the daemon: resetting it could mean voting twice.
//!
//! The writes happen on a thread of their own, never on the async
//! runtime's workers: a change is a job sent to that thread, and its
//! result comes back once the file is durable. Jobs that arrive while a
//! write is under way are applied together and written once (group
//! commit), so that a hundred groups voting at once cost one fsync, not a
//! hundred in a row. Readers see the last durable state without waiting
//! for a write.
//!
//! A write that fails later (a full disk, a read-only remount) is not fatal:
//! the change is refused, so the daemon neither votes nor starts elections
//! until a write succeeds again, and the failure is reported
//! ([`StateStore::write_error`], `picket_state_writable`, `/readyz`).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, mpsc};

use tokio::sync::oneshot;

use serde::{Deserialize, Serialize};

use crate::addr::Addr;
use crate::metrics as m;
pub use crate::quorum::vote::Vote;
use crate::quorum::vote::{VoteRecord, cast_vote, new_epoch};

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
    /// The writer thread is gone (the daemon is shutting down).
    #[error("the state writer has stopped")]
    Stopped,
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
    /// The replica that leader said it would promote (its vote request's
    /// `promote`). Kept with the vote so that a daemon restarted just after
    /// voting still knows it, and neither demotes nor re-points the
    /// replica being promoted as an out-of-place master.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vote_promote: Option<Addr>,
    /// Servers to probe from the start besides the master, before it lists
    /// them: those a Sentinel knew (written by `picket import`), then those
    /// this daemon knew when it last adopted a config, the old master among
    /// them (Sentinel's `known-replica` lines). With the master down at
    /// start-up they are what a failover can promote, and an old master
    /// that was down while every daemon restarted is still demoted when it
    /// comes back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub known_replicas: Vec<Addr>,
    /// The last epoch in which this daemon, as the elected leader, fenced
    /// the old master (written before the fence). Above `config_epoch`
    /// after a restart, that failover never published: its fence may hold
    /// the backends, and only this daemon knows it (0: none; absent from
    /// older files).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub led_epoch: u64,
    /// A switchover's `FAILOVER` sent in `led_epoch` may hand over on the
    /// server until then (Unix seconds; 0: none; absent from older
    /// files): restarted before its publication, the leader does not
    /// route its kept master again before it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub led_switchover_until: u64,
    /// The master's process as this daemon last read it: a daemon
    /// restarted while the master restarted too still sees a new process
    /// (`+reboot`) and judges what it holds, which it could not from its
    /// first INFO alone (absent from older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_identity: Option<MasterIdentity>,
}

/// What shows a server's process (`probe::reboot::restarted`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterIdentity {
    /// The server.
    pub addr: Addr,
    /// Redis and Valkey: `run_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Its replication id as a master (Dragonfly draws it anew at every
    /// start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replid: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
    /// Its 40-hex run id, what Sentinel clients know a Sentinel by
    /// (`SENTINEL MYID`, the `runid` of `SENTINEL SENTINELS`): generated
    /// once; a file written before it existed gets one at the next start.
    #[serde(default)]
    pub run_id: String,
    /// The highest epoch seen or started.
    pub current_epoch: u64,
    /// Per group.
    pub groups: BTreeMap<String, GroupRecord>,
}

/// A change to apply on the writer thread; it returns what to do once the
/// batch it is part of is durable (or failed).
type Job = Box<dyn FnOnce(&mut PersistedState) -> Done + Send>;
type Done = Box<dyn FnOnce(Result<(), &StateError>) + Send>;

/// At most this many jobs are written together.
const MAX_BATCH: usize = 512;

/// What the writer thread and the readers share.
#[derive(Debug)]
struct Shared {
    path: PathBuf,
    dir: PathBuf,
    /// The last durable state. Replaced (never changed in place) after a
    /// successful write; the lock is held only to swap or clone the `Arc`.
    durable: RwLock<Arc<PersistedState>>,
    /// The last write's error, while writes fail.
    write_error: Mutex<Option<String>>,
}

/// Owner of the state file. Shared by all group tasks; every update is
/// durable before its future resolves.
#[derive(Debug)]
pub struct StateStore {
    shared: Arc<Shared>,
    jobs: Mutex<mpsc::Sender<Job>>,
}

/// A Sentinel-style run id: 40 hex digits.
fn is_run_id(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn new_run_id() -> String {
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
        let shared = match existing {
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
                let mut state = state;
                if crate::mutation::planted(crate::mutation::Mutation::ForgetVote) {
                    for g in state.groups.values_mut() {
                        g.vote_epoch = 0;
                        g.voted_for = None;
                    }
                }
                let needs_run_id = !is_run_id(&state.run_id);
                if needs_run_id {
                    state.run_id = new_run_id();
                }
                let shared = Shared {
                    path,
                    dir: dir.to_path_buf(),
                    durable: RwLock::new(Arc::new(state.clone())),
                    write_error: Mutex::new(None),
                };
                if needs_run_id {
                    shared.write(&state)?;
                }
                shared
            }
            None => {
                let state = PersistedState {
                    version: FORMAT_VERSION,
                    daemon_id: configured_id.map(str::to_string).unwrap_or_else(new_run_id),
                    run_id: new_run_id(),
                    current_epoch: 0,
                    groups: BTreeMap::new(),
                };
                let shared = Shared {
                    path,
                    dir: dir.to_path_buf(),
                    durable: RwLock::new(Arc::new(state.clone())),
                    write_error: Mutex::new(None),
                };
                shared.write(&state)?;
                shared
            }
        };
        // Leftovers of a write interrupted before its rename.
        let _ = fs::remove_file(shared.tmp_path());
        metrics::gauge!(m::STATE_WRITABLE).set(1.0);
        let shared = Arc::new(shared);
        let (tx, rx) = mpsc::channel::<Job>();
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("picket-state".into())
            .spawn(move || writer.run(rx))
            .map_err(|source| StateError::Dir {
                path: dir.to_path_buf(),
                source,
            })?;
        Ok(StateStore {
            shared,
            jobs: Mutex::new(tx),
        })
    }

    /// Why the last write of the state failed, while writes keep failing
    /// (None once one succeeds).
    pub fn write_error(&self) -> Option<String> {
        self.shared
            .write_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn durable(&self) -> Arc<PersistedState> {
        self.shared.current()
    }

    /// A copy of the current (durable) state.
    pub fn snapshot(&self) -> PersistedState {
        (*self.durable()).clone()
    }

    /// This daemon's run id (40 hex digits).
    pub fn run_id(&self) -> String {
        self.durable().run_id.clone()
    }

    /// This daemon's id.
    pub fn daemon_id(&self) -> String {
        self.durable().daemon_id.clone()
    }

    /// The current epoch.
    pub fn current_epoch(&self) -> u64 {
        self.durable().current_epoch
    }

    /// The record of one group (default when never written).
    pub fn group(&self, name: &str) -> GroupRecord {
        self.durable().groups.get(name).cloned().unwrap_or_default()
    }

    /// Apply `f` to the state on the writer thread and persist the result;
    /// resolves with `f`'s value once it is durable. A change that cannot
    /// be written is not applied (nor is any change written with it).
    pub async fn update<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut PersistedState) -> R + Send + 'static,
    ) -> Result<R, StateError> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |s| {
            let r = f(s);
            Box::new(move |written: Result<(), &StateError>| {
                let _ = tx.send(written.map(|()| r).map_err(StateError::copy));
            })
        });
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .map_err(|_| StateError::Stopped)?;
        rx.await.map_err(|_| StateError::Stopped)?
    }

    /// Raise the current epoch to at least `epoch`. Returns whether it rose.
    pub async fn observe_epoch(&self, epoch: u64) -> Result<bool, StateError> {
        if epoch <= self.current_epoch() {
            return Ok(false);
        }
        self.update(move |s| {
            let rose = epoch > s.current_epoch;
            s.current_epoch = s.current_epoch.max(epoch);
            rose
        })
        .await
    }

    /// Start an election: a new epoch, and this daemon's own vote in it.
    /// `seen_vote_epoch` is the group's vote epoch when the daemon decided
    /// to start: if it has voted since (for another daemon, whose failover
    /// it must not compete with), nothing changes and the result is None.
    pub async fn start_election(
        &self,
        group: &str,
        seen_vote_epoch: u64,
    ) -> Result<Option<u64>, StateError> {
        let group = group.to_string();
        self.update(move |s| {
            let id = s.daemon_id.clone();
            let g = s.groups.entry(group).or_default();
            if g.vote_epoch > seen_vote_epoch {
                return None;
            }
            let mut rec = g.vote_record();
            let epoch = new_epoch(&mut s.current_epoch, &mut rec, &id);
            g.set_vote_record(rec);
            g.vote_promote = None;
            Some(epoch)
        })
        .await
    }

    /// Sentinel's vote rule ([`cast_vote`]): one vote per (group, epoch),
    /// never for an epoch lower than the current one. The vote is durable
    /// before this returns, with the replica the candidate will promote
    /// (`promote`, [`GroupRecord::vote_promote`]); the result is the vote on
    /// record (possibly an earlier one).
    pub async fn vote(
        &self,
        group: &str,
        epoch: u64,
        candidate: &str,
        promote: Option<&Addr>,
    ) -> Result<Vote, StateError> {
        let (group, candidate) = (group.to_string(), candidate.to_string());
        let promote = promote.cloned();
        self.update(move |s| {
            let g = s.groups.entry(group).or_default();
            let mut rec = g.vote_record();
            let (vote, changed) = cast_vote(&mut s.current_epoch, &mut rec, epoch, &candidate);
            let granted = vote.epoch == epoch && vote.leader.as_deref() == Some(candidate.as_str());
            if changed && rec.vote_epoch != g.vote_epoch {
                g.vote_promote = None;
            }
            g.set_vote_record(rec);
            if granted && g.vote_promote.is_none() {
                g.vote_promote = promote;
            }
            vote
        })
        .await
    }

    /// Record a group's new config (master chosen in `config_epoch`) if it is
    /// newer than the recorded one, with the other servers the group knows
    /// (`known`: kept as [`GroupRecord::known_replicas`]). Returns whether
    /// it was adopted; the recorded config itself again only updates the
    /// servers known.
    pub async fn set_config(
        &self,
        group: &str,
        config_epoch: u64,
        master: &Addr,
        known: Vec<Addr>,
    ) -> Result<bool, StateError> {
        let (group, master) = (group.to_string(), master.clone());
        self.update(move |s| {
            if config_epoch > s.current_epoch {
                s.current_epoch = config_epoch;
            }
            let g = s.groups.entry(group).or_default();
            if config_epoch > g.config_epoch
                || (config_epoch == g.config_epoch && g.master.is_none())
            {
                g.config_epoch = config_epoch;
                g.known_replicas = known.into_iter().filter(|a| *a != master).collect();
                g.master = Some(master);
                true
            } else {
                // The same config with the servers known since.
                if config_epoch == g.config_epoch && g.master.as_ref() == Some(&master) {
                    g.known_replicas = known.into_iter().filter(|a| *a != master).collect();
                }
                false
            }
        })
        .await
    }

    /// Record the master's process as last read
    /// ([`GroupRecord::master_identity`]).
    pub async fn set_master_identity(
        &self,
        group: &str,
        identity: MasterIdentity,
    ) -> Result<(), StateError> {
        let group = group.to_string();
        self.update(move |s| {
            s.groups.entry(group).or_default().master_identity = Some(identity);
        })
        .await
    }

    /// Record that this daemon, elected leader in `epoch`, fences the old
    /// master now ([`GroupRecord::led_epoch`]); durable before it returns.
    pub async fn lead(&self, group: &str, epoch: u64) -> Result<(), StateError> {
        let group = group.to_string();
        self.update(move |s| {
            let g = s.groups.entry(group).or_default();
            if epoch > g.led_epoch {
                g.led_switchover_until = 0;
            }
            g.led_epoch = g.led_epoch.max(epoch);
        })
        .await
    }

    /// This daemon, the leader of `epoch`, sends a switchover's
    /// `FAILOVER`, which the server may complete until `until` (Unix
    /// seconds) ([`GroupRecord::led_switchover_until`]); durable before it
    /// returns.
    pub async fn switchover_sent(
        &self,
        group: &str,
        epoch: u64,
        until: u64,
    ) -> Result<(), StateError> {
        let group = group.to_string();
        self.update(move |s| {
            let g = s.groups.entry(group).or_default();
            if epoch > g.led_epoch {
                g.led_epoch = epoch;
                g.led_switchover_until = 0;
            }
            if epoch == g.led_epoch {
                g.led_switchover_until = g.led_switchover_until.max(until);
            }
        })
        .await
    }

    /// Forget the config of a group that is no longer configured. Its vote
    /// is kept: were the group added back while that epoch is current, a
    /// forgotten vote could be cast a second time.
    pub async fn remove_group(&self, group: &str) -> Result<(), StateError> {
        let group = group.to_string();
        self.update(move |s| {
            if let Some(g) = s.groups.get_mut(&group) {
                g.master = None;
                g.config_epoch = 0;
            }
        })
        .await
    }
}

impl StateError {
    /// The same error for another waiter of a failed batch (io::Error is
    /// not `Clone`: its kind and text are kept).
    fn copy(e: &StateError) -> StateError {
        let io = |s: &std::io::Error| std::io::Error::new(s.kind(), s.to_string());
        match e {
            StateError::Dir { path, source } => StateError::Dir {
                path: path.clone(),
                source: io(source),
            },
            StateError::Read { path, source } => StateError::Read {
                path: path.clone(),
                source: io(source),
            },
            StateError::Corrupt { path, reason } => StateError::Corrupt {
                path: path.clone(),
                reason: reason.clone(),
            },
            StateError::Write { path, source } => StateError::Write {
                path: path.clone(),
                source: io(source),
            },
            StateError::Stopped => StateError::Stopped,
            StateError::IdMismatch {
                configured,
                persisted,
                path,
            } => StateError::IdMismatch {
                configured: configured.clone(),
                persisted: persisted.clone(),
                path: path.clone(),
            },
        }
    }
}

impl Shared {
    fn current(&self) -> Arc<PersistedState> {
        self.durable
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn tmp_path(&self) -> PathBuf {
        self.dir.join(format!("{STATE_FILE}.tmp"))
    }

    /// The writer thread: take every job that is waiting, apply them in
    /// order to a copy of the durable state, write the copy once, then
    /// answer them all. Ends when the store is dropped.
    fn run(&self, jobs: mpsc::Receiver<Job>) {
        while let Ok(first) = jobs.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(j) => batch.push(j),
                    Err(_) => break,
                }
            }
            let durable = self.current();
            let mut next = (*durable).clone();
            let done: Vec<Done> = batch.into_iter().map(|job| job(&mut next)).collect();
            let written = if next != *durable {
                let w = self.write(&next);
                self.note_write(&w);
                if w.is_ok() {
                    *self.durable.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
                }
                w
            } else {
                Ok(())
            };
            for d in done {
                d(written.as_ref().map(|_| ()));
            }
        }
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

    #[tokio::test]
    async fn creates_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), None).unwrap();
        let id = s.daemon_id();
        assert_eq!(id.len(), 40);
        assert_eq!(s.start_election("g", 0).await.unwrap(), Some(1));
        drop(s);
        let s = StateStore::open(dir.path(), None).unwrap();
        assert_eq!(s.daemon_id(), id);
        assert_eq!(s.current_epoch(), 1);
        assert_eq!(s.group("g").voted_for.as_deref(), Some(id.as_str()));
        // The run id too, generated once.
        let run_id = s.run_id();
        assert!(is_run_id(&run_id));
        drop(s);
        assert_eq!(StateStore::open(dir.path(), None).unwrap().run_id(), run_id);
    }

    #[tokio::test]
    async fn a_switchover_sent_is_kept_for_its_epoch_only() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        s.lead("g", 3).await.unwrap();
        s.switchover_sent("g", 3, 1_000).await.unwrap();
        // An older epoch's late record changes nothing.
        s.switchover_sent("g", 2, 5_000).await.unwrap();
        drop(s);
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let g = s.group("g");
        assert_eq!((g.led_epoch, g.led_switchover_until), (3, 1_000));
        // A newer epoch led starts without one.
        s.lead("g", 4).await.unwrap();
        let g = s.group("g");
        assert_eq!((g.led_epoch, g.led_switchover_until), (4, 0));
    }

    #[tokio::test]
    async fn one_vote_per_epoch_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let v = s.vote("g", 5, "b", None).await.unwrap();
        assert_eq!(
            v,
            Vote {
                leader: Some("b".into()),
                epoch: 5
            }
        );
        // A second candidate in the same epoch gets the recorded vote back.
        let v = s.vote("g", 5, "c", None).await.unwrap();
        assert_eq!(v.leader.as_deref(), Some("b"));
        drop(s);
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let v = s.vote("g", 5, "c", None).await.unwrap();
        assert_eq!(
            v.leader.as_deref(),
            Some("b"),
            "vote must survive a restart"
        );
        // An older epoch never gets a vote.
        let v = s.vote("g", 4, "c", None).await.unwrap();
        assert_eq!(
            v,
            Vote {
                leader: Some("b".into()),
                epoch: 5
            }
        );
        // A newer epoch does.
        let v = s.vote("g", 6, "c", None).await.unwrap();
        assert_eq!(
            v,
            Vote {
                leader: Some("c".into()),
                epoch: 6
            }
        );
        // Votes are per group.
        let v = s.vote("h", 6, "d", None).await.unwrap();
        assert_eq!(v.leader.as_deref(), Some("d"));
    }

    #[tokio::test]
    async fn the_replica_a_leader_will_promote_is_kept_with_the_vote() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let r1 = Addr::new("10.0.0.1", 6379);
        let r2 = Addr::new("10.0.0.2", 6379);
        s.vote("g", 5, "b", Some(&r1)).await.unwrap();
        // Another candidate of the same epoch gets no vote, and does not
        // change the replica of the vote on record.
        s.vote("g", 5, "c", Some(&r2)).await.unwrap();
        drop(s);
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        assert_eq!(s.group("g").vote_promote, Some(r1.clone()));
        // A vote in a newer epoch replaces it, also with none named.
        s.vote("g", 6, "c", None).await.unwrap();
        assert_eq!(s.group("g").vote_promote, None);
        s.vote("g", 7, "c", Some(&r2)).await.unwrap();
        assert_eq!(s.group("g").vote_promote, Some(r2));
        // This daemon's own election: no other leader's replica.
        s.start_election("g", 7).await.unwrap();
        assert_eq!(s.group("g").vote_promote, None);
    }

    #[tokio::test]
    async fn no_vote_below_the_current_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        s.observe_epoch(10).await.unwrap();
        let v = s.vote("g", 9, "b", None).await.unwrap();
        assert_eq!(v.leader, None);
    }

    #[tokio::test]
    async fn corrupt_file_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(STATE_FILE), b"{not json").unwrap();
        let err = StateStore::open(dir.path(), None).unwrap_err();
        assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("refusing to start"));
        // The file is left as it was.
        assert_eq!(fs::read(dir.path().join(STATE_FILE)).unwrap(), b"{not json");
    }

    #[tokio::test]
    async fn id_mismatch_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        StateStore::open(dir.path(), Some("a")).unwrap();
        let err = StateStore::open(dir.path(), Some("b")).unwrap_err();
        assert!(matches!(err, StateError::IdMismatch { .. }));
    }

    #[tokio::test]
    async fn config_only_moves_forward() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let m1 = Addr::new("127.0.0.2", 1);
        let m2 = Addr::new("127.0.0.3", 1);
        assert!(s.set_config("g", 3, &m1, vec![]).await.unwrap());
        assert!(!s.set_config("g", 2, &m2, vec![]).await.unwrap());
        assert!(!s.set_config("g", 3, &m2, vec![]).await.unwrap());
        assert_eq!(s.group("g").master, Some(m1));
        assert_eq!(s.current_epoch(), 3);
    }

    #[tokio::test]
    async fn a_config_keeps_the_other_known_servers_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new, replica) = (
            Addr::new("127.0.0.2", 1),
            Addr::new("127.0.0.3", 1),
            Addr::new("127.0.0.4", 1),
        );
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let known = vec![old.clone(), new.clone(), replica.clone()];
        assert!(s.set_config("g", 1, &new, known).await.unwrap());
        // An older config changes nothing, its servers neither.
        assert!(!s.set_config("g", 1, &old, vec![]).await.unwrap());
        drop(s);
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        assert_eq!(s.group("g").known_replicas, vec![old, replica]);
    }

    #[tokio::test]
    async fn removing_a_group_keeps_its_vote() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        s.set_config("g", 2, &Addr::new("127.0.0.2", 1), vec![])
            .await
            .unwrap();
        s.vote("g", 3, "b", None).await.unwrap();
        s.remove_group("g").await.unwrap();
        assert_eq!(s.group("g").master, None);
        assert_eq!(s.group("g").config_epoch, 0);
        let v = s.vote("g", 3, "c", None).await.unwrap();
        assert_eq!(v.leader.as_deref(), Some("b"), "no second vote in epoch 3");
    }

    #[tokio::test]
    async fn failed_write_leaves_memory_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        // Make the directory unwritable by replacing the temp path with a
        // directory: the create fails.
        fs::create_dir(dir.path().join(format!("{STATE_FILE}.tmp"))).unwrap();
        let err = s.vote("g", 1, "b", None).await;
        assert!(err.is_err());
        assert_eq!(s.group("g").voted_for, None);
        assert_eq!(s.current_epoch(), 0);
    }

    #[tokio::test]
    async fn a_file_without_a_run_id_gets_one_once() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(STATE_FILE),
            br#"{"version":1,"daemon_id":"picket-a","current_epoch":4,"groups":{}}"#,
        )
        .unwrap();
        let s = StateStore::open(dir.path(), Some("picket-a")).unwrap();
        let run_id = s.run_id();
        assert!(is_run_id(&run_id), "{run_id}");
        assert_eq!(s.current_epoch(), 4);
        drop(s);
        let s = StateStore::open(dir.path(), Some("picket-a")).unwrap();
        assert_eq!(s.run_id(), run_id);
    }

    #[tokio::test]
    async fn no_election_after_a_vote_cast_since_the_decision() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let seen = s.group("g").vote_epoch;
        s.vote("g", 1, "b", None).await.unwrap();
        assert_eq!(s.start_election("g", seen).await.unwrap(), None);
        assert_eq!(s.group("g").voted_for.as_deref(), Some("b"));
        assert_eq!(s.current_epoch(), 1);
        assert_eq!(s.start_election("g", 1).await.unwrap(), Some(2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_updates_are_all_durable() {
        let dir = tempfile::tempdir().unwrap();
        let s = std::sync::Arc::new(StateStore::open(dir.path(), Some("a")).unwrap());
        let mut joins = Vec::new();
        for i in 0..200 {
            let s = s.clone();
            joins.push(tokio::spawn(async move {
                s.vote(&format!("g{i}"), 2, "b", None).await
            }));
        }
        for j in joins {
            assert_eq!(j.await.unwrap().unwrap().leader.as_deref(), Some("b"));
        }
        drop(s);
        let s = StateStore::open(dir.path(), Some("a")).unwrap();
        let state = s.snapshot();
        assert_eq!(state.groups.len(), 200);
        assert!(
            state
                .groups
                .values()
                .all(|g| g.voted_for.as_deref() == Some("b"))
        );
        assert_eq!(state.current_epoch, 2);
    }
}
