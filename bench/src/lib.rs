//! The parts of picket-bench shared by its two programs: the writing
//! client that `picket-writer` runs on its own and `picket-bench` runs
//! beside the servers it measures.

pub mod client;
