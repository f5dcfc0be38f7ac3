//! The work a group task starts and the results that come back to it.
//!
//! Every effect runs on the group's own [`TaskTracker`] and is cancelled
//! with the group: nothing it started outlives it.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::addr::Addr;
use crate::discovery::runner::RunnerError;
use crate::failover::machine::Input;
use crate::probe::Role;
use crate::quorum::peers::{HelloGroup, IsDownQuery, IsDownReply};
use crate::quorum::state::{StateError, Vote};
use crate::resp::RespError;

/// How long a stopping group waits for its effects to see the cancellation.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Results of the group's effects, fed back to the machine that asked.
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
        reply: oneshot::Sender<Result<IsDownReply, StateError>>,
    },
    /// A failover step ended; `u64` is the failover's epoch.
    Failover(u64, Input),
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
    ScriptKilled(Addr, Result<crate::failover::ops::ScriptKill, RespError>),
    /// A stray master was demoted (or not).
    Demoted(Addr, Result<(), RespError>),
    /// The master a peer announces reported this role.
    PeerConfigChecked {
        from: String,
        group: HelloGroup,
        role: Result<Role, RespError>,
    },
}

/// The group's spawner.
#[derive(Debug)]
pub(super) struct Effects {
    tracker: TaskTracker,
    /// Boxed: a mailbox slot is as large as its largest message, and the
    /// failover's results are large.
    tx: mpsc::Sender<Box<Internal>>,
    cancel: CancellationToken,
}

impl Effects {
    pub(super) fn new(tx: mpsc::Sender<Box<Internal>>, cancel: CancellationToken) -> Effects {
        Effects {
            tracker: TaskTracker::new(),
            tx,
            cancel,
        }
    }

    /// The group's cancellation.
    pub(super) fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Run `work`; its result (if any) comes back to the group.
    pub(super) fn spawn<F>(&self, work: F)
    where
        F: Future<Output = Option<Internal>> + Send + 'static,
    {
        let tx = self.tx.clone();
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                r = work => if let Some(msg) = r {
                    let _ = tx.send(Box::new(msg)).await;
                }
            }
        });
    }

    /// Wait (bounded) for every effect to end after the cancellation.
    pub(super) async fn stop(&self) {
        self.cancel.cancel();
        self.tracker.close();
        if tokio::time::timeout(STOP_GRACE, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("effects of a group did not stop within {STOP_GRACE:?}");
        }
    }
}
