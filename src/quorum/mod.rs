//! The quorum: links to the peers and their protocol, ODOWN and the
//! election, votes and epochs, and the persisted state.

pub mod election;
pub mod hello;
pub mod peers;
#[cfg(test)]
mod sim;
pub mod state;
pub mod table;
pub mod vote;
