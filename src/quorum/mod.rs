//! Peers, votes, epochs and the persisted state.

pub mod peers;
pub mod state;
