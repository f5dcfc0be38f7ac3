//! Failover: replica selection, the state machine, and the commands sent
//! to the data servers.

pub mod machine;
pub mod ops;
pub mod select;
