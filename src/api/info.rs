//! `INFO` as Redis Sentinel shapes it, and the `COMMAND` table clients
//! probe on connect.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::conn::Api;
use super::reply::Reply;
use super::util::{REDIS_COMPAT_VERSION, arity, help, unknown_sub};

const SECTIONS: &[&str] = &["server", "clients", "stats", "cpu", "sentinel"];

/// The text of `INFO [section ...]`. Sentinel knows the sections
/// `server`, `clients`, `cpu`, `stats` and `sentinel`; `default`, `all` and
/// `everything` mean all of them; unknown names add nothing.
pub fn info(api: &Api, args: &[String]) -> String {
    let wanted: Vec<String> = args.iter().map(|a| a.to_lowercase()).collect();
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| matches!(w.as_str(), "default" | "all" | "everything"));
    let mut out = String::new();
    for s in SECTIONS {
        if !all && !wanted.iter().any(|w| w == s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        match *s {
            "server" => server(api, &mut out),
            "clients" => clients(api, &mut out),
            "cpu" => cpu(&mut out),
            "stats" => stats(api, &mut out),
            _ => sentinel(api, &mut out),
        }
    }
    out
}

fn line(out: &mut String, key: &str, value: impl std::fmt::Display) {
    let _ = write!(out, "{key}:{value}\r\n");
}

fn server(api: &Api, out: &mut String) {
    let d = &api.daemon;
    let uptime = Instant::now()
        .saturating_duration_since(d.started)
        .as_secs();
    let unix_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.as_micros())
        .unwrap_or(0);
    out.push_str("# Server\r\n");
    line(out, "redis_version", REDIS_COMPAT_VERSION);
    line(out, "redis_git_sha1", "00000000");
    line(out, "redis_git_dirty", 0);
    line(out, "redis_build_id", "0");
    line(out, "redis_mode", "sentinel");
    line(out, "picket_version", env!("CARGO_PKG_VERSION"));
    line(out, "picket_id", &d.ctx.id);
    line(
        out,
        "os",
        format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
    );
    line(out, "arch_bits", usize::BITS);
    line(out, "multiplexing_api", "tokio");
    line(out, "process_id", std::process::id());
    line(out, "process_supervised", "no");
    line(out, "run_id", &api.run_id);
    line(out, "tcp_port", api.port);
    line(out, "server_time_usec", unix_us);
    line(out, "uptime_in_seconds", uptime);
    line(out, "uptime_in_days", uptime / 86_400);
    line(out, "hz", 10);
    line(out, "configured_hz", 10);
    line(
        out,
        "executable",
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
    );
    line(out, "config_file", "");
}

fn clients(api: &Api, out: &mut String) {
    out.push_str("# Clients\r\n");
    line(
        out,
        "connected_clients",
        api.stats.connected.load(Ordering::Relaxed),
    );
    line(out, "cluster_connections", 0);
    line(out, "maxclients", api.max_clients);
    line(out, "client_recent_max_input_buffer", 0);
    line(out, "client_recent_max_output_buffer", 0);
    line(out, "blocked_clients", 0);
    line(out, "tracking_clients", 0);
    line(out, "clients_in_timeout_table", 0);
}

/// User and system CPU seconds of this process, from `/proc/self/stat`
/// (zeros where that file does not exist).
fn cpu_times() -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (0.0, 0.0);
    };
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line, in clock ticks (100 Hz).
    let Some(after) = stat.rsplit_once(')').map(|(_, a)| a) else {
        return (0.0, 0.0);
    };
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    (tick(11), tick(12))
}

fn cpu(out: &mut String) {
    let (user, sys) = cpu_times();
    out.push_str("# CPU\r\n");
    line(out, "used_cpu_sys", format!("{sys:.6}"));
    line(out, "used_cpu_user", format!("{user:.6}"));
    line(out, "used_cpu_sys_children", "0.000000");
    line(out, "used_cpu_user_children", "0.000000");
}

fn stats(api: &Api, out: &mut String) {
    let s = &api.stats;
    let (mut channels, mut patterns) = (0, 0);
    for c in api.client_list() {
        let st = c.snapshot();
        channels += st.sub;
        patterns += st.psub;
    }
    out.push_str("# Stats\r\n");
    line(
        out,
        "total_connections_received",
        s.connections_received.load(Ordering::Relaxed),
    );
    line(
        out,
        "total_commands_processed",
        s.commands_processed.load(Ordering::Relaxed),
    );
    line(
        out,
        "rejected_connections",
        s.rejected_connections.load(Ordering::Relaxed),
    );
    line(out, "pubsub_channels", channels);
    line(out, "pubsub_patterns", patterns);
    line(
        out,
        "total_error_replies",
        s.error_replies.load(Ordering::Relaxed),
    );
}

fn sentinel(api: &Api, out: &mut String) {
    let d = &api.daemon;
    let now = Instant::now();
    let views = d.views();
    let tilt_since = d
        .ctx
        .tilt
        .since()
        .filter(|_| d.ctx.tilt.until().is_some_and(|u| now < u));
    out.push_str("# Sentinel\r\n");
    line(out, "sentinel_masters", views.len());
    line(out, "sentinel_tilt", u8::from(tilt_since.is_some()));
    line(
        out,
        "sentinel_tilt_since_seconds",
        tilt_since.map_or(-1, |t| {
            i64::try_from(now.saturating_duration_since(t).as_secs()).unwrap_or(i64::MAX)
        }),
    );
    line(out, "sentinel_running_scripts", 0);
    line(out, "sentinel_scripts_queue_length", 0);
    line(
        out,
        "sentinel_simulate_failure_flags",
        d.ctx.simulate_failure.load(Ordering::SeqCst),
    );
    for (i, v) in views.iter().enumerate() {
        let status = if v.master_odown {
            "odown"
        } else if v.master_sdown {
            "sdown"
        } else {
            "ok"
        };
        let _ = write!(
            out,
            "master{i}:name={},status={status},address={},slaves={},sentinels={}\r\n",
            v.name,
            v.announced(&v.master),
            v.replicas().count(),
            v.daemons
        );
    }
}

/// One entry of the command table.
struct Cmd {
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    acl: &'static [&'static str],
    summary: &'static str,
    since: &'static str,
    group: &'static str,
    complexity: &'static str,
    tips: &'static [&'static str],
    subcommands: &'static [(&'static str, i64)],
}

const ADMIN: &[&str] = &["admin"];
const ADMIN_ACL: &[&str] = &["@admin", "@slow", "@dangerous"];
const CONN_ACL: &[&str] = &["@fast", "@connection"];
const PUBSUB_FLAGS: &[&str] = &["pubsub", "noscript", "loading", "stale"];
const PUBSUB_ACL: &[&str] = &["@pubsub", "@slow"];

const TABLE: &[Cmd] = &[
    Cmd {
        name: "auth",
        arity: -2,
        flags: &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        acl: &["@fast", "@connection"],
        summary: "Authenticates the connection",
        since: "1.0.0",
        group: "connection",
        complexity: "O(N) where N is the number of passwords defined for the user",
        tips: &[],
        subcommands: &[],
    },
    Cmd {
        name: "client",
        arity: -2,
        flags: &[],
        acl: &["@slow"],
        summary: "A container for client connection commands",
        since: "2.4.0",
        group: "connection",
        complexity: "Depends on subcommand.",
        tips: &[],
        subcommands: &[
            ("getname", 2),
            ("help", 2),
            ("id", 2),
            ("info", 2),
            ("kill", -3),
            ("list", -2),
            ("setinfo", 4),
            ("setname", 3),
        ],
    },
    Cmd {
        name: "command",
        arity: -1,
        flags: &["loading", "stale"],
        acl: &["@slow", "@connection"],
        summary: "Returns detailed information about all commands",
        since: "2.8.13",
        group: "server",
        complexity: "O(N) where N is the total number of commands",
        tips: &[],
        subcommands: &[
            ("count", 2),
            ("docs", -2),
            ("help", 2),
            ("info", -2),
            ("list", -2),
        ],
    },
    Cmd {
        name: "hello",
        arity: -1,
        flags: &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        acl: CONN_ACL,
        summary: "Handshakes with the server",
        since: "6.0.0",
        group: "connection",
        complexity: "O(1)",
        tips: &[],
        subcommands: &[],
    },
    Cmd {
        name: "info",
        arity: -1,
        flags: &["loading", "stale"],
        acl: &["@slow", "@dangerous"],
        summary: "Returns information and statistics about the server",
        since: "1.0.0",
        group: "server",
        complexity: "O(1)",
        tips: &[
            "nondeterministic_output",
            "request_policy:all_shards",
            "response_policy:special",
        ],
        subcommands: &[],
    },
    Cmd {
        name: "picket",
        arity: -2,
        flags: ADMIN,
        acl: ADMIN_ACL,
        summary: "picket's peer protocol (IS-DOWN, HELLO, FAILOVER)",
        since: "0.1.0",
        group: "sentinel",
        complexity: "O(1)",
        tips: &[],
        subcommands: &[],
    },
    Cmd {
        name: "ping",
        arity: -1,
        flags: &["fast"],
        acl: CONN_ACL,
        summary: "Returns the server's liveliness response",
        since: "1.0.0",
        group: "connection",
        complexity: "O(1)",
        tips: &["request_policy:all_shards", "response_policy:all_succeeded"],
        subcommands: &[],
    },
    Cmd {
        name: "psubscribe",
        arity: -2,
        flags: PUBSUB_FLAGS,
        acl: PUBSUB_ACL,
        summary: "Listens for messages published to channels that match one or more patterns",
        since: "2.0.0",
        group: "pubsub",
        complexity: "O(N) where N is the number of patterns to subscribe to",
        tips: &[],
        subcommands: &[],
    },
    Cmd {
        name: "punsubscribe",
        arity: -1,
        flags: PUBSUB_FLAGS,
        acl: PUBSUB_ACL,
        summary: "Stops listening to messages published to channels that match one or more patterns",
        since: "2.0.0",
        group: "pubsub",
        complexity: "O(N) where N is the number of patterns to unsubscribe",
        tips: &[],
        subcommands: &[],
    },
    Cmd {
        name: "quit",
        arity: -1,
        flags: &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        acl: CONN_ACL,
        summary: "Closes the connection",
        since: "1.0.0",
        group: "connection",
        complexity: "O(1)",
        tips: &[],
        subcommands: &[],
    },
    Cmd {
        name: "reset",
        arity: 1,
        flags: &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        acl: CONN_ACL,
        summary: "Resets the connection",
        since: "6.2.0",
        group: "connection",
        complexity: "O(1)",
        tips: &[],
        subcommands: &[],
    },
    Cmd {
        name: "role",
        arity: 1,
        flags: &["noscript", "loading", "stale", "fast"],
        acl: &["@admin", "@fast", "@dangerous"],
        summary: "Returns the replication role",
        since: "2.8.12",
        group: "server",
        complexity: "O(1)",
        tips: &["nondeterministic_output"],
        subcommands: &[],
    },
    Cmd {
        name: "sentinel",
        arity: -2,
        flags: ADMIN,
        acl: ADMIN_ACL,
        summary: "A container for Redis Sentinel commands",
        since: "2.8.4",
        group: "sentinel",
        complexity: "Depends on subcommand.",
        tips: &[],
        subcommands: &[
            ("ckquorum", 3),
            ("failover", 3),
            ("get-master-addr-by-name", 3),
            ("get-primary-addr-by-name", 3),
            ("help", 2),
            ("is-master-down-by-addr", 6),
            ("is-primary-down-by-addr", 6),
            ("master", 3),
            ("masters", 2),
            ("myid", 2),
            ("primaries", 2),
            ("primary", 3),
            ("replicas", 3),
            ("reset", 3),
            ("sentinels", 3),
            ("simulate-failure", -3),
            ("slaves", 3),
        ],
    },
    Cmd {
        name: "subscribe",
        arity: -2,
        flags: PUBSUB_FLAGS,
        acl: PUBSUB_ACL,
        summary: "Listens for messages published to channels",
        since: "2.0.0",
        group: "pubsub",
        complexity: "O(N) where N is the number of channels to subscribe to",
        tips: &[],
        subcommands: &[],
    },
    Cmd {
        name: "unsubscribe",
        arity: -1,
        flags: PUBSUB_FLAGS,
        acl: PUBSUB_ACL,
        summary: "Stops listening to messages posted to channels",
        since: "2.0.0",
        group: "pubsub",
        complexity: "O(N) where N is the number of channels to unsubscribe",
        tips: &[],
        subcommands: &[],
    },
];

/// Whether `cmd` (upper case) takes a subcommand (`CLIENT LIST` is shown
/// as `client|list`).
pub fn is_container(cmd: &str) -> bool {
    matches!(cmd, "CLIENT" | "COMMAND" | "SENTINEL" | "PICKET")
}

fn simple_set(items: &[&str]) -> Reply {
    Reply::Set(items.iter().map(|s| Reply::Simple((*s).into())).collect())
}

fn entry(
    name: String,
    arity: i64,
    flags: &[&str],
    acl: &[&str],
    tips: &[&str],
    subcommands: Vec<Reply>,
) -> Reply {
    Reply::Array(vec![
        Reply::bulk(name),
        Reply::Int(arity),
        simple_set(flags),
        Reply::Int(0),
        Reply::Int(0),
        Reply::Int(0),
        simple_set(acl),
        Reply::Set(tips.iter().map(Reply::bulk).collect()),
        Reply::Set(vec![]),
        Reply::Set(subcommands),
    ])
}

fn info_entry(c: &Cmd) -> Reply {
    let subs = c
        .subcommands
        .iter()
        .map(|(s, a)| entry(format!("{}|{s}", c.name), *a, c.flags, c.acl, &[], vec![]))
        .collect();
    entry(c.name.to_string(), c.arity, c.flags, c.acl, c.tips, subs)
}

fn docs_entry(c: &Cmd) -> Reply {
    let mut fields = vec![
        ("summary", Reply::bulk(c.summary)),
        ("since", Reply::bulk(c.since)),
        ("group", Reply::bulk(c.group)),
        ("complexity", Reply::bulk(c.complexity)),
    ];
    if !c.subcommands.is_empty() {
        fields.push((
            "subcommands",
            Reply::Map(
                c.subcommands
                    .iter()
                    .map(|(s, _)| {
                        (
                            Reply::bulk(format!("{}|{s}", c.name)),
                            Reply::map_str(vec![
                                ("summary", Reply::bulk(format!("{} {s}", c.name))),
                                ("since", Reply::bulk(c.since)),
                                ("group", Reply::bulk(c.group)),
                                ("complexity", Reply::bulk("O(1)")),
                            ]),
                        )
                    })
                    .collect(),
            ),
        ));
    }
    Reply::map_str(fields)
}

fn find(name: &str) -> Option<&'static Cmd> {
    let name = name.to_lowercase();
    TABLE.iter().find(|c| c.name == name)
}

const COMMAND_HELP: &[&str] = &[
    "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "(no subcommand)",
    "    Return details about all commands.",
    "COUNT",
    "    Return the total number of commands in this server.",
    "LIST",
    "    Return a list of all commands in this server.",
    "INFO [<command-name> ...]",
    "    Return details about multiple commands.",
    "    If no command names are given, documentation details for all",
    "    commands are returned.",
    "DOCS [<command-name> ...]",
    "    Return documentation details about multiple commands.",
    "    If no command names are given, documentation details for all",
    "    commands are returned.",
    "HELP",
    "    Print this help.",
];

/// `COMMAND [COUNT | LIST | INFO name... | DOCS name... | HELP]`.
pub fn command(rest: &[String]) -> Reply {
    let Some(sub) = rest.first() else {
        return Reply::Array(TABLE.iter().map(info_entry).collect());
    };
    match sub.to_uppercase().as_str() {
        "COUNT" if rest.len() == 1 => Reply::Int(TABLE.len() as i64),
        "COUNT" => arity("command|count"),
        "LIST" => {
            let mut names = Vec::new();
            for c in TABLE {
                names.push(Reply::bulk(c.name));
                for (s, _) in c.subcommands {
                    names.push(Reply::bulk(format!("{}|{s}", c.name)));
                }
            }
            Reply::Array(names)
        }
        "INFO" if rest.len() == 1 => Reply::Array(TABLE.iter().map(info_entry).collect()),
        "INFO" => Reply::Array(
            rest[1..]
                .iter()
                .map(|n| find(n).map_or(Reply::Null, info_entry))
                .collect(),
        ),
        "DOCS" => {
            let cmds: Vec<&Cmd> = if rest.len() == 1 {
                TABLE.iter().collect()
            } else {
                rest[1..].iter().filter_map(|n| find(n)).collect()
            };
            Reply::Map(
                cmds.into_iter()
                    .map(|c| (Reply::bulk(c.name), docs_entry(c)))
                    .collect(),
            )
        }
        "GETKEYS" | "GETKEYSANDFLAGS" => Reply::err("ERR The command has no key arguments"),
        "HELP" => help(COMMAND_HELP),
        _ => unknown_sub("command", sub),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_table_is_sorted_and_unique() {
        let names: Vec<&str> = TABLE.iter().map(|c| c.name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn command_info_shape() {
        let Reply::Array(v) = command(&["INFO".into(), "ping".into(), "nope".into()]) else {
            panic!()
        };
        assert_eq!(v.len(), 2);
        assert_eq!(v[1], Reply::Null);
        let Reply::Array(e) = &v[0] else { panic!() };
        assert_eq!(e.len(), 10);
        assert_eq!(e[0], Reply::bulk("ping"));
        assert_eq!(e[1], Reply::Int(-1));
        assert_eq!(command(&["COUNT".into()]), Reply::Int(TABLE.len() as i64));
        let Reply::Map(m) = command(&["DOCS".into(), "PING".into()]) else {
            panic!()
        };
        assert_eq!(m.len(), 1);
        assert!(command(&["NOPE".into()]).is_error());
    }

    #[test]
    fn cpu_times_parse() {
        let (u, s) = cpu_times();
        assert!(u >= 0.0 && s >= 0.0);
    }
}
