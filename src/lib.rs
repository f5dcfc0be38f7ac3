//! picket: an out-of-cluster, Sentinel-style high-availability daemon for
//! Dragonfly, Redis and Valkey.
//!
//! # Layout
//!
//! - [`config`]: the TOML schema and its validation.
//! - [`resp`]: RESP2 client and server codec with a frame-size cap.
//! - [`probe`]: one probing task per instance, INFO/ROLE parsing, SDOWN.
//! - [`quorum`]: peer links, votes, epochs, ODOWN, persisted state.
//! - [`failover`]: the failover state machine and replica selection.
//! - [`discovery`]: where the master is published (Kubernetes, exec, webhook, file).
//! - [`api`]: the Sentinel-compatible RESP API and its events.
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`, `/v1/status`.
//! - [`metrics`]: every metric name in one place.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]
#![warn(missing_docs)]

pub mod addr;
pub mod api;
pub mod config;
pub mod daemon;
pub mod discovery;
pub mod events;
pub mod failover;
pub mod group;
pub mod metrics;
pub mod probe;
pub mod quorum;
pub mod resp;
pub mod tls;
