//! The quorum: links to the peers and their protocol, ODOWN and the
//! election, votes and epochs, and the persisted state.

pub(crate) mod election;
pub mod peers;
#[cfg(test)]
mod sim;
pub mod state;
pub(crate) mod table;
pub(crate) mod vote;
