//! The peer protocol's commands (`PICKET IS-DOWN`, `HELLO`, `FAILOVER`,
//! `SIMULATE-FAILURE`), and the two group requests the Sentinel commands
//! share with it: an IS-DOWN question (or vote request) and a switchover.

use super::reply::Reply;
use super::util::{arity, clip};
use crate::addr::Addr;
use crate::daemon::Daemon;
use crate::failover::{FailoverError, NoGoodReplica};
use crate::group::GroupMsg;
use crate::quorum::peers::{Hello, IsDownQuery};

/// Run `PICKET <sub> ...`.
pub async fn picket(d: &Daemon, rest: &[String]) -> Reply {
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
            is_down(&h, q).await
        }
        "HELLO" => {
            let [_, json] = rest else {
                return arity("picket|hello");
            };
            let hello: Hello = match serde_json::from_str(json) {
                Ok(h) => h,
                Err(e) => return Reply::err(format!("ERR invalid hello: {e}")),
            };
            if !crate::hello::receive(&d.ctx, &hello).await {
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
        "SIMULATE-FAILURE" => simulate_failure(d, "picket|simulate-failure", &rest[1..]),
        _ => Reply::err(format!(
            "ERR unknown subcommand '{}'. Try PICKET HELP.",
            clip(sub)
        )),
    }
}

/// Ask a group task whether its master is down (and maybe for a vote):
/// `[down, leader or "*", leader epoch]`.
pub async fn is_down(h: &crate::group::GroupHandle, query: IsDownQuery) -> Reply {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if h.send(GroupMsg::IsDown { query, reply: tx }).await.is_err() {
        return Reply::err("ERR group task stopped");
    }
    match rx.await {
        Ok(Ok(r)) => Reply::from(r.to_frame()),
        Ok(Err(e)) => Reply::err(format!("ERR cannot persist the vote: {e}")),
        Err(_) => Reply::err("ERR group task stopped"),
    }
}

/// Sentinel's reply to a switchover that could not start or go on.
fn failover_error(group: &str, e: &FailoverError) -> Reply {
    Reply::err(match e {
        FailoverError::InProgress => "INPROG Failover already in progress".to_string(),
        FailoverError::AnotherLeader | FailoverError::NewerConfig => format!("INPROG {e}"),
        FailoverError::MasterDown => "ERR the master is down: a switchover needs a live master (an automatic failover will handle it)".to_string(),
        FailoverError::NoGoodReplica(NoGoodReplica::Unknown(a)) => {
            format!("NOGOODSLAVE {a} is not a known replica of {group}")
        }
        FailoverError::NoGoodReplica(n) => format!("NOGOODSLAVE {n}"),
        FailoverError::NotElected => "NOQUORUM could not win the election".to_string(),
        FailoverError::Persist(why) => format!("ERR cannot persist state: {why}"),
    })
}

/// Start a planned switchover of `group` (`PICKET FAILOVER`,
/// `SENTINEL FAILOVER`).
pub async fn switchover(d: &Daemon, group: &str, to: Option<Addr>) -> Reply {
    let Some(h) = d.group(group) else {
        return Reply::err("ERR No such master with that name");
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    if h.send(GroupMsg::Switchover { to, reply: tx })
        .await
        .is_err()
    {
        return Reply::err("ERR group task stopped");
    }
    match rx.await {
        Ok(Ok(())) => Reply::ok(),
        Ok(Err(e)) => failover_error(group, &e),
        Err(_) => Reply::err("ERR group task stopped"),
    }
}

/// The modes `SIMULATE-FAILURE` knows, for `HELP` and errors.
const FAILURE_MODES: [&str; 2] = ["crash-after-election", "crash-after-promotion"];

/// What a `SIMULATE-FAILURE` request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimulateFailure {
    /// List the modes.
    Help,
    /// Replace the crash flags with these ([`crate::context::CRASH_AFTER_ELECTION`],
    /// [`crate::context::CRASH_AFTER_PROMOTION`]; 0 for `none`).
    Set(u8),
}

/// Parse the modes after `SENTINEL SIMULATE-FAILURE` or `PICKET
/// SIMULATE-FAILURE`: any of `crash-after-election`,
/// `crash-after-promotion`, `none` (case-insensitive, combined), or `help`.
pub fn parse_simulate_failure(modes: &[String]) -> Result<SimulateFailure, String> {
    let mut flags = 0u8;
    for m in modes {
        match m.to_lowercase().as_str() {
            "crash-after-election" => flags |= crate::context::CRASH_AFTER_ELECTION,
            "crash-after-promotion" => flags |= crate::context::CRASH_AFTER_PROMOTION,
            "none" => {}
            "help" => return Ok(SimulateFailure::Help),
            // Sentinel's exact text (clients compare it); HELP lists the modes.
            _ => return Err("ERR Unknown failure simulation specified".into()),
        }
    }
    Ok(SimulateFailure::Set(flags))
}

/// `SENTINEL SIMULATE-FAILURE` and `PICKET SIMULATE-FAILURE` (`cmd` names
/// the form, for the arity error): crash tests make the daemon exit(99) at
/// the worst moments of a failover it leads. Refused unless
/// `daemon.enable_fault_injection` is set, so that no client can make a
/// production daemon exit.
pub fn simulate_failure(d: &Daemon, cmd: &str, modes: &[String]) -> Reply {
    if modes.is_empty() {
        return arity(cmd);
    }
    let flags = match parse_simulate_failure(modes) {
        Ok(SimulateFailure::Help) => {
            return Reply::Array(FAILURE_MODES.iter().map(Reply::bulk).collect());
        }
        Ok(SimulateFailure::Set(flags)) => flags,
        Err(e) => return Reply::err(e),
    };
    let enabled = d
        .config
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .daemon
        .enable_fault_injection;
    if !enabled {
        return Reply::err(
            "ERR fault injection is disabled: SIMULATE-FAILURE makes this daemon exit during a failover; set enable_fault_injection = true under [daemon] to allow it (crash tests only)",
        );
    }
    d.ctx
        .simulate_failure
        .store(flags, std::sync::atomic::Ordering::SeqCst);
    tracing::warn!(flags, "SIMULATE-FAILURE armed");
    Reply::ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{CRASH_AFTER_ELECTION, CRASH_AFTER_PROMOTION};

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn is_down_replies_keep_their_wire_form() {
        use crate::quorum::peers::IsDownReply;
        let vote = IsDownReply {
            down: true,
            leader: Some("picket-b".into()),
            leader_epoch: 7,
        };
        for resp3 in [false, true] {
            assert_eq!(
                &Reply::from(vote.to_frame()).to_bytes(resp3)[..],
                b"*3\r\n:1\r\n$8\r\npicket-b\r\n:7\r\n"
            );
            assert_eq!(
                &Reply::from(IsDownReply::not_down().to_frame()).to_bytes(resp3)[..],
                b"*3\r\n:0\r\n$1\r\n*\r\n:0\r\n"
            );
        }
    }

    #[test]
    fn one_parser_for_both_forms() {
        assert_eq!(
            parse_simulate_failure(&args(&["CRASH-AFTER-PROMOTION", "crash-after-election"])),
            Ok(SimulateFailure::Set(
                CRASH_AFTER_ELECTION | CRASH_AFTER_PROMOTION
            ))
        );
        assert_eq!(
            parse_simulate_failure(&args(&["none"])),
            Ok(SimulateFailure::Set(0))
        );
        assert_eq!(
            parse_simulate_failure(&args(&["help"])),
            Ok(SimulateFailure::Help)
        );
        assert_eq!(
            parse_simulate_failure(&args(&["none", "bogus"])),
            Err("ERR Unknown failure simulation specified".into())
        );
    }
}
