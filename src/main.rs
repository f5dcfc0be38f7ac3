//! The `picket` binary: command-line parsing only; everything else is in the library.

fn main() {}
