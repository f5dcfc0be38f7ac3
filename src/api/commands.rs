//! Command dispatch of the RESP listener: the connection commands (`PING`,
//! `AUTH`, `HELLO`, `CLIENT`, `COMMAND`, `ROLE`, `INFO`, pub/sub) and the
//! dispatch of `SENTINEL` ([`super::sentinel`]) and of the peer protocol
//! (`PICKET ...`, [`super::peer`]).

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

use super::acl;
use super::conn::{Api, Conn};
use super::reply::Reply;
use super::util::{REDIS_COMPAT_VERSION, arity, clip, help, text, unknown_sub};
use crate::metrics as m;

fn unknown_command(name: &str, rest: &[String]) -> Reply {
    Reply::err(format!(
        "ERR unknown command '{}', with args beginning with: {}",
        clip(name),
        rest.iter()
            .take(3)
            .map(|a| format!("'{}' ", clip(a)))
            .collect::<String>()
    ))
}

/// Commands allowed in RESP2 while subscribed.
fn allowed_while_subscribed(cmd: &str) -> bool {
    matches!(
        cmd,
        "SUBSCRIBE" | "PSUBSCRIBE" | "UNSUBSCRIBE" | "PUNSUBSCRIBE" | "PING" | "QUIT" | "RESET"
    )
}

/// The commands every client repeats (where is the master, is the
/// server alive), answered from the arguments as received: no copy of
/// them, no case conversion, no name built. The same checks as
/// [`dispatch`] (logged in, allowed to read, not in RESP2 subscribed mode
/// for `SENTINEL`); `None` sends anything else the long way. They change
/// nothing of the connection, so only [`Conn::touch`] follows them.
pub fn hot(api: &Api, conn: &mut Conn, args: &[Bytes]) -> Option<(Reply, &'static str)> {
    let user = conn.user.as_ref()?;
    match args {
        [cmd] if cmd.eq_ignore_ascii_case(b"PING") && conn.subs.count() == 0 => {
            acl::allows(user.role, acl::Permission::Connection)
                .then(|| (Reply::Simple("PONG".into()), "ping"))
        }
        [cmd, sub, name]
            if cmd.eq_ignore_ascii_case(b"SENTINEL")
                && (sub.eq_ignore_ascii_case(b"GET-MASTER-ADDR-BY-NAME")
                    || sub.eq_ignore_ascii_case(b"GET-PRIMARY-ADDR-BY-NAME"))
                && (conn.resp3 || conn.subs.count() == 0)
                && acl::allows(user.role, acl::Permission::Read) =>
        {
            let what = if sub[4].eq_ignore_ascii_case(&b'm') {
                "sentinel|get-master-addr-by-name"
            } else {
                "sentinel|get-primary-addr-by-name"
            };
            Some((
                super::sentinel::master_addr_cached(&api.daemon, name, &mut conn.master),
                what,
            ))
        }
        _ => None,
    }
}

/// Run one command. Returns the reply and the command's name for
/// `CLIENT LIST` (`sentinel|masters` style).
pub async fn dispatch(api: &Arc<Api>, conn: &mut Conn, args: Vec<Bytes>) -> (Reply, String) {
    let d = &api.daemon;
    let cmd = text(&args[0]).to_uppercase();
    let rest: Vec<String> = args[1..].iter().map(text).collect();
    let mut name = cmd.to_lowercase();
    if super::info::is_container(&cmd)
        && let Some(sub) = rest.first()
    {
        name = format!("{name}|{}", clip(&sub.to_lowercase()));
    }
    let Some(user) = &conn.user else {
        if matches!(cmd.as_str(), "AUTH" | "HELLO" | "QUIT") {
            return (connection_command(api, conn, &cmd, &rest).await, name);
        }
        return (Reply::err("NOAUTH Authentication required."), name);
    };
    if !acl::allows(
        user.role,
        acl::needed(&cmd, rest.first().map(String::as_str)),
    ) {
        metrics::counter!(m::API_REFUSED, "command" => name.clone(), "user" => user.name.to_string())
            .increment(1);
        tracing::info!(client = %conn.peer, user = %user.name, command = %name, "command refused: no permission");
        return (Reply::err(acl::noperm(&user.name, &name)), name);
    }
    if !conn.resp3 && conn.subs.count() > 0 && !allowed_while_subscribed(&cmd) {
        return (
            Reply::err(format!(
                "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
            )),
            name,
        );
    }
    let reply = match cmd.as_str() {
        "PING" => ping(conn, &rest),
        "AUTH" | "HELLO" | "QUIT" => connection_command(api, conn, &cmd, &rest).await,
        "RESET" => {
            conn.subs.clear();
            conn.sync_events(api);
            conn.resp3 = false;
            conn.name = None;
            conn.user = api.users.initial();
            Reply::Simple("RESET".into())
        }
        "CLIENT" => client(api, conn, &rest),
        "COMMAND" => super::info::command(&rest),
        "INFO" => Reply::bulk(super::info::info(api, &rest)),
        "ROLE" => {
            let names = d.views().iter().map(|v| Reply::bulk(&v.name)).collect();
            Reply::Array(vec![Reply::bulk("sentinel"), Reply::Array(names)])
        }
        "SUBSCRIBE" | "PSUBSCRIBE" => {
            if rest.is_empty() {
                arity(&cmd)
            } else {
                let r = if cmd == "SUBSCRIBE" {
                    conn.subs.subscribe(&rest)
                } else {
                    conn.subs.psubscribe(&rest)
                };
                conn.sync_events(api);
                r
            }
        }
        "UNSUBSCRIBE" => {
            let r = conn.subs.unsubscribe(&rest);
            conn.sync_events(api);
            r
        }
        "PUNSUBSCRIBE" => {
            let r = conn.subs.punsubscribe(&rest);
            conn.sync_events(api);
            r
        }
        "PICKET" => super::peer::picket(d, &rest).await,
        "SENTINEL" => super::sentinel::sentinel(d, &rest).await,
        _ => unknown_command(&text(&args[0]), &rest),
    };
    (reply, name)
}

fn ping(conn: &Conn, rest: &[String]) -> Reply {
    if rest.len() > 1 {
        return arity("ping");
    }
    if !conn.resp3 && conn.subs.count() > 0 {
        // RESP2 subscribed mode answers in the shape of a message.
        return Reply::Array(vec![
            Reply::bulk("pong"),
            Reply::bulk(rest.first().map_or("", String::as_str)),
        ]);
    }
    match rest.first() {
        None => Reply::Simple("PONG".into()),
        Some(m) => Reply::bulk(m),
    }
}

/// The commands a connection may run before it is logged in.
async fn connection_command(api: &Api, conn: &mut Conn, cmd: &str, rest: &[String]) -> Reply {
    match cmd {
        "AUTH" => auth(api, conn, rest).await,
        "HELLO" => hello(api, conn, rest).await,
        _ => {
            conn.quit = true;
            Reply::ok()
        }
    }
}

/// `AUTH [user] password` (also `HELLO ... AUTH user password`). Failed
/// attempts are counted and slowed down per connection, and end it after
/// [`acl::MAX_AUTH_FAILURES`]: one connection cannot try many passwords.
async fn auth(api: &Api, conn: &mut Conn, rest: &[String]) -> Reply {
    let (user, pw) = match rest {
        [pw] => (None, pw),
        [user, pw] => (Some(user.as_str()), pw),
        _ => return arity("auth"),
    };
    match api.users.authenticate(user, pw) {
        Ok(identity) => {
            conn.user = Some(identity);
            Reply::ok()
        }
        Err(e @ acl::AuthError::NoDefaultPassword) => Reply::err(e.text()),
        Err(e) => {
            conn.auth_failures = conn.auth_failures.saturating_add(1);
            metrics::counter!(m::API_AUTH_FAILURES).increment(1);
            tracing::info!(client = %conn.peer, user = user.unwrap_or("default"), failures = conn.auth_failures, "AUTH failed");
            tokio::time::sleep(acl::auth_delay(conn.auth_failures)).await;
            if conn.auth_failures >= acl::MAX_AUTH_FAILURES {
                metrics::counter!(m::API_REJECTED, "reason" => "auth_failures").increment(1);
                tracing::warn!(client = %conn.peer, "closing a connection after {} failed AUTH attempts", conn.auth_failures);
                conn.quit = true;
            }
            Reply::err(e.text())
        }
    }
}

async fn hello(api: &Api, conn: &mut Conn, rest: &[String]) -> Reply {
    let mut i = 0;
    let mut proto = if conn.resp3 { 3 } else { 2 };
    if let Some(v) = rest.first() {
        match v.parse::<i64>() {
            Ok(2) => proto = 2,
            Ok(3) => proto = 3,
            Ok(_) => return Reply::err("NOPROTO unsupported protocol version"),
            Err(_) => return Reply::err("ERR Protocol version is not an integer or out of range"),
        }
        i = 1;
    }
    let mut setname = None;
    while i < rest.len() {
        match rest[i].to_uppercase().as_str() {
            "AUTH" if i + 2 < rest.len() => {
                let r = auth(api, conn, &rest[i + 1..i + 3]).await;
                if r.is_error() {
                    return r;
                }
                i += 3;
            }
            "SETNAME" if i + 1 < rest.len() => {
                if let Err(e) = valid_name(&rest[i + 1]) {
                    return e;
                }
                setname = Some(rest[i + 1].clone());
                i += 2;
            }
            _ => {
                return Reply::err(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    clip(&rest[i])
                ));
            }
        }
    }
    if conn.user.is_none() {
        return Reply::err(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        );
    }
    if let Some(n) = setname {
        conn.name = (!n.is_empty()).then_some(n);
    }
    conn.resp3 = proto == 3;
    Reply::map_str(vec![
        ("server", Reply::bulk("redis")),
        ("version", Reply::bulk(REDIS_COMPAT_VERSION)),
        ("proto", Reply::Int(proto)),
        ("id", Reply::Int(i64::try_from(conn.id).unwrap_or(i64::MAX))),
        ("mode", Reply::bulk("sentinel")),
        ("modules", Reply::Array(vec![])),
    ])
}

/// Redis's rule for client names and library names: printable ASCII
/// without spaces.
fn valid_name(name: &str) -> Result<(), Reply> {
    if name.bytes().all(|b| (b'!'..=b'~').contains(&b)) {
        Ok(())
    } else {
        Err(Reply::err(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ))
    }
}

const CLIENT_HELP: &[&str] = &[
    "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GETNAME",
    "    Return the name of the current connection.",
    "ID",
    "    Return the ID of the current connection.",
    "INFO",
    "    Return information about the current client connection.",
    "KILL <ip:port>",
    "    Kill connection made from <ip:port>.",
    "KILL <option> <value> [<option> <value> [...]]",
    "    Kill connections. Options are:",
    "    * ADDR (<ip:port>|<unixsocket>:0)",
    "      Kill connections made from the specified address",
    "    * LADDR (<ip:port>|<unixsocket>:0)",
    "      Kill connections made to specified local address",
    "    * ID <client-id>",
    "      Kill connections by client id.",
    "    * TYPE (NORMAL|PUBSUB)",
    "      Kill connections by type.",
    "    * USER <username>",
    "      Kill connections authenticated by <username>.",
    "    * SKIPME (YES|NO)",
    "      Skip killing current connection (default: yes).",
    "LIST [options ...]",
    "    Return information about client connections. Options:",
    "    * TYPE (NORMAL|PUBSUB)",
    "      Return clients of specified type.",
    "    * ID <client-id> [<client-id> ...]",
    "      Return clients with the given ids.",
    "SETNAME <name>",
    "    Assign the name <name> to the current connection.",
    "SETINFO <option> <value>",
    "    Set client meta attr. Options are:",
    "    * LIB-NAME: the client lib name.",
    "    * LIB-VER: the client lib version.",
    "HELP",
    "    Prints this help.",
];

fn client(api: &Api, conn: &mut Conn, rest: &[String]) -> Reply {
    let Some(sub) = rest.first() else {
        return arity("client");
    };
    let now = Instant::now();
    match sub.to_uppercase().as_str() {
        "SETNAME" => {
            let [_, name] = rest else {
                return arity("client|setname");
            };
            if let Err(e) = valid_name(name) {
                return e;
            }
            conn.name = (!name.is_empty()).then(|| name.clone());
            Reply::ok()
        }
        "GETNAME" => match (&conn.name, rest.len()) {
            (_, n) if n != 1 => arity("client|getname"),
            (Some(n), _) => Reply::bulk(n),
            (None, _) => Reply::Null,
        },
        "ID" if rest.len() == 1 => Reply::Int(i64::try_from(conn.id).unwrap_or(i64::MAX)),
        "ID" => arity("client|id"),
        "SETINFO" => {
            let [_, attr, value] = rest else {
                return arity("client|setinfo");
            };
            let attr = attr.to_uppercase();
            if !matches!(attr.as_str(), "LIB-NAME" | "LIB-VER") {
                return Reply::err(format!("ERR Unrecognized option '{}'", clip(&rest[1])));
            }
            if value.len() > 128 || valid_name(value).is_err() {
                return Reply::err(format!(
                    "ERR {} cannot contain spaces, newlines or special characters.",
                    attr.to_lowercase()
                ));
            }
            if attr == "LIB-NAME" {
                conn.lib.0.clone_from(value);
            } else {
                conn.lib.1.clone_from(value);
            }
            Reply::ok()
        }
        "INFO" if rest.len() == 1 => {
            conn.publish_state(Cow::Borrowed("client|info"));
            Reply::Verbatim(format!("{}\n", conn.entry.line(now)))
        }
        "INFO" => arity("client|info"),
        "LIST" => client_list(api, conn, &rest[1..], now),
        "KILL" => client_kill(api, conn, &rest[1..]),
        "HELP" => help(CLIENT_HELP),
        _ => unknown_sub("client", sub),
    }
}

fn client_list(api: &Api, conn: &Conn, opts: &[String], now: Instant) -> Reply {
    conn.publish_state(Cow::Borrowed("client|list"));
    let mut ids: Option<Vec<u64>> = None;
    let mut kind: Option<String> = None;
    let mut i = 0;
    while i < opts.len() {
        match opts[i].to_uppercase().as_str() {
            "TYPE" if i + 1 < opts.len() => {
                let t = opts[i + 1].to_lowercase();
                if !matches!(
                    t.as_str(),
                    "normal" | "pubsub" | "master" | "replica" | "slave"
                ) {
                    return Reply::err(format!("ERR Unknown client type '{}'", clip(&opts[i + 1])));
                }
                kind = Some(t);
                i += 2;
            }
            "ID" if i + 1 < opts.len() => {
                let mut v = Vec::new();
                for s in &opts[i + 1..] {
                    match s.parse::<u64>() {
                        Ok(id) if id > 0 => v.push(id),
                        _ => return Reply::err("ERR Invalid client ID"),
                    }
                }
                ids = Some(v);
                i = opts.len();
            }
            _ => return Reply::err("ERR syntax error"),
        }
    }
    let mut out = String::new();
    for c in api.client_list() {
        if ids.as_ref().is_some_and(|ids| !ids.contains(&c.id)) {
            continue;
        }
        if let Some(k) = &kind {
            let s = c.snapshot();
            let pubsub = s.sub + s.psub > 0;
            let matches = match k.as_str() {
                "normal" => !pubsub,
                "pubsub" => pubsub,
                _ => false,
            };
            if !matches {
                continue;
            }
        }
        out.push_str(&c.line(now));
        out.push('\n');
    }
    Reply::Verbatim(out)
}

fn client_kill(api: &Api, conn: &Conn, opts: &[String]) -> Reply {
    let clients = api.client_list();
    if let [addr] = opts {
        // The old form: one address, an error when nobody matches.
        return match clients.iter().find(|c| c.addr.to_string() == *addr) {
            Some(c) => {
                c.disconnect();
                Reply::ok()
            }
            None => Reply::err("ERR No such client"),
        };
    }
    if opts.is_empty() || !opts.len().is_multiple_of(2) {
        return Reply::err("ERR syntax error");
    }
    let mut id = None;
    let mut addr = None;
    let mut laddr = None;
    let mut kind = None;
    let mut user = None;
    let mut skipme = true;
    for pair in opts.chunks(2) {
        let v = &pair[1];
        match pair[0].to_uppercase().as_str() {
            "ID" => match v.parse::<u64>() {
                Ok(i) if i > 0 => id = Some(i),
                _ => return Reply::err("ERR client-id should be greater than 0"),
            },
            "ADDR" => addr = Some(v.clone()),
            "LADDR" => laddr = Some(v.clone()),
            "TYPE" => {
                let t = v.to_lowercase();
                if !matches!(
                    t.as_str(),
                    "normal" | "pubsub" | "master" | "replica" | "slave"
                ) {
                    return Reply::err(format!("ERR Unknown client type '{}'", clip(v)));
                }
                kind = Some(t);
            }
            "USER" => {
                if !api.users.exists(v) {
                    return Reply::err(format!("ERR No such user '{}'", clip(v)));
                }
                user = Some(v.clone());
            }
            "SKIPME" => match v.to_lowercase().as_str() {
                "yes" => skipme = true,
                "no" => skipme = false,
                _ => return Reply::err("ERR syntax error"),
            },
            _ => return Reply::err("ERR syntax error"),
        }
    }
    let mut killed = 0;
    for c in clients {
        if (skipme && c.id == conn.id)
            || id.is_some_and(|i| i != c.id)
            || addr.as_ref().is_some_and(|a| *a != c.addr.to_string())
            || laddr
                .as_ref()
                .is_some_and(|a| c.laddr.is_none_or(|l| *a != l.to_string()))
        {
            continue;
        }
        let s = c.snapshot();
        if let Some(k) = &kind {
            let pubsub = s.sub + s.psub > 0;
            if !((k == "normal" && !pubsub) || (k == "pubsub" && pubsub)) {
                continue;
            }
        }
        if user.as_ref().is_some_and(|u| *u != s.user) {
            continue;
        }
        c.disconnect();
        killed += 1;
    }
    Reply::Int(killed)
}
