//! Failover: replica selection, the state machine, and the commands sent
//! to the data servers.

pub mod machine;
pub mod ops;
pub mod select;

use crate::addr::Addr;
use select::Exclusion;

/// Why no replica can be promoted (Sentinel's `NOGOODSLAVE`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoGoodReplica {
    /// `--to` named an address that is not a replica of the group.
    #[error("{0} is not a known replica")]
    Unknown(Addr),
    /// Every known replica is excluded (or none is known).
    #[error("No suitable replica to promote ({})", excluded_list(.0))]
    NoneSuitable(Vec<(Addr, Exclusion)>),
}

fn excluded_list(excluded: &[(Addr, Exclusion)]) -> String {
    if excluded.is_empty() {
        return "no replica known".into();
    }
    excluded
        .iter()
        .map(|(a, w)| format!("{a}: {w:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A command a data server refused or that could not be sent (the
/// failover machine only reports it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CommandFailed(pub String);

impl From<crate::resp::RespError> for CommandFailed {
    fn from(e: crate::resp::RespError) -> Self {
        CommandFailed(e.to_string())
    }
}

/// Why a failover or switchover did not start or did not go on. The
/// Sentinel-compatible API turns each into Sentinel's reply text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FailoverError {
    /// An election or failover of the group is already running.
    #[error("failover already in progress")]
    InProgress,
    /// This daemon voted for another daemon, which leads the failover.
    #[error("another daemon leads the failover")]
    AnotherLeader,
    /// A newer configuration came from a peer meanwhile.
    #[error("a newer configuration was adopted")]
    NewerConfig,
    /// A switchover needs a live master.
    #[error("the master is down")]
    MasterDown,
    /// No replica can be promoted.
    #[error(transparent)]
    NoGoodReplica(#[from] NoGoodReplica),
    /// The election was lost or split.
    #[error("could not win the election")]
    NotElected,
    /// The new epoch could not be made durable.
    #[error("cannot persist state: {0}")]
    Persist(String),
}
