//! The seeded simulation of whole failovers (`group/scenario.rs`), for the
//! `picket-sim` binary: not an API (hidden from the documentation), and not
//! linked into the daemon, which never calls it.

pub use crate::group::scenario::run::{
    NetFaults, Outcome, Run, known_open, known_open_with_net, run,
};
