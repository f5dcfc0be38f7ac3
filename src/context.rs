//! What every group task shares, below the groups: identity, persisted
//! state, peer links and what the peers said, the event bus, stall
//! protection and fault injection. Nothing here knows of groups; the
//! groups read it, and the daemon (above them) builds it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::Notify;

use crate::events::Events;
use crate::quorum::peers::PeerLink;
use crate::quorum::state::StateStore;
use crate::quorum::table::PeerTable;
use crate::tilt::Tilt;

/// The daemon-wide context shared by the group tasks, the API and HTTP.
#[derive(Debug)]
pub struct DaemonCtx {
    /// This daemon's id (readable: logs, status, metrics, votes).
    pub id: String,
    /// Its 40-hex run id, what Sentinel clients know it by (`SENTINEL
    /// MYID`, `runid`).
    pub run_id: String,
    /// Address announced to peers and clients.
    pub announce: String,
    /// Persisted state.
    pub state: Arc<StateStore>,
    /// Links to the peers (same order as the config's `peers`).
    pub peers: Vec<PeerLink>,
    /// What the peers said.
    pub peer_table: PeerTable,
    /// Event bus.
    pub events: Events,
    /// Wake the hello task (a config changed).
    pub hello_now: Notify,
    /// Stall protection.
    pub tilt: Tilt,
    /// Password required on `listen` (and sent to peers).
    pub password: Option<String>,
    /// `SENTINEL SIMULATE-FAILURE` flags ([`CRASH_AFTER_ELECTION`],
    /// [`CRASH_AFTER_PROMOTION`]): crash tests make the leader exit at the
    /// worst moments.
    pub simulate_failure: AtomicU8,
}

/// Exit right after winning an election.
pub const CRASH_AFTER_ELECTION: u8 = 1;
/// Exit right after the promotion step succeeded.
pub const CRASH_AFTER_PROMOTION: u8 = 2;

impl DaemonCtx {
    /// Exit the process (code 99, like Sentinel) if `flag` is set.
    pub fn maybe_crash(&self, flag: u8, what: &str) {
        if self.simulate_failure.load(Ordering::SeqCst) & flag != 0 {
            tracing::warn!("simulated failure: exiting {what}");
            std::process::exit(99);
        }
    }

    /// Number of daemons in the quorum (peers + self).
    pub fn daemons(&self) -> usize {
        self.peers.len() + 1
    }

    /// A majority of all configured daemons.
    pub fn majority(&self) -> usize {
        self.daemons() / 2 + 1
    }
}
