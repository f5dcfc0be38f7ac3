//! Command dispatch of the RESP listener.

use bytes::Bytes;

use super::{Conn, Reply};
use crate::addr::Addr;
use crate::daemon::Daemon;
use crate::group::GroupMsg;
use crate::quorum::peers::{Hello, IsDownQuery};

fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn arity(cmd: &str) -> Reply {
    Reply::err(format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.to_lowercase()
    ))
}

/// Run one command.
pub async fn dispatch(d: &Daemon, conn: &mut Conn, args: Vec<Bytes>) -> Reply {
    let cmd = text(&args[0]).to_uppercase();
    let rest: Vec<String> = args[1..].iter().map(text).collect();
    if !conn.authed && !matches!(cmd.as_str(), "AUTH" | "HELLO" | "QUIT") {
        return Reply::err("NOAUTH Authentication required.");
    }
    match cmd.as_str() {
        "PING" => match rest.len() {
            0 => Reply::Simple("PONG".into()),
            1 => Reply::bulk(&rest[0]),
            _ => arity("ping"),
        },
        "AUTH" => auth(d, conn, &rest),
        "QUIT" => {
            conn.quit = true;
            Reply::ok()
        }
        "HELLO" => hello(d, conn, &rest),
        "PICKET" => picket(d, &rest).await,
        "SENTINEL" => sentinel(d, &rest).await,
        "ROLE" => {
            let names = d.views().iter().map(|v| Reply::bulk(&v.name)).collect();
            Reply::Array(vec![Reply::bulk("sentinel"), Reply::Array(names)])
        }
        _ => Reply::err(format!(
            "ERR unknown command '{}', with args beginning with: {}",
            text(&args[0]),
            rest.iter()
                .take(3)
                .map(|a| format!("'{a}' "))
                .collect::<String>()
        )),
    }
}

fn check_password(d: &Daemon, given: &str) -> bool {
    match &d.ctx.password {
        None => false,
        Some(pw) => {
            // Constant-time comparison: the password is the only secret here.
            let a = pw.as_bytes();
            let b = given.as_bytes();
            a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
        }
    }
}

fn auth(d: &Daemon, conn: &mut Conn, rest: &[String]) -> Reply {
    let pw = match rest {
        [pw] => pw,
        [user, pw] if user == "default" => pw,
        [_, _] => {
            return Reply::err("WRONGPASS invalid username-password pair or user is disabled.");
        }
        _ => return arity("auth"),
    };
    if d.ctx.password.is_none() {
        return Reply::err(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        );
    }
    if check_password(d, pw) {
        conn.authed = true;
        Reply::ok()
    } else {
        Reply::err("WRONGPASS invalid username-password pair or user is disabled.")
    }
}

fn hello(d: &Daemon, conn: &mut Conn, rest: &[String]) -> Reply {
    let mut i = 0;
    let mut proto = if conn.resp3 { 3 } else { 2 };
    if let Some(v) = rest.first() {
        match v.parse::<i64>() {
            Ok(2) => proto = 2,
            Ok(3) => proto = 3,
            _ => return Reply::err("NOPROTO unsupported protocol version"),
        }
        i = 1;
    }
    while i < rest.len() {
        match rest[i].to_uppercase().as_str() {
            "AUTH" if i + 2 < rest.len() => {
                let r = auth(d, conn, &rest[i + 1..i + 3]);
                if matches!(r, Reply::Error(_)) {
                    return r;
                }
                i += 3;
            }
            "SETNAME" if i + 1 < rest.len() => {
                conn.name = Some(rest[i + 1].clone());
                i += 2;
            }
            _ => return Reply::err(format!("ERR Syntax error in HELLO option '{}'", rest[i])),
        }
    }
    if !conn.authed {
        return Reply::err(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        );
    }
    conn.resp3 = proto == 3;
    Reply::map_str(vec![
        ("server", Reply::bulk("redis")),
        ("version", Reply::bulk("7.0.0")),
        ("proto", Reply::Int(proto)),
        ("id", Reply::Int(i64::try_from(conn.id).unwrap_or(i64::MAX))),
        ("mode", Reply::bulk("sentinel")),
        ("modules", Reply::Array(vec![])),
    ])
}

async fn picket(d: &Daemon, rest: &[String]) -> Reply {
    let Some(sub) = rest.first() else {
        return arity("picket");
    };
    match sub.to_uppercase().as_str() {
        "IS-DOWN" => {
            let q = match IsDownQuery::from_args(&rest[1..]) {
                Ok(q) => q,
                Err(e) => return Reply::err(format!("ERR {e}")),
            };
            let Some(h) = d.group(&q.group) else {
                return Reply::err(format!("ERR No such master with that name: {}", q.group));
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            if h.tx
                .send(GroupMsg::IsDown {
                    query: q,
                    reply: tx,
                })
                .await
                .is_err()
            {
                return Reply::err("ERR group task stopped");
            }
            match rx.await {
                Ok(Ok(r)) => Reply::Array(vec![
                    Reply::Int(i64::from(r.down)),
                    Reply::bulk(r.leader.unwrap_or_else(|| "*".into())),
                    Reply::Int(i64::try_from(r.leader_epoch).unwrap_or(i64::MAX)),
                ]),
                Ok(Err(e)) => Reply::err(e),
                Err(_) => Reply::err("ERR group task stopped"),
            }
        }
        "HELLO" => {
            let [_, json] = rest else {
                return arity("picket|hello");
            };
            let hello: Hello = match serde_json::from_str(json) {
                Ok(h) => h,
                Err(e) => return Reply::err(format!("ERR invalid hello: {e}")),
            };
            if !d.apply_hello(&hello) {
                return Reply::err(format!(
                    "ERR unknown peer {} ({}): peers are static, list it in daemon.peers",
                    hello.addr, hello.id
                ));
            }
            match serde_json::to_string(&d.hello()) {
                Ok(s) => Reply::bulk(s),
                Err(e) => Reply::err(format!("ERR {e}")),
            }
        }
        "FAILOVER" => match rest {
            [_, group] => switchover(d, group, None).await,
            [_, group, to] => match to.parse::<Addr>() {
                Ok(a) => switchover(d, group, Some(a)).await,
                Err(e) => Reply::err(format!("ERR invalid address: {e}")),
            },
            _ => arity("picket|failover"),
        },
        _ => Reply::err(format!("ERR unknown subcommand '{sub}'. Try PICKET HELP.")),
    }
}

async fn switchover(d: &Daemon, group: &str, to: Option<Addr>) -> Reply {
    let Some(h) = d.group(group) else {
        return Reply::err("ERR No such master with that name");
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    if h.tx
        .send(GroupMsg::Switchover { to, reply: tx })
        .await
        .is_err()
    {
        return Reply::err("ERR group task stopped");
    }
    match rx.await {
        Ok(Ok(())) => Reply::ok(),
        Ok(Err(e)) => Reply::err(e),
        Err(_) => Reply::err("ERR group task stopped"),
    }
}

async fn sentinel(d: &Daemon, rest: &[String]) -> Reply {
    let Some(sub) = rest.first() else {
        return arity("sentinel");
    };
    match sub.to_uppercase().as_str() {
        "GET-MASTER-ADDR-BY-NAME" | "GET-PRIMARY-ADDR-BY-NAME" => {
            let [_, name] = rest else {
                return arity("sentinel|get-master-addr-by-name");
            };
            match d.group(name) {
                Some(h) => {
                    let v = h.view.borrow().clone();
                    Reply::Array(vec![
                        Reply::bulk(&v.master.host),
                        Reply::bulk(v.master.port.to_string()),
                    ])
                }
                None => Reply::NullArray,
            }
        }
        "MYID" => Reply::bulk(&d.ctx.id),
        "FAILOVER" => {
            let [_, name] = rest else {
                return arity("sentinel|failover");
            };
            switchover(d, name, None).await
        }
        "RESET" => {
            let [_, pattern] = rest else {
                return arity("sentinel|reset");
            };
            let mut n = 0;
            for v in d.views() {
                if glob_match(pattern, &v.name)
                    && let Some(h) = d.group(&v.name)
                {
                    let _ = h.tx.send(GroupMsg::Reset).await;
                    n += 1;
                }
            }
            Reply::Int(n)
        }
        _ => Reply::err(format!(
            "ERR unknown subcommand '{sub}'. Try SENTINEL HELP."
        )),
    }
}

/// Redis-style glob: `*` matches any run of bytes, `?` any one byte,
/// everything else itself (`[...]` and `\\` are not special).
///
/// Iterative, backtracking only to the last `*`: O(pattern × name) time and
/// no recursion. The pattern comes from a client (`SENTINEL RESET`); a
/// recursive matcher took exponential time on a few dozen `*` and
/// overflowed the stack on a long run of them.
pub fn glob_match(pattern: &str, s: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), s.as_bytes());
    let (mut pi, mut si) = (0, 0);
    // After the last `*` seen: where its pattern continues, and how much of
    // `s` it has swallowed so far.
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi + 1, si));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                // Let the last `*` swallow one more byte and retry.
                Some((after, swallowed)) => {
                    star = Some((after, swallowed + 1));
                    pi = after;
                    si = swallowed + 1;
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob() {
        assert!(glob_match("*", "cache"));
        assert!(glob_match("ca*", "cache"));
        assert!(glob_match("c?che", "cache"));
        assert!(!glob_match("x*", "cache"));
        assert!(glob_match("cache", "cache"));
        assert!(glob_match("", ""));
        assert!(glob_match("**", ""));
        assert!(!glob_match("?", ""));
        assert!(glob_match("*he", "cache"));
        assert!(!glob_match("*ch", "cache"));
        assert!(glob_match("c*c*e", "cache"));
    }

    /// The recursive matcher this module had, as the reference for small inputs.
    fn reference(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => reference(&p[1..], s) || (!s.is_empty() && reference(p, &s[1..])),
            (Some(b'?'), Some(_)) => reference(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => reference(&p[1..], &s[1..]),
            _ => false,
        }
    }

    #[test]
    fn glob_agrees_with_the_recursive_definition() {
        // Every pattern of up to 5 symbols over {*, ?, a, b} against every
        // name of up to 4 bytes over {a, b}.
        fn words(alphabet: &[u8], max: usize) -> Vec<Vec<u8>> {
            let mut all = vec![vec![]];
            let mut last = vec![vec![]];
            for _ in 0..max {
                last = last
                    .iter()
                    .flat_map(|w: &Vec<u8>| {
                        alphabet.iter().map(move |c| [w.as_slice(), &[*c]].concat())
                    })
                    .collect();
                all.extend(last.iter().cloned());
            }
            all
        }
        for p in words(b"*?ab", 5) {
            for s in words(b"ab", 4) {
                let (ps, ss) = (
                    std::str::from_utf8(&p).unwrap(),
                    std::str::from_utf8(&s).unwrap(),
                );
                assert_eq!(glob_match(ps, ss), reference(&p, &s), "{ps:?} on {ss:?}");
            }
        }
    }

    #[test]
    fn hostile_globs_are_cheap() {
        // Found by fuzz/fuzz_targets/api_dispatch: 40 `*` and a byte that
        // never matches made SENTINEL RESET run for minutes (exponential
        // backtracking), and a long run of `*` overflowed the stack.
        let name = "sessions-eu-west-1-primary-replicated";
        let slow = format!("{}x", "*".repeat(40));
        assert!(!glob_match(&slow, name));
        let alternating = format!("{}b", "*a".repeat(2000));
        assert!(!glob_match(&alternating, name));
        let deep = "*".repeat(1_000_000);
        let matched = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || glob_match(&deep, "cache"))
            .unwrap()
            .join()
            .unwrap();
        assert!(matched);
    }
}
