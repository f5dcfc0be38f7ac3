//! Probing of data servers: one task per instance.

pub mod info;
