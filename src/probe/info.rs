//! Parsing of `INFO` (server, replication, persistence sections) and `ROLE`
//! replies for Redis, Valkey and Dragonfly.
//!
//! The three flavours differ (see `shared/reference/dragonfly.md` §4):
//! Dragonfly has no `run_id`, no `master_repl_offset`, replica offsets are
//! sums of per-shard LSNs, and its `ROLE` reply has another shape. An offset
//! that cannot be read is `None` (unknown), never 0.

use redis_protocol::resp2::types::BytesFrame;
use serde::Serialize;

/// Which server implementation answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Flavour {
    /// Redis (no `valkey_version`, no `dragonfly_version`).
    #[default]
    Redis,
    /// Valkey (`valkey_version` or `server_name:valkey`).
    Valkey,
    /// Dragonfly (`dragonfly_version`).
    Dragonfly,
}

/// The role an instance reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `role:master`.
    Master,
    /// `role:slave` (or Dragonfly's older `role:replica`).
    Replica,
    /// Missing or unrecognised.
    #[default]
    Unknown,
}

/// One `slaveN:` line of a master's `INFO replication`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplicaEntry {
    /// `ip=`.
    pub ip: String,
    /// `port=`.
    pub port: u16,
    /// `state=` (online, wait_bgsave, stable_sync, ...).
    pub state: String,
    /// `offset=` (absent on Dragonfly).
    pub offset: Option<i64>,
    /// `lag=` (seconds on Redis/Valkey, LSN lag on Dragonfly).
    pub lag: Option<i64>,
}

/// What picket reads from one `INFO` reply.
///
/// Every field that a server did not report stays unknown (`None`); in
/// particular a missing offset is never read as 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InfoSnapshot {
    /// Detected flavour.
    pub flavour: Flavour,
    /// `redis_version`, `valkey_version` or `dragonfly_version` as reported.
    pub version: Option<String>,
    /// `run_id` (Redis/Valkey only).
    pub run_id: Option<String>,
    /// `role:`.
    pub role: Role,
    /// Replica: `master_host`.
    pub master_host: Option<String>,
    /// Replica: `master_port`.
    pub master_port: Option<u16>,
    /// Replica: `master_link_status:up`.
    pub master_link_up: bool,
    /// Replica: `master_link_down_since_seconds` (absent on Dragonfly, and
    /// on Redis/Valkey while the link is up). Redis reports `-1` when the
    /// link has never been up since the last `REPLICAOF`; that is `None`
    /// here with [`InfoSnapshot::master_link_never_up`] set.
    pub master_link_down_since_secs: Option<u64>,
    /// Replica: `master_link_down_since_seconds:-1`, i.e. this replica has not
    /// completed a link to its current master since it was pointed at it.
    pub master_link_never_up: bool,
    /// Replica: `master_last_io_seconds_ago`.
    pub master_last_io_secs: Option<i64>,
    /// Replica: `master_sync_in_progress:1`.
    pub sync_in_progress: bool,
    /// Replica: `slave_repl_offset` (unknown when absent).
    pub replica_offset: Option<i64>,
    /// Replica: `slave_priority` / `replica_priority` (None when absent).
    pub priority: Option<u32>,
    /// Replica: `replica_announced` (true when absent).
    pub replica_announced: bool,
    /// `master_repl_offset` (absent on Dragonfly). Redis and Valkey also
    /// report it on replicas, where it is the replica's own replication
    /// offset; it is kept whatever the role.
    pub master_offset: Option<i64>,
    /// Master: `connected_slaves` as reported (may differ from
    /// `replicas.len()` when `slaveN` lines are hidden, as with Dragonfly's
    /// `--managed_service_info`).
    pub connected_replicas: Option<u32>,
    /// Master: the replicas it lists.
    pub replicas: Vec<ReplicaEntry>,
    /// `master_replid`.
    pub replid: Option<String>,
    /// `master_replid2` (Redis/Valkey): the history this server continues,
    /// e.g. the one it loaded from its RDB file at a restart; None when
    /// all zeros (none) or absent.
    pub replid2: Option<String>,
    /// `loading:1` (INFO persistence).
    pub loading: bool,
    /// `uptime_in_seconds` (every flavour): a restart shows as a smaller
    /// value than the last one plus the time in between.
    pub uptime_secs: Option<u64>,
    /// The keys of every database (`# Keyspace`, `dbN:keys=K,...`); 0 when
    /// the section is there and empty, None when it was not read.
    pub keys: Option<u64>,
}

impl Default for InfoSnapshot {
    /// Everything unknown; `replica_announced` is true because servers that
    /// do not report it (Dragonfly, Redis before 6.2) always announce.
    fn default() -> Self {
        Self {
            flavour: Flavour::default(),
            version: None,
            run_id: None,
            role: Role::default(),
            master_host: None,
            master_port: None,
            master_link_up: false,
            master_link_down_since_secs: None,
            master_link_never_up: false,
            master_last_io_secs: None,
            sync_in_progress: false,
            replica_offset: None,
            priority: None,
            replica_announced: true,
            master_offset: None,
            connected_replicas: None,
            replicas: Vec::new(),
            replid: None,
            replid2: None,
            loading: false,
            uptime_secs: None,
            keys: None,
        }
    }
}

/// What only a full `INFO` tells: the server and persistence sections.
/// An `INFO replication` read is completed with the last full read's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerFields {
    /// Detected flavour.
    pub flavour: Flavour,
    /// The version as reported.
    pub version: Option<String>,
    /// `run_id`.
    pub run_id: Option<String>,
    /// `loading:1`.
    pub loading: bool,
    /// `uptime_in_seconds` at the full read.
    pub uptime_secs: Option<u64>,
    /// The keys at the full read.
    pub keys: Option<u64>,
}

impl InfoSnapshot {
    /// The fields of the server and persistence sections.
    pub fn server_fields(&self) -> ServerFields {
        ServerFields {
            flavour: self.flavour,
            version: self.version.clone(),
            run_id: self.run_id.clone(),
            loading: self.loading,
            uptime_secs: self.uptime_secs,
            keys: self.keys,
        }
    }

    /// This snapshot (of `INFO replication` alone) with the server and
    /// persistence fields of an earlier full read.
    pub fn with_server_fields(mut self, f: &ServerFields) -> InfoSnapshot {
        self.flavour = f.flavour;
        self.version = f.version.clone();
        self.run_id = f.run_id.clone();
        self.loading = f.loading;
        self.uptime_secs = f.uptime_secs;
        self.keys = f.keys;
        self
    }
}

/// Errors from [`parse_role`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InfoError {
    /// The server answered `ROLE` with an error reply (e.g. `-NOAUTH`).
    #[error("server replied with an error: {0}")]
    ErrorReply(String),
    /// The reply is not a non-empty array.
    #[error("ROLE reply is not a non-empty array")]
    NotAnArray,
    /// The first element names a role picket does not know.
    #[error("unknown role {0:?} in ROLE reply")]
    UnknownRole(String),
    /// The reply has a known role but a shape no supported server sends.
    #[error("malformed ROLE reply for role {role}: {reason}")]
    Malformed {
        /// The role named by the first element.
        role: &'static str,
        /// What was wrong.
        reason: String,
    },
}

/// One replica listed by a master's `ROLE` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RoleReplica {
    /// Replica IP as the master sees it (or as announced).
    pub ip: String,
    /// Replica listening port.
    pub port: u16,
    /// Last acknowledged offset (Redis/Valkey); `None` on Dragonfly.
    pub offset: Option<i64>,
    /// Replication state (Dragonfly: `online`, `stable_sync`, `full_sync`,
    /// ...); `None` on Redis/Valkey, which list only online replicas.
    pub state: Option<String>,
}

/// A decoded `ROLE` reply.
///
/// Redis/Valkey and Dragonfly send different shapes (see
/// `shared/reference/dragonfly.md` §4.2); both decode to this type, with the
/// fields a server does not send left as `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum RoleReply {
    /// `master`.
    Master {
        /// The master replication offset (Redis/Valkey only).
        offset: Option<i64>,
        /// The replicas it lists.
        replicas: Vec<RoleReplica>,
    },
    /// `slave` (or Dragonfly's older `replica`).
    Replica {
        /// The master it replicates from, as given to `REPLICAOF`.
        master_host: String,
        /// The master's port.
        master_port: u16,
        /// Link state: Redis `connect`/`connecting`/`sync`/`connected`/
        /// `handshake`; Dragonfly `online`/`stable_sync`/`full_sync`/...
        state: String,
        /// Processed offset (Redis/Valkey); `None` on Dragonfly and when
        /// Redis reports `-1` (no link to the master yet).
        offset: Option<i64>,
    },
    /// `sentinel`.
    Sentinel {
        /// Names of the masters it monitors.
        masters: Vec<String>,
    },
}

/// The INFO sections with no field picket reads (Redis, Valkey and
/// Dragonfly names); `server`, `replication`, `persistence` and `keyspace`
/// (a line per database: what a restarted server still holds) are read.
fn is_unread_section(name: &str) -> bool {
    const UNREAD: &[&str] = &[
        "clients",
        "memory",
        "stats",
        "cpu",
        "modules",
        "errorstats",
        "commandstats",
        "latencystats",
        "cluster",
    ];
    UNREAD.iter().any(|u| name.eq_ignore_ascii_case(u))
}

/// Parse the text of `INFO` (any subset of sections; unknown and malformed
/// lines are ignored, so the result holds only what could be read).
///
/// The flavour and version come from `INFO server`: text without that
/// section parses as [`Flavour::Redis`] with no version, so probes that care
/// must ask for `server` along with `replication` and `persistence`.
pub fn parse_info(text: &str) -> InfoSnapshot {
    let mut snap = InfoSnapshot::default();
    let mut redis_version = None;
    let mut valkey_version = None;
    let mut dragonfly_version = None;
    let mut server_name_valkey = false;

    // Sections that hold nothing picket reads are skipped unsplit: Memory,
    // Stats, CPU and the per-command statistics are most of a reply, and
    // INFO is read from every master every second. A section not named
    // here (or a reply without headers) is read.
    let mut skipping = false;
    // `str::lines` also strips the `\r` of CRLF line ends.
    for line in text.lines() {
        if let Some(header) = line.strip_prefix('#') {
            let header = header.trim();
            skipping = is_unread_section(header);
            if header.eq_ignore_ascii_case("keyspace") {
                // An empty keyspace section is an empty server.
                snap.keys.get_or_insert(0);
            }
            continue;
        }
        if skipping {
            continue;
        }
        let line = line.trim();
        // Every key read below starts with one of these: the other lines
        // of the sections that are read are passed over unsplit.
        if !matches!(
            line.as_bytes().first(),
            Some(b'r' | b'v' | b'd' | b's' | b'm' | b'c' | b'l' | b'u')
        ) {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "redis_version" => redis_version = Some(value.to_owned()),
            "valkey_version" => valkey_version = Some(value.to_owned()),
            "dragonfly_version" => dragonfly_version = Some(value.to_owned()),
            "server_name" => server_name_valkey = value.eq_ignore_ascii_case("valkey"),
            "run_id" if !value.is_empty() => snap.run_id = Some(value.to_owned()),
            "role" => snap.role = parse_role_name(value),
            "master_host" => snap.master_host = Some(value.to_owned()),
            "master_port" => snap.master_port = value.parse().ok(),
            "master_link_status" => snap.master_link_up = value == "up",
            "master_link_down_since_seconds" => {
                let secs = value.parse::<i64>().ok();
                snap.master_link_never_up = secs == Some(-1);
                snap.master_link_down_since_secs = secs.and_then(|s| u64::try_from(s).ok());
            }
            "master_last_io_seconds_ago" => snap.master_last_io_secs = value.parse().ok(),
            "master_sync_in_progress" => snap.sync_in_progress = value == "1",
            "slave_repl_offset" => snap.replica_offset = value.parse().ok(),
            "slave_priority" | "replica_priority" => snap.priority = value.parse().ok(),
            "replica_announced" => snap.replica_announced = value != "0",
            "master_repl_offset" => snap.master_offset = value.parse().ok(),
            "connected_slaves" => snap.connected_replicas = value.parse().ok(),
            "master_replid" if !value.is_empty() => snap.replid = Some(value.to_owned()),
            "master_replid2" if value.bytes().any(|b| b != b'0') => {
                snap.replid2 = Some(value.to_owned())
            }
            "loading" => snap.loading = value == "1",
            "uptime_in_seconds" => snap.uptime_secs = value.parse().ok(),
            _ if is_db_key(key) => {
                let keys = db_keys(value);
                snap.keys = Some(snap.keys.unwrap_or(0) + keys);
            }
            _ if is_replica_line_key(key) => {
                if let Some(entry) = parse_replica_entry(value) {
                    snap.replicas.push(entry);
                }
            }
            _ => {}
        }
    }

    // Dragonfly and Valkey both also send `redis_version` as a compatibility
    // constant, so the flavour comes from their own keys first.
    (snap.flavour, snap.version) = if let Some(v) = dragonfly_version {
        (Flavour::Dragonfly, Some(v))
    } else if valkey_version.is_some() || server_name_valkey {
        // Early Valkey 7.2 builds have `server_name:valkey` without
        // `valkey_version`; their `redis_version` is then their version.
        (Flavour::Valkey, valkey_version.or(redis_version))
    } else {
        (Flavour::Redis, redis_version)
    };
    snap
}

fn parse_role_name(value: &str) -> Role {
    match value {
        "master" => Role::Master,
        "slave" | "replica" => Role::Replica,
        _ => Role::Unknown,
    }
}

/// `db0`, `db1`, ...: a line of `# Keyspace`.
fn is_db_key(key: &str) -> bool {
    key.strip_prefix("db")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The `keys=` of a keyspace line (`keys=3,expires=0,avg_ttl=0`).
fn db_keys(value: &str) -> u64 {
    value
        .split(',')
        .find_map(|f| f.trim().strip_prefix("keys="))
        .and_then(|k| k.parse().ok())
        .unwrap_or(0)
}

/// `slave0`, `slave1`, ... but not `slave_repl_offset` and friends.
fn is_replica_line_key(key: &str) -> bool {
    key.strip_prefix("slave")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// One `slaveN:` value, in the `ip=..,port=..,state=..[,offset=..][,lag=..]`
/// form (Redis ≥ 2.8, Valkey, Dragonfly) or the `<ip>,<port>,<state>` form of
/// Redis 2.6. Entries without a usable ip and port are dropped.
fn parse_replica_entry(value: &str) -> Option<ReplicaEntry> {
    if value.contains('=') {
        let (mut ip, mut port, mut state, mut offset, mut lag) = (None, None, None, None, None);
        for field in value.split(',') {
            let Some((k, v)) = field.split_once('=') else {
                continue;
            };
            let v = v.trim();
            match k.trim() {
                "ip" => ip = Some(v),
                "port" => port = v.parse::<u16>().ok(),
                "state" => state = Some(v),
                "offset" => offset = v.parse::<i64>().ok(),
                "lag" => lag = v.parse::<i64>().ok(),
                _ => {}
            }
        }
        let ip = ip.filter(|ip| !ip.is_empty())?;
        Some(ReplicaEntry {
            ip: ip.to_owned(),
            port: port?,
            state: state.unwrap_or_default().to_owned(),
            offset,
            lag,
        })
    } else {
        let mut parts = value.split(',').map(str::trim);
        let ip = parts.next().filter(|ip| !ip.is_empty())?;
        let port = parts.next()?.parse::<u16>().ok()?;
        let state = parts.next().unwrap_or_default();
        Some(ReplicaEntry {
            ip: ip.to_owned(),
            port,
            state: state.to_owned(),
            offset: None,
            lag: None,
        })
    }
}

/// Decode a `ROLE` reply from Redis, Valkey or Dragonfly.
///
/// Shapes accepted (§4.2 of the Dragonfly reference):
/// - Redis/Valkey master: `["master", offset:int, [[ip, port, offset], ...]]`
/// - Dragonfly master: `["master", [[ip, port, state], ...]]`
/// - Redis/Valkey replica: `["slave", host, port:int, state, offset:int]`
/// - Dragonfly replica: `["slave" | "replica", host, port-as-bulk, state]`
/// - Sentinel: `["sentinel", [name, ...]]`
///
/// Numbers are accepted both as integers and as decimal strings, since the
/// servers disagree on which they send where.
pub fn parse_role(frame: &BytesFrame) -> Result<RoleReply, InfoError> {
    let items = match frame {
        BytesFrame::Array(items) if !items.is_empty() => items,
        BytesFrame::Error(e) => return Err(InfoError::ErrorReply(e.to_string())),
        _ => return Err(InfoError::NotAnArray),
    };
    let name = frame_str(&items[0]).ok_or(InfoError::NotAnArray)?;
    match name.to_ascii_lowercase().as_str() {
        "master" => parse_role_master(items),
        "slave" | "replica" => parse_role_replica(items),
        "sentinel" => parse_role_sentinel(items),
        _ => Err(InfoError::UnknownRole(name.to_owned())),
    }
}

fn malformed(role: &'static str, reason: impl Into<String>) -> InfoError {
    InfoError::Malformed {
        role,
        reason: reason.into(),
    }
}

fn parse_role_master(items: &[BytesFrame]) -> Result<RoleReply, InfoError> {
    // The replica list is the last element in both shapes; a Redis-shaped
    // reply puts the master offset before it, and then the third field of
    // each replica is its offset rather than a state.
    let (offset, list, redis_shape) = match items {
        [_, offset, BytesFrame::Array(list)] => {
            let offset =
                frame_int(offset).ok_or_else(|| malformed("master", "offset is not an integer"))?;
            (Some(offset), list, true)
        }
        [_, BytesFrame::Array(list)] => (None, list, false),
        _ => {
            return Err(malformed(
                "master",
                format!(
                    "expected 2 or 3 elements ending in an array, got {}",
                    items.len()
                ),
            ));
        }
    };
    let mut replicas = Vec::with_capacity(list.len());
    for entry in list {
        let BytesFrame::Array(fields) = entry else {
            return Err(malformed("master", "replica entry is not an array"));
        };
        let [ip, port, third, ..] = fields.as_slice() else {
            return Err(malformed("master", "replica entry has fewer than 3 fields"));
        };
        let ip = frame_str(ip).ok_or_else(|| malformed("master", "replica ip is not a string"))?;
        let port =
            frame_port(port).ok_or_else(|| malformed("master", "replica port is invalid"))?;
        let (offset, state) = if redis_shape {
            let off = frame_int(third)
                .ok_or_else(|| malformed("master", "replica offset is not a number"))?;
            (Some(off), None)
        } else {
            let state = frame_str(third)
                .ok_or_else(|| malformed("master", "replica state is not a string"))?;
            (None, Some(state.to_owned()))
        };
        replicas.push(RoleReplica {
            ip: ip.to_owned(),
            port,
            offset,
            state,
        });
    }
    Ok(RoleReply::Master { offset, replicas })
}

fn parse_role_replica(items: &[BytesFrame]) -> Result<RoleReply, InfoError> {
    let (host, port, state, offset) = match items {
        [_, host, port, state, offset] => {
            let offset =
                frame_int(offset).ok_or_else(|| malformed("slave", "offset is not an integer"))?;
            // Redis sends -1 while it has no link to the master: unknown.
            (host, port, state, (offset >= 0).then_some(offset))
        }
        [_, host, port, state] => (host, port, state, None),
        _ => {
            return Err(malformed(
                "slave",
                format!("expected 4 or 5 elements, got {}", items.len()),
            ));
        }
    };
    let master_host = frame_str(host).ok_or_else(|| malformed("slave", "host is not a string"))?;
    let master_port = frame_port(port).ok_or_else(|| malformed("slave", "port is invalid"))?;
    let state = frame_str(state).ok_or_else(|| malformed("slave", "state is not a string"))?;
    Ok(RoleReply::Replica {
        master_host: master_host.to_owned(),
        master_port,
        state: state.to_owned(),
        offset,
    })
}

fn parse_role_sentinel(items: &[BytesFrame]) -> Result<RoleReply, InfoError> {
    let [_, BytesFrame::Array(names)] = items else {
        return Err(malformed("sentinel", "expected [\"sentinel\", [names]]"));
    };
    let masters = names
        .iter()
        .map(|n| frame_str(n).map(str::to_owned))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| malformed("sentinel", "master name is not a string"))?;
    Ok(RoleReply::Sentinel { masters })
}

/// A simple or bulk string that is valid UTF-8.
fn frame_str(frame: &BytesFrame) -> Option<&str> {
    match frame {
        BytesFrame::SimpleString(b) | BytesFrame::BulkString(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

/// An integer, or a string holding a decimal integer.
fn frame_int(frame: &BytesFrame) -> Option<i64> {
    match frame {
        BytesFrame::Integer(i) => Some(*i),
        other => frame_str(other)?.trim().parse().ok(),
    }
}

fn frame_port(frame: &BytesFrame) -> Option<u16> {
    frame_int(frame).and_then(|p| u16::try_from(p).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use redis_protocol::resp2::decode::decode_bytes_mut;

    // Captured from redis-server 7.0.15 (INFO server, persistence,
    // replication): a master with two replicas (announced as 127.0.0.3/.4),
    // one replica, and the same replica 2 s after the master was SIGKILLed.
    const REDIS7_MASTER: &str = include_str!("testdata/redis7_master.txt");
    const REDIS7_REPLICA: &str = include_str!("testdata/redis7_replica.txt");
    const REDIS7_REPLICA_LINK_DOWN: &str = include_str!("testdata/redis7_replica_link_down.txt");
    // Hand-written from Valkey's documented INFO format (no Valkey server
    // was available to capture from).
    const VALKEY8_MASTER: &str = include_str!("testdata/valkey8_master.txt");
    const VALKEY8_REPLICA: &str = include_str!("testdata/valkey8_replica.txt");
    // Verbatim from the appendix of shared/reference/dragonfly.md.
    const DF_SERVER: &str = include_str!("testdata/dragonfly_server.txt");
    const DF_MASTER_REPL: &str = include_str!("testdata/dragonfly_master_replication.txt");
    const DF_REPLICA_REPL: &str = include_str!("testdata/dragonfly_replica_replication.txt");

    fn joined(parts: &[&str]) -> String {
        parts.join("\n")
    }

    fn decode(raw: &[u8]) -> BytesFrame {
        let mut buf = BytesMut::from(raw);
        let (frame, used, _) = decode_bytes_mut(&mut buf).unwrap().unwrap();
        assert_eq!(used, raw.len(), "test input must be exactly one frame");
        frame
    }

    /// The replication section of a full reply, as `INFO replication`
    /// returns it.
    fn replication_section(full: &str) -> String {
        let start = full.find("# Replication").expect("a replication section");
        let rest = &full[start..];
        let end = rest[1..].find("\n#").map_or(rest.len(), |i| i + 1);
        rest[..end].to_string()
    }

    #[test]
    fn a_replication_read_completed_with_the_last_full_one_equals_a_full_read() {
        for full in [
            REDIS7_MASTER,
            VALKEY8_MASTER,
            &joined(&[DF_SERVER, DF_MASTER_REPL]),
        ] {
            let whole = parse_info(full);
            let light = parse_info(&replication_section(full));
            // Alone, the section knows nothing of the server.
            assert_eq!(light.run_id, None);
            assert_eq!(light.version, None);
            assert_eq!(light.with_server_fields(&whole.server_fields()), whole);
        }
    }

    #[test]
    fn redis7_master_with_two_replicas() {
        let s = parse_info(REDIS7_MASTER);
        assert_eq!(s.flavour, Flavour::Redis);
        assert_eq!(s.version.as_deref(), Some("7.0.15"));
        assert_eq!(
            s.run_id.as_deref(),
            Some("6eb69bb9a33ad9ecf67558187bbfc0230b0df9c3")
        );
        assert_eq!(s.role, Role::Master);
        assert_eq!(s.connected_replicas, Some(2));
        assert_eq!(
            s.replicas,
            vec![
                ReplicaEntry {
                    ip: "127.0.0.4".into(),
                    port: 7380,
                    state: "online".into(),
                    offset: Some(104),
                    lag: Some(1),
                },
                ReplicaEntry {
                    ip: "127.0.0.3".into(),
                    port: 7380,
                    state: "online".into(),
                    offset: Some(104),
                    lag: Some(1),
                },
            ]
        );
        assert_eq!(s.master_offset, Some(104));
        assert_eq!(
            s.replid.as_deref(),
            Some("7a750eab7bf8c53558539eeccf9e208bfec638af")
        );
        assert!(!s.loading);
        // Replica-only fields stay unknown on a master.
        assert_eq!(s.replica_offset, None);
        assert_eq!(s.master_host, None);
        assert_eq!(s.priority, None);
        assert!(!s.master_link_up);
    }

    #[test]
    fn redis7_replica() {
        let s = parse_info(REDIS7_REPLICA);
        assert_eq!(s.flavour, Flavour::Redis);
        assert_eq!(s.version.as_deref(), Some("7.0.15"));
        assert!(s.run_id.is_some());
        assert_eq!(s.role, Role::Replica);
        assert_eq!(s.master_host.as_deref(), Some("127.0.0.2"));
        assert_eq!(s.master_port, Some(7380));
        assert!(s.master_link_up);
        assert_eq!(s.master_link_down_since_secs, None);
        assert!(!s.master_link_never_up);
        assert_eq!(s.master_last_io_secs, Some(1));
        assert!(!s.sync_in_progress);
        assert_eq!(s.replica_offset, Some(104));
        assert_eq!(s.priority, Some(100));
        assert!(s.replica_announced);
        assert_eq!(s.connected_replicas, Some(0));
        assert!(s.replicas.is_empty());
        assert_eq!(s.master_offset, Some(104));
        assert_eq!(
            s.replid.as_deref(),
            Some("7a750eab7bf8c53558539eeccf9e208bfec638af")
        );
        assert!(!s.loading);
    }

    #[test]
    fn redis7_replica_with_link_down() {
        let s = parse_info(REDIS7_REPLICA_LINK_DOWN);
        assert_eq!(s.role, Role::Replica);
        assert!(!s.master_link_up);
        assert_eq!(s.master_link_down_since_secs, Some(2));
        assert!(!s.master_link_never_up);
        assert_eq!(s.master_last_io_secs, Some(-1));
        // The offset survives the link loss: it is what it last processed.
        assert_eq!(s.replica_offset, Some(104));
    }

    #[test]
    fn link_never_up_is_not_a_duration() {
        let s = parse_info(
            "role:slave\nmaster_host:10.0.0.1\nmaster_port:6379\n\
             master_link_status:down\nmaster_last_io_seconds_ago:-1\n\
             master_sync_in_progress:0\nmaster_link_down_since_seconds:-1\n",
        );
        assert!(!s.master_link_up);
        assert_eq!(s.master_link_down_since_secs, None);
        assert!(s.master_link_never_up);
    }

    #[test]
    fn valkey8_master() {
        let s = parse_info(VALKEY8_MASTER);
        assert_eq!(s.flavour, Flavour::Valkey);
        assert_eq!(s.version.as_deref(), Some("8.0.2"));
        assert_eq!(
            s.run_id.as_deref(),
            Some("0f3c8a1e5b9d47c2a6e1f08b7d3c5a9e2b4f6d81")
        );
        assert_eq!(s.role, Role::Master);
        assert_eq!(s.master_offset, Some(987654));
        assert_eq!(s.replicas.len(), 2);
        assert_eq!(s.replicas[0].ip, "10.1.0.6");
        assert_eq!(s.replicas[0].offset, Some(987654));
        assert_eq!(s.replicas[1].state, "wait_bgsave");
        // A reported 0 is a real 0, distinct from "absent".
        assert_eq!(s.replicas[1].offset, Some(0));
        assert_eq!(s.replicas[1].lag, Some(1));
    }

    #[test]
    fn valkey8_replica() {
        let s = parse_info(VALKEY8_REPLICA);
        assert_eq!(s.flavour, Flavour::Valkey);
        assert_eq!(s.version.as_deref(), Some("8.0.2"));
        assert_eq!(s.role, Role::Replica);
        assert_eq!(s.master_host.as_deref(), Some("10.1.0.5"));
        assert_eq!(s.master_port, Some(6379));
        assert!(s.master_link_up);
        assert_eq!(s.replica_offset, Some(987600));
        assert_eq!(s.master_offset, Some(987654));
        assert_eq!(s.priority, Some(100));
        assert!(s.replica_announced);
    }

    #[test]
    fn valkey_by_server_name_alone_takes_redis_version() {
        let s = parse_info("# Server\nredis_version:7.2.4\nserver_name:valkey\n");
        assert_eq!(s.flavour, Flavour::Valkey);
        assert_eq!(s.version.as_deref(), Some("7.2.4"));
    }

    #[test]
    fn dragonfly_master() {
        let s = parse_info(&joined(&[DF_SERVER, DF_MASTER_REPL]));
        assert_eq!(s.flavour, Flavour::Dragonfly);
        assert_eq!(s.version.as_deref(), Some("df-dev"));
        assert_eq!(s.run_id, None);
        assert_eq!(s.role, Role::Master);
        assert_eq!(s.connected_replicas, Some(1));
        assert_eq!(
            s.replicas,
            vec![ReplicaEntry {
                ip: "127.0.0.1".into(),
                port: 16380,
                state: "online".into(),
                offset: None,
                lag: Some(0),
            }]
        );
        assert_eq!(s.master_offset, None);
        assert_eq!(
            s.replid.as_deref(),
            Some("ed918f2a2b27a2374075d22a8f4bd916dd44fbff")
        );
    }

    #[test]
    fn dragonfly_replica() {
        let s = parse_info(&joined(&[DF_SERVER, DF_REPLICA_REPL]));
        assert_eq!(s.flavour, Flavour::Dragonfly);
        assert_eq!(s.run_id, None);
        assert_eq!(s.role, Role::Replica);
        assert_eq!(s.master_host.as_deref(), Some("127.0.0.1"));
        assert_eq!(s.master_port, Some(16379));
        assert!(s.master_link_up);
        assert_eq!(s.master_last_io_secs, Some(0));
        assert!(!s.sync_in_progress);
        assert_eq!(s.replica_offset, Some(5));
        assert_eq!(s.priority, Some(100));
        // Dragonfly reports neither of these.
        assert_eq!(s.master_link_down_since_secs, None);
        assert!(s.replica_announced);
        assert_eq!(s.master_offset, None);
        assert_eq!(
            s.replid.as_deref(),
            Some("ed918f2a2b27a2374075d22a8f4bd916dd44fbff")
        );
    }

    #[test]
    fn flavour_needs_the_server_section() {
        // `INFO replication` alone carries no version key: the flavour is the
        // default and the version unknown, so callers must ask for `server`.
        let s = parse_info(DF_REPLICA_REPL);
        assert_eq!(s.flavour, Flavour::Redis);
        assert_eq!(s.version, None);
        assert_eq!(s.replica_offset, Some(5));
        // And `INFO server` alone is enough to tell Dragonfly from Redis
        // although it also sends `redis_version`.
        assert_eq!(parse_info(DF_SERVER).flavour, Flavour::Dragonfly);
    }

    #[test]
    fn replica_while_loading() {
        let text = "# Persistence\r\nloading:1\r\nasync_loading:0\r\n\
            loading_start_time:1796094000\r\nloading_total_bytes:104857600\r\n\
            loading_loaded_perc:37.50\r\nloading_eta_seconds:3\r\n\r\n\
            # Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6379\r\n\
            master_link_status:down\r\nmaster_last_io_seconds_ago:-1\r\n\
            master_sync_in_progress:1\r\nmaster_sync_total_bytes:104857600\r\n\
            master_sync_read_bytes:104857600\r\nmaster_sync_left_bytes:0\r\n\
            master_sync_perc:100.00\r\nmaster_sync_last_io_seconds_ago:0\r\n\
            master_link_down_since_seconds:-1\r\nslave_priority:100\r\n";
        let s = parse_info(text);
        assert!(s.loading);
        assert!(s.sync_in_progress);
        assert!(!s.master_link_up);
        assert!(s.master_link_never_up);
        assert_eq!(s.replica_offset, None);
        assert_eq!(s.role, Role::Replica);
    }

    #[test]
    fn missing_offset_is_unknown_not_zero() {
        let without: String = DF_REPLICA_REPL
            .lines()
            .filter(|l| !l.starts_with("slave_repl_offset"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(parse_info(&without).replica_offset, None);
        assert_eq!(parse_info(DF_REPLICA_REPL).replica_offset, Some(5));
        assert_eq!(parse_info("slave_repl_offset:0").replica_offset, Some(0));
        assert_eq!(parse_info("slave_repl_offset:").replica_offset, None);
        assert_eq!(parse_info("slave_repl_offset:abc").replica_offset, None);
        assert_eq!(InfoSnapshot::default().replica_offset, None);
    }

    #[test]
    fn sections_without_fields_picket_reads_are_skipped_and_the_rest_read() {
        let text = "# Server\r\nredis_version:7.2.4\r\n# Memory\r\nrole:slave\r\nused_memory:1\r\n\
                    # Replication\r\nrole:master\r\nconnected_slaves:0\r\n# Stats\r\nloading:1\r\n\
                    # Persistence\r\nloading:0\r\n# Cluster\r\nmaster_replid:nope\r\n\
                    # Keyspace\r\ndb0:keys=3,expires=0,avg_ttl=0\r\ndb2:keys=4,expires=1,avg_ttl=9\r\n";
        let i = parse_info(text);
        // Every database's keys, summed: what a restarted server holds.
        assert_eq!(i.keys, Some(7));
        assert_eq!(parse_info("# Keyspace\r\n").keys, Some(0));
        assert_eq!(parse_info("# Replication\r\nrole:master\r\n").keys, None);
        assert_eq!(i.role, Role::Master);
        assert_eq!(i.version.as_deref(), Some("7.2.4"));
        assert_eq!(i.connected_replicas, Some(0));
        assert!(!i.loading);
        assert_eq!(i.replid, None);
        // Without headers everything is read.
        assert_eq!(parse_info("role:slave\nloading:1\n").role, Role::Replica);
        assert!(parse_info("role:slave\nloading:1\n").loading);
    }

    #[test]
    fn crlf_and_lf_parse_the_same() {
        for text in [
            REDIS7_MASTER,
            REDIS7_REPLICA,
            VALKEY8_MASTER,
            VALKEY8_REPLICA,
            DF_MASTER_REPL,
            DF_REPLICA_REPL,
        ] {
            let crlf = text.replace('\n', "\r\n");
            assert!(crlf.contains("\r\n"));
            let lf = parse_info(text);
            assert_eq!(parse_info(&crlf), lf);
            assert_ne!(lf, InfoSnapshot::default(), "fixture parsed to nothing");
        }
    }

    #[test]
    fn other_spellings() {
        let s = parse_info(
            "role:replica\nreplica_priority:0\nreplica_announced:0\n\
             master_host:db-0.db.svc\nmaster_port:9999\n",
        );
        assert_eq!(s.role, Role::Replica);
        assert_eq!(s.priority, Some(0));
        assert!(!s.replica_announced);
        assert_eq!(s.master_host.as_deref(), Some("db-0.db.svc"));
        assert_eq!(s.master_port, Some(9999));
        assert_eq!(parse_info("role:sentinel").role, Role::Unknown);
        assert_eq!(parse_info("").role, Role::Unknown);
    }

    #[test]
    fn old_style_replica_lines() {
        let s =
            parse_info("role:master\nslave0:10.0.0.2,6379,online\nslave1:::1,6380,wait_bgsave\n");
        assert_eq!(
            s.replicas,
            vec![
                ReplicaEntry {
                    ip: "10.0.0.2".into(),
                    port: 6379,
                    state: "online".into(),
                    offset: None,
                    lag: None,
                },
                ReplicaEntry {
                    ip: "::1".into(),
                    port: 6380,
                    state: "wait_bgsave".into(),
                    offset: None,
                    lag: None,
                },
            ]
        );
    }

    #[test]
    fn bad_replica_lines_are_dropped_good_ones_kept() {
        let s = parse_info(
            "role:master\n\
             slave0:ip=10.0.0.2,port=99999,state=online,offset=1,lag=0\n\
             slave1:port=6379,state=online\n\
             slave2:ip=,port=6379\n\
             slave3:garbage\n\
             slave4:ip=10.0.0.3,port=6379,state=online,offset=x,lag=y,extra\n\
             slavex:ip=10.0.0.9,port=1\n\
             slave_read_only:1\n",
        );
        assert_eq!(
            s.replicas,
            vec![ReplicaEntry {
                ip: "10.0.0.3".into(),
                port: 6379,
                state: "online".into(),
                offset: None,
                lag: None,
            }]
        );
    }

    #[test]
    fn garbage_never_panics() {
        let samples = [
            "",
            "\n\n\r\n",
            ":",
            "::::",
            "role",
            "# Replication",
            "role:",
            "master_port:-1\nmaster_port:70000\nmaster_port:1e3",
            "slave0:",
            "slave0:,,,",
            "slave0:=,=,=",
            "slave99999999999999999999:ip=a,port=1",
            "loading:yes\nconnected_slaves:-4",
            "\u{0}\u{1}\u{ff}é:ü\r\r\r",
            "master_link_down_since_seconds:99999999999999999999999",
        ];
        for text in samples {
            let _ = parse_info(text);
        }
        // Every truncation of every fixture (as a dropped connection would
        // leave it) parses without panicking.
        for text in [
            REDIS7_MASTER,
            VALKEY8_MASTER,
            DF_MASTER_REPL,
            DF_REPLICA_REPL,
        ] {
            for (i, _) in text.char_indices() {
                let _ = parse_info(&text[..i]);
            }
        }
        // Deterministic pseudo-random soup of INFO-ish tokens.
        let tokens = [
            "slave0", ":", "=", ",", "ip", "port", "\r\n", "\n", "#", "role", "master", "slave",
            "12", "-1", "offset", "lag", "state", "é", " ", "loading", "1",
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let mut text = String::new();
            for _ in 0..40 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push_str(tokens[(x % tokens.len() as u64) as usize]);
            }
            let _ = parse_info(&text);
        }
    }

    // ROLE, on the raw replies of the Dragonfly appendix.

    #[test]
    fn role_dragonfly_master_with_replica() {
        let f = decode(
            b"*2\r\n$6\r\nmaster\r\n*1\r\n*3\r\n$9\r\n127.0.0.1\r\n$5\r\n16380\r\n$6\r\nonline\r\n",
        );
        assert_eq!(
            parse_role(&f).unwrap(),
            RoleReply::Master {
                offset: None,
                replicas: vec![RoleReplica {
                    ip: "127.0.0.1".into(),
                    port: 16380,
                    offset: None,
                    state: Some("online".into()),
                }],
            }
        );
    }

    #[test]
    fn role_dragonfly_master_without_replicas() {
        let f = decode(b"*2\r\n$6\r\nmaster\r\n*0\r\n");
        assert_eq!(
            parse_role(&f).unwrap(),
            RoleReply::Master {
                offset: None,
                replicas: vec![],
            }
        );
    }

    #[test]
    fn role_dragonfly_replica() {
        let f = decode(b"*4\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n$5\r\n16379\r\n$6\r\nonline\r\n");
        assert_eq!(
            parse_role(&f).unwrap(),
            RoleReply::Replica {
                master_host: "127.0.0.1".into(),
                master_port: 16379,
                state: "online".into(),
                offset: None,
            }
        );
        let old = decode(b"*4\r\n$7\r\nreplica\r\n$4\r\nhost\r\n$4\r\n9999\r\n$9\r\nfull_sync\r\n");
        assert!(matches!(
            parse_role(&old).unwrap(),
            RoleReply::Replica { master_port: 9999, ref state, .. } if state == "full_sync"
        ));
    }

    // ROLE, on replies captured from redis-server 7.0.15.

    #[test]
    fn role_redis_master() {
        let f = decode(
            b"*3\r\n$6\r\nmaster\r\n:104\r\n*2\r\n\
              *3\r\n$9\r\n127.0.0.4\r\n$4\r\n7380\r\n$3\r\n104\r\n\
              *3\r\n$9\r\n127.0.0.3\r\n$4\r\n7380\r\n$3\r\n104\r\n",
        );
        assert_eq!(
            parse_role(&f).unwrap(),
            RoleReply::Master {
                offset: Some(104),
                replicas: vec![
                    RoleReplica {
                        ip: "127.0.0.4".into(),
                        port: 7380,
                        offset: Some(104),
                        state: None,
                    },
                    RoleReplica {
                        ip: "127.0.0.3".into(),
                        port: 7380,
                        offset: Some(104),
                        state: None,
                    },
                ],
            }
        );
        let alone = decode(b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n");
        assert_eq!(
            parse_role(&alone).unwrap(),
            RoleReply::Master {
                offset: Some(0),
                replicas: vec![],
            }
        );
    }

    #[test]
    fn role_redis_replica() {
        let f =
            decode(b"*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.2\r\n:7380\r\n$9\r\nconnected\r\n:104\r\n");
        assert_eq!(
            parse_role(&f).unwrap(),
            RoleReply::Replica {
                master_host: "127.0.0.2".into(),
                master_port: 7380,
                state: "connected".into(),
                offset: Some(104),
            }
        );
        // With the master gone Redis reports offset -1: unknown, not -1.
        let down =
            decode(b"*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.2\r\n:7380\r\n$7\r\nconnect\r\n:-1\r\n");
        assert_eq!(
            parse_role(&down).unwrap(),
            RoleReply::Replica {
                master_host: "127.0.0.2".into(),
                master_port: 7380,
                state: "connect".into(),
                offset: None,
            }
        );
    }

    #[test]
    fn role_sentinel() {
        let f = decode(b"*2\r\n$8\r\nsentinel\r\n*2\r\n$6\r\nmymain\r\n$5\r\ncache\r\n");
        assert_eq!(
            parse_role(&f).unwrap(),
            RoleReply::Sentinel {
                masters: vec!["mymain".into(), "cache".into()],
            }
        );
    }

    #[test]
    fn role_errors() {
        let err = |raw: &[u8]| parse_role(&decode(raw)).unwrap_err();
        assert_eq!(
            err(b"-NOAUTH Authentication required.\r\n"),
            InfoError::ErrorReply("NOAUTH Authentication required.".into())
        );
        assert_eq!(err(b"+OK\r\n"), InfoError::NotAnArray);
        assert_eq!(err(b"*0\r\n"), InfoError::NotAnArray);
        assert_eq!(err(b"*1\r\n:1\r\n"), InfoError::NotAnArray);
        assert_eq!(
            err(b"*1\r\n$7\r\nunknown\r\n"),
            InfoError::UnknownRole("unknown".into())
        );
        let malformed = [
            &b"*1\r\n$6\r\nmaster\r\n"[..],
            b"*3\r\n$6\r\nmaster\r\n$1\r\nx\r\n*0\r\n",
            b"*2\r\n$6\r\nmaster\r\n*1\r\n:1\r\n",
            b"*2\r\n$6\r\nmaster\r\n*1\r\n*2\r\n$1\r\na\r\n$1\r\n1\r\n",
            b"*3\r\n$6\r\nmaster\r\n:5\r\n*1\r\n*3\r\n$1\r\na\r\n$1\r\n1\r\n$6\r\nonline\r\n",
            b"*2\r\n$6\r\nmaster\r\n*1\r\n*3\r\n$1\r\na\r\n$5\r\n70000\r\n$6\r\nonline\r\n",
            b"*3\r\n$5\r\nslave\r\n$1\r\na\r\n:1\r\n",
            b"*5\r\n$5\r\nslave\r\n$1\r\na\r\n:1\r\n$1\r\ns\r\n$1\r\nx\r\n",
            b"*4\r\n$5\r\nslave\r\n$1\r\na\r\n$4\r\nport\r\n$1\r\ns\r\n",
            b"*4\r\n$5\r\nslave\r\n:1\r\n:1\r\n$1\r\ns\r\n",
            b"*2\r\n$8\r\nsentinel\r\n:1\r\n",
            b"*2\r\n$8\r\nsentinel\r\n*1\r\n:1\r\n",
        ];
        for raw in malformed {
            assert!(
                matches!(err(raw), InfoError::Malformed { .. }),
                "{:?} should be malformed",
                String::from_utf8_lossy(raw)
            );
        }
    }
}
