//! Links to the other daemons and the messages of the peer protocol.
//!
//! The peer protocol runs on the RESP `listen` port (TLS when
//! `[daemon.tls]` is set, with this daemon's certificate as the client's),
//! after `AUTH` as the peer user (`daemon.peer_user`) or with the default
//! user's password:
//!
//! - `PICKET IS-DOWN <group> <master> <config-epoch> <epoch>
//!   <candidate-id|*> [<promote>]` → `[down:int, leader-id|"*",
//!   leader-epoch:int]`: Sentinel's `is-master-down-by-addr` semantics. The
//!   asker names the master it means and its config epoch, so a daemon
//!   with a stale view gets neither "down" answers nor votes; with a
//!   candidate id it is a vote request, and `promote` names the replica the
//!   candidate will promote (voters then neither demote it nor pick another
//!   one if the candidate dies half-way).
//! - `PICKET HELLO <json>` → the receiver's own hello (JSON): current
//!   epoch and, per group, the master and its config epoch. Sent
//!   periodically and at once after a change; both sides converge on the
//!   highest config epoch.

use std::time::Duration;

use redis_protocol::resp2::types::BytesFrame;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::addr::Addr;
use crate::resp::client::TlsClient;
use crate::resp::{ClientOptions, Connection, RespError, frame_int, frame_text};

/// A daemon's view, exchanged with its peers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Sender's daemon id.
    pub id: String,
    /// Sender's run id (absent from daemons older than run ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Sender's announced RESP address.
    pub addr: String,
    /// Sender's current epoch.
    pub current_epoch: u64,
    /// Per group.
    pub groups: Vec<HelloGroup>,
}

/// One group in a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloGroup {
    /// Group name.
    pub name: String,
    /// The sender's current master for it.
    pub master: Addr,
    /// The config epoch of that master.
    pub config_epoch: u64,
    /// Whether the sender sees that master down (SDOWN).
    pub sdown: bool,
    /// The master's replicas as the sender sees them (isolation fencing
    /// decides from every daemon's sight). Absent from daemons that
    /// predate it: such a daemon's sight is unknown, never "none up".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaSight>,
    /// The epoch of the election or failover the sender leads, while one
    /// runs: its config may come after a promotion the others already
    /// see. Absent when none runs, and from daemons that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_epoch: Option<u64>,
    /// The replica a leader is promoting in an epoch newer than the
    /// sender's config, as the sender knows it (its own failover, or a
    /// vote request it was asked): a daemon that has heard of neither
    /// must not take that replica, turning master, for a stray. Absent
    /// when none, and from daemons that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoting: Option<Promotion>,
    /// The epoch of a leader the sender voted for within
    /// `failover_timeout`, newer than its config: the sender stands back
    /// for that leader's failover (Sentinel's rule for voters), and so do
    /// the daemons that hear it, whether or not they were asked. Absent
    /// when none, and from daemons that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stand_back: Option<u64>,
    /// The id of that leader: a daemon that hears the leader itself say,
    /// after it began that epoch, that it no longer fails over need not
    /// stand back for it. Absent when none, and from daemons that predate
    /// it (their `stand_back` then counts until it ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stand_back_leader: Option<String>,
}

impl HelloGroup {
    /// The sender leads a failover, or voted for a leader, in an epoch
    /// newer than `config_epoch`: a daemon on that config neither starts
    /// an election nor reconfigures instances while this hello is recent.
    /// `leader_done(epoch, leader)` says that leader is known to have
    /// stopped failing over in that epoch: the vote for it no longer
    /// counts.
    pub fn failing_over_past(
        &self,
        config_epoch: u64,
        leader_done: impl Fn(u64, &str) -> bool,
    ) -> bool {
        self.failover_epoch.is_some_and(|f| f > config_epoch)
            || self.stand_back.is_some_and(|e| {
                e > config_epoch
                    && !self
                        .stand_back_leader
                        .as_deref()
                        .is_some_and(|l| leader_done(e, l))
            })
    }
}

/// A promotion a leader intends, in its epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promotion {
    /// The election's epoch.
    pub epoch: u64,
    /// The replica being promoted.
    pub replica: Addr,
}

/// How many of a master's replicas one daemon sees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaSight {
    /// Replicas that answer its probes (not SDOWN), whatever their link.
    pub up: u32,
    /// Of those, the ones that report their link to that master up.
    pub linked: u32,
}

/// A reply to `PICKET IS-DOWN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsDownReply {
    /// The peer sees the master down.
    pub down: bool,
    /// The peer's vote in `leader_epoch` (None for `*`).
    pub leader: Option<String>,
    /// The epoch of that vote.
    pub leader_epoch: u64,
}

impl IsDownReply {
    /// Not down, no vote: the answer about a master this daemon does not
    /// watch.
    pub fn not_down() -> IsDownReply {
        IsDownReply {
            down: false,
            leader: None,
            leader_epoch: 0,
        }
    }

    /// Encode as `[down, leader|*, epoch]`: the one encoder of this reply,
    /// used by the API (`PICKET IS-DOWN`, `SENTINEL IS-MASTER-DOWN-BY-ADDR`).
    pub fn to_frame(&self) -> BytesFrame {
        BytesFrame::Array(vec![
            BytesFrame::Integer(i64::from(self.down)),
            BytesFrame::BulkString(self.leader.clone().unwrap_or_else(|| "*".into()).into()),
            BytesFrame::Integer(i64::try_from(self.leader_epoch).unwrap_or(i64::MAX)),
        ])
    }

    /// Decode a well-typed `[int, bulk, int]` reply; anything else is refused.
    pub fn from_frame(frame: &BytesFrame) -> Result<IsDownReply, RespError> {
        let bad = || RespError::Unexpected(format!("IS-DOWN reply {frame:?}"));
        let BytesFrame::Array(items) = frame else {
            return Err(bad());
        };
        let [
            BytesFrame::Integer(down),
            leader @ BytesFrame::BulkString(_),
            BytesFrame::Integer(epoch),
        ] = items.as_slice()
        else {
            return Err(bad());
        };
        let leader = frame_text(leader).ok_or_else(bad)?;
        Ok(IsDownReply {
            down: *down == 1,
            leader: (leader != "*").then_some(leader),
            leader_epoch: u64::try_from(*epoch).map_err(|_| bad())?,
        })
    }
}

/// A `PICKET IS-DOWN` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsDownQuery {
    /// Group name.
    pub group: String,
    /// The master the asker means.
    pub master: Addr,
    /// The asker's config epoch for the group.
    pub config_epoch: u64,
    /// The asker's current epoch (the election epoch for a vote request).
    pub epoch: u64,
    /// The asker's id when it asks for a vote.
    pub candidate: Option<String>,
    /// The replica the candidate will promote.
    pub promote: Option<Addr>,
}

impl IsDownQuery {
    /// The command's arguments.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "PICKET".into(),
            "IS-DOWN".into(),
            self.group.clone(),
            self.master.to_string(),
            self.config_epoch.to_string(),
            self.epoch.to_string(),
            self.candidate.clone().unwrap_or_else(|| "*".into()),
        ];
        if let Some(p) = &self.promote {
            v.push(p.to_string());
        }
        v
    }

    /// Parse the arguments after `PICKET IS-DOWN`.
    pub fn from_args(args: &[String]) -> Result<IsDownQuery, String> {
        if args.len() != 5 && args.len() != 6 {
            return Err("wrong number of arguments for 'picket|is-down' command".into());
        }
        let num = |s: &String, what: &str| {
            s.parse::<u64>()
                .map_err(|_| format!("invalid {what} '{s}'"))
        };
        Ok(IsDownQuery {
            group: args[0].clone(),
            master: args[1]
                .parse()
                .map_err(|e| format!("invalid master: {e}"))?,
            config_epoch: num(&args[2], "config epoch")?,
            epoch: num(&args[3], "epoch")?,
            candidate: (args[4] != "*").then(|| args[4].clone()),
            promote: match args.get(5) {
                Some(p) => Some(
                    p.parse()
                        .map_err(|e| format!("invalid promote address: {e}"))?,
                ),
                None => None,
            },
        })
    }
}

struct Request {
    args: Vec<String>,
    reply: oneshot::Sender<Result<BytesFrame, RespError>>,
}

/// A link to one peer: a task owning one connection, serving requests in
/// order. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PeerLink {
    addr: String,
    tx: mpsc::Sender<Request>,
}

impl PeerLink {
    /// Start the link task for `addr`.
    pub fn spawn(addr: String, opts: ClientOptions, cancel: CancellationToken) -> PeerLink {
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(run(addr.clone(), opts, rx, cancel));
        PeerLink { addr, tx }
    }

    /// The peer's address as configured.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Send a command and wait for the reply (bounded by the link's timeouts).
    pub async fn request(&self, args: Vec<String>) -> Result<BytesFrame, RespError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .try_send(Request { args, reply })
            .map_err(|_| RespError::Unexpected("peer link queue full or closed".into()))?;
        rx.await.map_err(|_| RespError::Closed)?
    }

    /// Ask whether `q.group`'s master is down, optionally requesting a vote.
    pub async fn is_down(&self, q: &IsDownQuery) -> Result<IsDownReply, RespError> {
        let reply = self.request(q.to_args()).await?;
        IsDownReply::from_frame(&reply)
    }

    /// Send our hello; returns the peer's.
    pub async fn hello(&self, hello: &Hello) -> Result<Hello, RespError> {
        let json = serde_json::to_string(hello).map_err(|e| RespError::Protocol(e.to_string()))?;
        let reply = self
            .request(vec!["PICKET".into(), "HELLO".into(), json])
            .await?;
        let text = frame_text(&reply).ok_or_else(|| RespError::Unexpected(format!("{reply:?}")))?;
        serde_json::from_str(&text).map_err(|e| RespError::Unexpected(format!("hello: {e}")))
    }
}

async fn run(
    addr: String,
    opts: ClientOptions,
    mut rx: mpsc::Receiver<Request>,
    cancel: CancellationToken,
) {
    let mut conn: Option<Connection> = None;
    // A refused handshake or login is a configuration problem the
    // operator must see, once per change rather than once per request.
    let mut warned: Option<String> = None;
    loop {
        let req = tokio::select! {
            _ = cancel.cancelled() => return,
            r = rx.recv() => match r { Some(r) => r, None => return },
        };
        if req.reply.is_closed() {
            continue;
        }
        if conn.is_none() {
            match Connection::connect(&addr, &opts).await {
                Ok(c) => {
                    if warned.take().is_some() {
                        tracing::info!(peer = %addr, "peer link established");
                    }
                    conn = Some(c);
                }
                Err(e) => {
                    if matches!(e, RespError::Tls(_) | RespError::Server(_)) {
                        let text = e.to_string();
                        if warned.as_deref() != Some(text.as_str()) {
                            tracing::warn!(peer = %addr, "cannot connect to the peer: {text}");
                            warned = Some(text);
                        }
                    }
                    let _ = req.reply.send(Err(e));
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let result = c.call(&req.args).await;
        if let Err(e) = &result
            && e.is_fatal_to_connection()
        {
            conn = None;
        }
        let _ = req.reply.send(result);
    }
}

/// Connection settings for peer links: the peer credential (`AUTH
/// username password`, or `AUTH password` for the default user), TLS when
/// `[daemon.tls]` says so, and short timeouts, because every request is on
/// the failover's critical path.
pub fn peer_client_options(
    username: Option<String>,
    password: Option<String>,
    tls: Option<TlsClient>,
    timeout: Duration,
) -> ClientOptions {
    ClientOptions {
        connect_timeout: timeout,
        command_timeout: timeout,
        username,
        password,
        tls,
        max_frame: crate::resp::DEFAULT_MAX_FRAME,
        client_name: None,
    }
}

/// Parse the integer argument of a peer command.
pub fn parse_epoch(frame: &BytesFrame) -> Option<u64> {
    frame_int(frame).and_then(|i| u64::try_from(i).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_down_reply_round_trip() {
        let r = IsDownReply {
            down: true,
            leader: Some("abc".into()),
            leader_epoch: 7,
        };
        assert_eq!(IsDownReply::from_frame(&r.to_frame()).unwrap(), r);
        let none = IsDownReply {
            down: false,
            leader: None,
            leader_epoch: 0,
        };
        assert_eq!(IsDownReply::from_frame(&none.to_frame()).unwrap(), none);
    }

    #[test]
    fn is_down_query_round_trip() {
        let q = IsDownQuery {
            group: "g".into(),
            master: Addr::new("127.0.0.2", 6379),
            config_epoch: 3,
            epoch: 9,
            candidate: Some("abc".into()),
            promote: Some(Addr::new("127.0.0.3", 6379)),
        };
        let args = q.to_args();
        assert_eq!(IsDownQuery::from_args(&args[2..]).unwrap(), q);
        let q2 = IsDownQuery {
            candidate: None,
            promote: None,
            ..q
        };
        assert_eq!(IsDownQuery::from_args(&q2.to_args()[2..]).unwrap(), q2);
        assert!(IsDownQuery::from_args(&["g".into()]).is_err());
        let mut bad = q2.to_args()[2..].to_vec();
        bad[3] = "-1".into();
        assert!(IsDownQuery::from_args(&bad).is_err());
    }

    #[test]
    fn a_hello_without_replica_sight_still_parses() {
        // What a daemon from before isolation fencing sends.
        let old = r#"{"id":"b","addr":"10.0.0.2:26379","current_epoch":3,
            "groups":[{"name":"cache","master":"10.0.0.5:6379","config_epoch":2,"sdown":false}]}"#;
        let h: Hello = serde_json::from_str(old).unwrap();
        assert_eq!(h.groups[0].replicas, None);
        assert_eq!(h.groups[0].failover_epoch, None);
        assert_eq!(h.groups[0].promoting, None);
        assert_eq!(h.groups[0].stand_back_leader, None);
        // And what it receives from a newer one (unknown fields ignored).
        let mut g = h.groups[0].clone();
        g.replicas = Some(ReplicaSight { up: 2, linked: 1 });
        g.failover_epoch = Some(4);
        let json = serde_json::to_string(&g).unwrap();
        assert!(json.contains(r#""replicas":{"up":2,"linked":1}"#), "{json}");
        assert!(json.contains(r#""failover_epoch":4"#), "{json}");
        assert!(!json.contains("promoting"), "{json}");
        g.promoting = Some(Promotion {
            epoch: 4,
            replica: Addr::new("10.0.0.6", 6379),
        });
        assert!(!json.contains("stand_back"), "{json}");
        g.stand_back = Some(4);
        g.stand_back_leader = Some("a".into());
        let json = serde_json::to_string(&g).unwrap();
        assert!(json.contains(r#""promoting":{"epoch":4"#), "{json}");
        assert!(
            json.contains(r#""stand_back":4,"stand_back_leader":"a""#),
            "{json}"
        );
        let back: HelloGroup = serde_json::from_str(&json).unwrap();
        assert_eq!(back, g);
        #[derive(Deserialize)]
        struct OldGroup {
            name: String,
            sdown: bool,
        }
        let old_view: OldGroup = serde_json::from_str(&json).unwrap();
        assert_eq!((old_view.name.as_str(), old_view.sdown), ("cache", false));
    }

    #[test]
    fn malformed_is_down_replies_are_refused() {
        let bad = [
            BytesFrame::Integer(1),
            BytesFrame::Array(vec![BytesFrame::Integer(1)]),
            BytesFrame::Array(vec![
                BytesFrame::BulkString("1".into()),
                BytesFrame::BulkString("*".into()),
                BytesFrame::Integer(1),
            ]),
            BytesFrame::Array(vec![
                BytesFrame::Integer(1),
                BytesFrame::BulkString("*".into()),
                BytesFrame::Integer(-1),
            ]),
        ];
        for b in bad {
            assert!(IsDownReply::from_frame(&b).is_err(), "{b:?}");
        }
    }
}
