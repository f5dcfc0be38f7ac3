//! picket's integration tests: one binary, so that the library and the
//! harness (the `picket-harness` crate: real servers, daemons, the fake
//! Kubernetes API, the Dragonfly stub) are linked once, not once per file.
//!
//! Each module is one area; `cargo test --test it <module>::` runs one of
//! them. The tests run side by side: every server a test starts takes its
//! own loopback address from the harness's one allocator
//! (`picket_harness::next_loopback_ip`); the few that cannot run alongside
//! others are listed, with the reason, in `.config/nextest.toml`.

mod api_commands;
mod api_compat;
mod api_hostile;
mod api_pipeline;
mod api_redis_py;
mod auth;
mod busy_script;
mod chaos;
mod cli_addr;
mod config;
mod discovery_e2e;
mod failover;
mod fake_kube_watch;
mod forgetting;
mod full_disk;
mod haproxy;
mod harness;
mod hostile_peer;
mod hostnames;
mod import;
mod isolation;
mod kube_members;
mod kube_real;
mod kubernetes;
mod metrics_startup;
mod ops_docs;
mod probing;
mod prometheus;
mod readme;
mod reload;
mod restart;
mod systemd;
mod tilt;
mod tls;
