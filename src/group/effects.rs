//! The work a group's decisions ask for, as data ([`Work`]), and the part
//! of the driver that carries it out ([`Effects`]).
//!
//! The decisions (every other file of `src/group/`) never start a task or
//! touch a server, a peer, the state file or a backend: they hand a
//! [`Work`] to [`Effects::run`], which executes it on the group's own
//! [`TaskTracker`] and reports its result back as an [`Internal`] message,
//! fed to the decision that asked. The clock the results carry (`at`) is
//! read here, when the I/O ended. Nothing started here outlives the group.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::addr::Addr;
use crate::context::DaemonCtx;
use crate::discovery::runner::{DiscoveryRunner, RunnerError};
use crate::discovery::{Fence, Topology};
use crate::failover::machine::{Input, PromoteError};
use crate::failover::ops::{InstanceOps, ScriptKill};
use crate::probe::reboot::Identity;
use crate::probe::{Flavour, ProbeEvent, ProbeHandle, ProbeSettings, Role};
use crate::quorum::peers::{HelloGroup, IsDownQuery, IsDownReply};
use crate::quorum::state::{MasterIdentity, StateError, Vote};
use crate::resp::RespError;

/// How long a stopping group waits for its effects to see the cancellation.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// A reply channel to whoever asked the group a question.
pub(super) type IsDownReplyTx = oneshot::Sender<Result<IsDownReply, StateError>>;

/// What the decisions ask to be done.
#[derive(Debug)]
pub(super) enum Work {
    /// `PICKET IS-DOWN` to peer `peer` (an index into the daemon's links).
    AskPeer { peer: usize, query: IsDownQuery },
    /// Persist a new election epoch above `seen` (the vote epoch on record).
    StartElection { seen: u64 },
    /// Persist the vote `query` asks for; the answer goes out only once it
    /// is durable (invariant 1).
    Vote {
        query: IsDownQuery,
        down: bool,
        reply: IsDownReplyTx,
    },
    /// Answer `query` without a vote: the vote on record, after the asker's
    /// epoch is durable here.
    AnswerWithoutVote {
        query: IsDownQuery,
        down: bool,
        reply: IsDownReplyTx,
    },
    /// Failover step 5: take the old master out of every backend.
    Fence {
        epoch: u64,
        fence: Fence,
        deadline: Duration,
    },
    /// Failover step 6, unplanned.
    Promote {
        epoch: u64,
        candidate: Addr,
        flavour: Flavour,
        flush: bool,
        /// The candidate's identity when it was chosen: another process
        /// is not promoted (`PromoteError::CandidateRestarted`).
        chosen: Option<Identity>,
    },
    /// Failover step 6, planned.
    Switchover {
        epoch: u64,
        old_master: Addr,
        flavour: Flavour,
        candidate: Addr,
        listed_as: Addr,
        timeout: Duration,
        /// When the server can no longer hand over (Unix seconds: the
        /// command's timeout and some slack), recorded in the state file
        /// before the command goes out.
        ends_by_unix: u64,
        /// The old master's `master_replid` when the failover began: a
        /// server in another history since (handed over and promoted
        /// back, or restarted) is not asked to hand over
        /// ([`crate::failover::ops::check_switchover_source`]).
        history: Option<String>,
    },
    /// `REPLICAOF master` on `replica`: failover step 8 (`epoch`: its
    /// result goes to that failover), or a topology repair (`None`: a
    /// failure is only logged, the repair retries).
    Repoint {
        epoch: Option<u64>,
        replica: Addr,
        flavour: Flavour,
        master: Addr,
        /// How long a refusal is retried (a re-point sent beside a
        /// Dragonfly promotion may reach the candidate before it is one).
        retry_for: Duration,
        /// Beside a promotion: the new master's identity when it was
        /// chosen, checked first (a restarted one is not copied).
        master_chosen: Option<Identity>,
    },
    /// A returning old master (or a stray one) becomes a replica of
    /// `master`, its clients disconnected.
    Demote {
        addr: Addr,
        flavour: Flavour,
        master: Addr,
    },
    /// Persist the adopted config, then publish `topology` (a daemon that
    /// learnt it from a peer persists it with [`Work::PersistConfig`] and
    /// publishes it when its turn comes, with [`Work::Republish`]).
    /// `machine`: the failover machine waits for the result.
    PersistAndPublish {
        topology: Topology,
        /// The other servers the group knows, persisted with the config.
        known: Vec<Addr>,
        deadline: Duration,
        machine: bool,
    },
    /// Publish `topology` again (nothing waits for it; a failure is logged).
    Republish {
        topology: Topology,
        deadline: Duration,
    },
    /// Retry the write of a config served from memory only.
    PersistConfig {
        epoch: u64,
        master: Addr,
        known: Vec<Addr>,
    },
    /// Persist the master's process as last read (nothing waits for it;
    /// a failure is logged).
    PersistIdentity(MasterIdentity),
    /// Read the role of the master a peer announces.
    CheckPeerConfig { from: String, group: HelloGroup },
    /// `SCRIPT KILL` on a busy instance.
    ScriptKill(Addr),
    /// `CLIENT PAUSE pause ALL` on a master that restarted with less than
    /// its replicas, `after` from now (the other daemons read it first).
    Pause {
        target: Addr,
        pause: Duration,
        after: Duration,
    },
    /// Set back the replication settings a sync hold changed.
    ReleaseSyncHold {
        target: Addr,
        restore: Vec<(String, String)>,
        /// Earlier refusals of the same release.
        refused: u32,
    },
    /// Keep the isolation fence on the master: `target`, unless it holds
    /// more, up to `keep` (what the replicas seen up justify), which
    /// stays.
    SetFence {
        master: Addr,
        target: u32,
        lag: u64,
        keep: u32,
    },
    /// `min-replicas-to-write 0` on a replica (`run_id`: the replica's, so
    /// that a restart is cleared again).
    ClearFence { addr: Addr, run_id: Option<String> },
}

/// Results of the group's effects, fed back to the decision that asked.
#[derive(Debug)]
pub(super) enum Internal {
    /// A peer answered `IS-DOWN` (asked in `epoch`).
    Answer {
        peer: usize,
        epoch: u64,
        at: Instant,
        result: Result<IsDownReply, RespError>,
    },
    /// The new epoch of this daemon's election was persisted (or not).
    EpochPersisted(Result<Option<u64>, StateError>),
    /// This daemon's vote for a peer's request was persisted (or not); the
    /// reply goes out only now (invariant 1).
    Voted {
        query: IsDownQuery,
        down: bool,
        result: Result<Vote, StateError>,
        reply: IsDownReplyTx,
    },
    /// A failover step ended; `u64` is the failover's epoch.
    Failover(u64, Input),
    /// A switchover's command (`FAILOVER TO`, `REPLTAKEOVER`) ended, in
    /// the failover of that epoch: on the server it may outlive the
    /// failover that sent it, which waits for this before routing its
    /// kept master again (`failover.rs` `route_kept_master`).
    SwitchedOver(u64, Result<(), PromoteError>),
    /// The config of `epoch` was persisted and published.
    Published {
        epoch: u64,
        persisted: Result<bool, StateError>,
        /// The failover machine waits for this publication.
        machine: bool,
        result: Result<(), RunnerError>,
    },
    /// A retried write of the current config ended.
    ConfigPersisted {
        epoch: u64,
        result: Result<bool, StateError>,
    },
    /// A `SCRIPT KILL` to a busy instance ended.
    ScriptKilled(Addr, Result<ScriptKill, RespError>),
    /// `CLIENT PAUSE … ALL` on this server was refused or did not reach
    /// it (`-BUSY` while a script runs, a lost connection).
    PauseRefused(Addr),
    /// A stray master was demoted (or not).
    Demoted(Addr, Result<(), RespError>),
    /// Setting a sync hold's settings back was refused (the `n`th time).
    SyncHoldRefused {
        target: Addr,
        restore: Vec<(String, String)>,
        refused: u32,
    },
    /// The master a peer announces reported this role.
    PeerConfigChecked {
        from: String,
        group: HelloGroup,
        role: Result<Role, RespError>,
    },
    /// The isolation fence was read and set on the master (`Ok`: the
    /// values found before).
    FenceSet {
        master: Addr,
        target: u32,
        keep: u32,
        lag: u64,
        at: Instant,
        result: Result<(u32, u64), RespError>,
    },
    /// A replica's isolation fence was cleared (`Ok`: the value before).
    FenceCleared {
        addr: Addr,
        run_id: Option<String>,
        at: Instant,
        result: Result<u32, RespError>,
    },
}

/// What the executor needs to reach the world: the group's servers, its
/// backends, the state file and the peers.
#[derive(Debug)]
struct Io {
    group: String,
    ops: InstanceOps,
    discovery: Arc<DiscoveryRunner>,
    ctx: Arc<DaemonCtx>,
}

/// The group's executor.
#[derive(Debug)]
pub(super) struct Effects {
    mode: Mode,
    cancel: CancellationToken,
}

#[derive(Debug)]
enum Mode {
    /// The daemon: every work is a task of the group's tracker.
    Live {
        io: Arc<Io>,
        tracker: TaskTracker,
        /// Boxed: a mailbox slot is as large as its largest message, and
        /// the failover's results are large.
        tx: mpsc::Sender<Box<Internal>>,
        /// Where the group's probes report.
        probe_tx: mpsc::Sender<Box<ProbeEvent>>,
    },
    /// The simulation (`scenario.rs`, also built for `picket-sim`): the
    /// work is kept for it to carry out (simulated servers, virtual time)
    /// and no probe runs.
    Recorded(Vec<Work>),
}

impl Effects {
    pub(super) fn new(
        group: String,
        ops: InstanceOps,
        discovery: Arc<DiscoveryRunner>,
        ctx: Arc<DaemonCtx>,
        tx: mpsc::Sender<Box<Internal>>,
        probe_tx: mpsc::Sender<Box<ProbeEvent>>,
        cancel: CancellationToken,
    ) -> Effects {
        Effects {
            mode: Mode::Live {
                io: Arc::new(Io {
                    group,
                    ops,
                    discovery,
                    ctx,
                }),
                tracker: TaskTracker::new(),
                tx,
                probe_tx,
            },
            cancel,
        }
    }

    /// An executor that only records the work asked for.
    pub(super) fn recording() -> Effects {
        Effects {
            mode: Mode::Recorded(Vec::new()),
            cancel: CancellationToken::new(),
        }
    }

    /// The work recorded since the last call (empty when live).
    pub(super) fn take(&mut self) -> Vec<Work> {
        match &mut self.mode {
            Mode::Recorded(w) => std::mem::take(w),
            Mode::Live { .. } => Vec::new(),
        }
    }

    /// The group's cancellation.
    pub(super) fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Start probing an instance; the probe reports to the group until its
    /// handle is stopped or dropped (None: no probe runs, in tests).
    pub(super) fn start_probe(&self, settings: ProbeSettings) -> Option<ProbeHandle> {
        match &self.mode {
            Mode::Live { probe_tx, .. } => Some(crate::probe::spawn(settings, probe_tx.clone())),
            Mode::Recorded(_) => None,
        }
    }

    /// Carry out `work`; its result (if any) comes back to the group.
    pub(super) fn run(&mut self, work: Work) {
        let (io, tracker, tx) = match &mut self.mode {
            Mode::Live {
                io, tracker, tx, ..
            } => (io.clone(), tracker, tx.clone()),
            Mode::Recorded(w) => {
                w.push(work);
                return;
            }
        };
        let cancel = self.cancel.clone();
        tracker.spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                r = io.execute(work) => if let Some(msg) = r {
                    let _ = tx.send(Box::new(msg)).await;
                }
            }
        });
    }

    /// Stop the background retries of the group's backends, then wait
    /// (bounded) for every effect to end after the cancellation.
    pub(super) async fn stop(&self) {
        self.cancel.cancel();
        let (io, tracker) = match &self.mode {
            Mode::Live { io, tracker, .. } => (io, tracker),
            Mode::Recorded(_) => return,
        };
        io.discovery.shutdown();
        tracker.close();
        if tokio::time::timeout(STOP_GRACE, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("effects of a group did not stop within {STOP_GRACE:?}");
        }
    }
}

impl Io {
    async fn execute(&self, work: Work) -> Option<Internal> {
        let group = self.group.as_str();
        let ops = &self.ops;
        let state = &self.ctx.state;
        match work {
            Work::AskPeer { peer, query } => {
                let link = self.ctx.peers.get(peer)?.clone();
                let result = link.is_down(&query).await;
                Some(Internal::Answer {
                    peer,
                    epoch: query.epoch,
                    at: Instant::now(),
                    result,
                })
            }
            Work::StartElection { seen } => Some(Internal::EpochPersisted(
                state.start_election(group, seen).await,
            )),
            Work::Vote { query, down, reply } => {
                let candidate = query.candidate.clone().unwrap_or_default();
                let result = state
                    .vote(group, query.epoch, &candidate, query.promote.as_ref())
                    .await;
                Some(Internal::Voted {
                    query,
                    down,
                    result,
                    reply,
                })
            }
            Work::AnswerWithoutVote { query, down, reply } => {
                if query.candidate.is_none()
                    && query.epoch > 0
                    && let Err(e) = state.observe_epoch(query.epoch).await
                {
                    tracing::debug!(error = %e, "cannot persist the observed epoch");
                }
                let rec = state.group(group);
                let _ = reply.send(Ok(IsDownReply {
                    down,
                    leader: rec.voted_for,
                    leader_epoch: rec.vote_epoch,
                }));
                None
            }
            Work::Fence {
                epoch,
                fence,
                deadline,
            } => {
                // Recorded first: a leader killed between its fence and its
                // publication routes the backends to the kept master again
                // when it restarts (`start_config`). A refused write (a full
                // disk) does not hold the failover back.
                if let Err(e) = state.lead(group, epoch).await {
                    tracing::warn!(%group, epoch, error = %e, "cannot record the failover's fence in the state file");
                }
                let r = self.discovery.fence(fence, deadline).await;
                Some(Internal::Failover(epoch, Input::Fenced(r)))
            }
            Work::Promote {
                epoch,
                candidate,
                flavour,
                flush,
                chosen,
            } => {
                let r = ops
                    .promote(&candidate, flavour, flush, chosen.as_ref())
                    .await;
                Some(Internal::Failover(epoch, Input::Promoted(r)))
            }
            Work::Switchover {
                epoch,
                old_master,
                flavour,
                candidate,
                listed_as,
                timeout,
                ends_by_unix,
                history,
            } => {
                // Recorded first: a leader killed before the result comes
                // does not route its kept master again, when it restarts,
                // while the server may still hand over
                // (`Group::switchover_out`).
                if let Err(e) = state.switchover_sent(group, epoch, ends_by_unix).await {
                    tracing::warn!(%group, epoch, error = %e, "cannot record the switchover in the state file");
                }
                let r = ops
                    .switchover(
                        &old_master,
                        flavour,
                        &candidate,
                        &listed_as,
                        timeout,
                        history.as_deref(),
                    )
                    .await;
                Some(Internal::SwitchedOver(epoch, r))
            }
            Work::Repoint {
                epoch,
                replica,
                flavour,
                master,
                retry_for,
                master_chosen,
            } => {
                let r = ops
                    .repoint_retrying(
                        &replica,
                        flavour,
                        &master,
                        retry_for,
                        master_chosen.as_ref(),
                    )
                    .await;
                match epoch {
                    Some(epoch) => Some(Internal::Failover(epoch, Input::RepointSent(replica, r))),
                    None => {
                        if let Err(e) = r {
                            tracing::warn!(group, instance = %replica, error = %e, "re-pointing a replica failed");
                        }
                        None
                    }
                }
            }
            Work::Demote {
                addr,
                flavour,
                master,
            } => {
                let r = ops.demote(&addr, flavour, &master).await;
                Some(Internal::Demoted(addr, r))
            }
            Work::PersistAndPublish {
                topology,
                known,
                deadline,
                machine,
            } => {
                let epoch = topology.epoch;
                let persisted = state
                    .set_config(group, epoch, &topology.master, known)
                    .await;
                let result = self.discovery.publish(topology, deadline).await;
                Some(Internal::Published {
                    epoch,
                    persisted,
                    machine,
                    result,
                })
            }
            Work::Republish { topology, deadline } => {
                if let Err(e) = self.discovery.publish(topology, deadline).await {
                    tracing::warn!(group, error = %e, "publishing the current config failed");
                }
                None
            }
            Work::PersistConfig {
                epoch,
                master,
                known,
            } => {
                let result = state.set_config(group, epoch, &master, known).await;
                Some(Internal::ConfigPersisted { epoch, result })
            }
            Work::PersistIdentity(identity) => {
                if let Err(e) = state.set_master_identity(group, identity).await {
                    tracing::warn!(group, error = %e, "persisting the master's identity failed");
                }
                None
            }
            Work::CheckPeerConfig { from, group } => {
                let role = ops.info(&group.master).await.map(|i| i.role);
                Some(Internal::PeerConfigChecked { from, group, role })
            }
            Work::ScriptKill(addr) => {
                let result = ops.script_kill(&addr).await;
                Some(Internal::ScriptKilled(addr, result))
            }
            Work::Pause {
                target,
                pause,
                after,
            } => {
                tokio::time::sleep(after).await;
                match ops.pause_all(&target, pause).await {
                    Ok(()) => {
                        tracing::info!(group, master = %target, ?pause, "restarted master paused: its replicas cannot resynchronise from it")
                    }
                    Err(e) => {
                        tracing::warn!(group, master = %target, error = %e, "could not pause the restarted master");
                        return Some(Internal::PauseRefused(target));
                    }
                }
                None
            }
            Work::ReleaseSyncHold {
                target,
                restore,
                refused,
            } => {
                let result = ops.release_sync_hold(&target, &restore).await;
                let (outcome, back) = match &result {
                    Ok(()) => {
                        tracing::info!(group, instance = %target, "sync hold released: the server's own replication settings are back");
                        ("released", None)
                    }
                    Err(e) => {
                        tracing::warn!(group, instance = %target, error = %e, settings = ?restore, "could not set the server's replication settings back after a sync hold; trying again at its next INFO");
                        let refused = refused + 1;
                        (
                            "refused",
                            Some(Internal::SyncHoldRefused {
                                target,
                                restore,
                                refused,
                            }),
                        )
                    }
                };
                metrics::counter!(crate::metrics::SYNC_HOLDS, "group" => group.to_string(), "result" => outcome)
                    .increment(1);
                back
            }
            Work::SetFence {
                master,
                target,
                lag,
                keep,
            } => {
                let result = ops.set_min_replicas(&master, target, Some(lag), keep).await;
                Some(Internal::FenceSet {
                    master,
                    target,
                    keep,
                    lag,
                    at: Instant::now(),
                    result,
                })
            }
            Work::ClearFence { addr, run_id } => {
                let result = ops
                    .set_min_replicas(&addr, 0, None, 0)
                    .await
                    .map(|(before, _)| before);
                Some(Internal::FenceCleared {
                    addr,
                    run_id,
                    at: Instant::now(),
                    result,
                })
            }
        }
    }
}
