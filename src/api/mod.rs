//! The RESP listener: the Sentinel-compatible API for clients and the
//! peer protocol (`PICKET ...`) for the other daemons, on one port.
//!
//! Limits keep a hostile or broken client from hurting the daemon: a
//! maximum number of connections, caps on request size and on the number of
//! arguments, a cap on one reply, a bounded output queue per connection
//! (a subscriber that does not read is disconnected), and `AUTH` before
//! anything else when a password is set.
//!
//! Each connection has two tasks: the reader decodes requests, runs them
//! and forwards events to subscribers; the writer drains a bounded queue of
//! encoded replies into the socket. The queue is bounded twice, in entries
//! and in bytes, so a connection holds at most [`OUTPUT_BUDGET`] bytes of
//! unsent output whatever the client does.

pub mod acl;
pub mod commands;
pub mod conn;
pub mod info;
pub mod listener;
pub mod peer;
pub mod pubsub;
pub mod reply;
pub mod request;
pub mod sentinel;
pub mod util;

pub use conn::{
    Api, ClientEntry, ClientState, Conn, Limits, MAX_ARGS, MAX_REPLY_BYTES, MAX_REQUEST_FRAME,
    OUTPUT_BUDGET, OUTPUT_QUEUE, SLOW_SUBSCRIBER_GRACE, Stats,
};
pub use listener::serve;
pub use reply::Reply;
