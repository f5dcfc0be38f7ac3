//! The RESP listener: the Sentinel-compatible API for clients and the
//! peer protocol (`PICKET ...`) for the other daemons, on one port.
//!
//! Limits keep a hostile or broken client from hurting the daemon: a
//! maximum number of connections, caps on request size and on the number of
//! arguments, a cap on one reply, a bounded output queue per connection
//! (a subscriber that does not read is disconnected), and `AUTH` before
//! anything else when a password is set.
//!
//! Each connection is one task that reads, runs and writes: every complete
//! request of one read is answered into one output buffer, written with one
//! system call (a pipelined batch costs one read and one write, and no
//! other task is woken per request), and events are encoded into the same
//! buffer for subscribers. The unsent output is bounded in bytes: the
//! client is not read while it holds [`OUTPUT_BUDGET`], and a pub/sub
//! message that finds no room within [`SLOW_SUBSCRIBER_GRACE`] disconnects
//! its subscriber, so a connection holds at most about that much whatever
//! the client does.

pub mod acl;
pub mod commands;
pub mod conn;
pub mod hub;
pub mod info;
pub mod listener;
pub mod peer;
pub mod pubsub;
pub mod reply;
pub mod request;
pub mod sentinel;
mod spin;
pub mod util;

pub use conn::{
    Api, ClientEntry, ClientState, Conn, Limits, MAX_ARGS, MAX_REPLY_BYTES, MAX_REQUEST_FRAME,
    OUTPUT_BUDGET, SLOW_SUBSCRIBER_GRACE, Stats,
};
pub use listener::serve;
pub use reply::Reply;
