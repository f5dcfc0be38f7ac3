//! The parts of picket-bench shared by its two programs: the writing
//! client that `picket-writer` runs on its own and `picket-bench` runs
//! beside the servers it measures, and the partitions of the partition
//! scenario and a network namespace of the run's own (both also used by
//! picket's own tests).

pub mod client;
pub mod netns;
pub mod partition;
