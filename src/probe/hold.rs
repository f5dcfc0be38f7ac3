//! The sync hold: the first thing a probe does on a master it reconnects
//! to after losing it, before it even reads INFO.
//!
//! A Redis or Valkey replica whose master died reconnects at its own
//! replication cron, once a second. If the master's process was restarted
//! empty at the same address (a supervisor's restart after a crash or an
//! OOM kill), the first replica to reconnect asks for a full copy and
//! drops all it holds as soon as the copy, of nothing, arrives: a few
//! milliseconds with disk-based replication or with
//! `repl-diskless-sync-delay 0`. picket's judgment of the restart (INFO,
//! then `CLIENT PAUSE ... ALL`) takes a reconnect interval and a round trip
//! or two; a replica whose cron fired in that window was lost. One chaos
//! run in seven lost 500 keys so.
//!
//! So a probe that reconnects to its group's master after losing it first
//! makes every full copy from that server wait: `repl-diskless-sync yes`
//! with a `repl-diskless-sync-delay` of the hold, and
//! `repl-diskless-sync-max-replicas 0` (Redis 7, Valkey: a count of
//! waiting replicas that would start the copy early). A replica that asks
//! for a copy then waits (`wait_bgsave`) with its data intact, until the
//! failover re-points it, or the hold is released. A partial resync (the
//! same process, or a restart that loaded the replicas' history) does not
//! copy anything and is not held. What the settings were is read first and
//! given to the group, which sets them back once the server is judged: at
//! once for a server that did not restart, or restarted with its data; after
//! its demotion for one that came back with less.
//!
//! Several daemons hold the same server at once: a daemon that finds the
//! hold's own values (set by another daemon a moment before) has nothing to
//! restore and leaves that to the daemon that found the server's own.
//!
//! Not for Dragonfly (no such settings: its replicas are protected by the
//! failover coming first), nor for a group with `flush_on_failover` (its
//! users want an empty master after a failure).

use std::time::Duration;

use redis_protocol::resp2::types::BytesFrame;
use tokio::time::Instant;

use super::info::Role;
use crate::resp::{Connection, RespError, frame_text};

/// The settings the hold changes, in the order they are set: the delay
/// before the switch to diskless, so that no copy starts in between with
/// the server's own delay.
pub const SETTINGS: [&str; 3] = [
    "repl-diskless-sync-delay",
    "repl-diskless-sync-max-replicas",
    "repl-diskless-sync",
];

/// What a hold found and set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The server's own values, to be set back when the hold is released;
    /// None when they were already a hold's (another daemon's).
    pub restore: Option<Vec<(String, String)>>,
}

/// The values a hold of `secs` seconds gives the settings the server has
/// (`repl-diskless-sync-max-replicas` is unknown before Redis 7).
pub fn hold_values(found: &[(String, String)], secs: u64) -> Vec<(String, String)> {
    SETTINGS
        .iter()
        .filter(|name| found.iter().any(|(n, _)| n == *name))
        .map(|name| {
            let v = match *name {
                "repl-diskless-sync-delay" => secs.to_string(),
                "repl-diskless-sync-max-replicas" => "0".to_owned(),
                _ => "yes".to_owned(),
            };
            ((*name).to_owned(), v)
        })
        .collect()
}

/// What to set back later, given what was found: nothing when it is
/// exactly a hold of `secs` (another daemon's, set a moment before; or the
/// server's own, which then needs nothing set back either).
pub fn to_restore(found: &[(String, String)], secs: u64) -> Option<Vec<(String, String)>> {
    let held = hold_values(found, secs);
    let same = held.len() == found.len()
        && held
            .iter()
            .all(|(n, v)| found.iter().any(|(fname, fv)| fname == n && fv == v));
    (!same).then(|| found.to_vec())
}

/// The whole seconds a hold of `hold` lasts (the server counts whole
/// seconds of a waiting replica's idleness).
pub fn secs(hold: Duration) -> u64 {
    (hold.as_secs() + u64::from(hold.subsec_nanos() > 0)).max(1)
}

/// The pairs of a `CONFIG GET` reply (RESP2: a flat array of names and
/// values), restricted to [`SETTINGS`].
fn pairs(reply: &BytesFrame) -> Vec<(String, String)> {
    let BytesFrame::Array(items) = reply else {
        return Vec::new();
    };
    items
        .chunks(2)
        .filter_map(|kv| {
            let name = frame_text(kv.first()?)?;
            let value = frame_text(kv.get(1)?)?;
            SETTINGS.contains(&name.as_str()).then_some((name, value))
        })
        .collect()
}

/// Why a hold could not be put on.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    /// The server refused or failed a command (CONFIG renamed, an ACL
    /// without `+config`, a timeout).
    #[error("CONFIG {0}")]
    Command(#[source] RespError),
    /// The server has none of the settings (not Redis or Valkey).
    #[error("CONFIG GET repl-diskless-sync* found none of {SETTINGS:?}")]
    NoSettings,
}

/// Hold every full copy from the server on `c` for `hold`: read the
/// settings, then set them (one `CONFIG SET` each: servers before Redis 7
/// take one per command).
pub async fn apply(
    c: &mut Connection,
    hold: Duration,
    timeout: Duration,
) -> Result<Held, HoldError> {
    let secs = secs(hold);
    let reply = c
        .call_timeout(["CONFIG", "GET", "repl-diskless-sync*"], timeout)
        .await
        .map_err(HoldError::Command)?;
    let found = pairs(&reply);
    if found.is_empty() {
        return Err(HoldError::NoSettings);
    }
    let restore = to_restore(&found, secs);
    if restore.is_some() {
        set(c, &hold_values(&found, secs), timeout)
            .await
            .map_err(HoldError::Command)?;
    }
    Ok(Held { restore })
}

/// Set `pairs` in one `CONFIG SET` (atomic since Redis 7: another daemon's
/// `CONFIG GET` never sees half a hold and takes it for the server's own
/// settings), or, on a server that takes one setting per command, one by
/// one in [`SETTINGS`]' order.
async fn set(
    c: &mut Connection,
    pairs: &[(String, String)],
    timeout: Duration,
) -> Result<(), RespError> {
    let mut args = vec!["CONFIG", "SET"];
    for (n, v) in pairs {
        args.extend([n.as_str(), v.as_str()]);
    }
    match c.call_timeout(&args, timeout).await {
        Ok(_) => Ok(()),
        Err(RespError::Server(_)) if pairs.len() > 1 => {
            for name in SETTINGS {
                if let Some((n, v)) = pairs.iter().find(|(n, _)| n == name) {
                    c.call_timeout(["CONFIG", "SET", n.as_str(), v.as_str()], timeout)
                        .await?;
                }
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Set back what a hold changed (the pairs [`Held::restore`] kept); one
/// by one (before Redis 7), the switch back to the server's own mode comes
/// last, once its delay is its own.
pub async fn release(
    c: &mut Connection,
    restore: &[(String, String)],
    timeout: Duration,
) -> Result<(), RespError> {
    set(c, restore, timeout).await
}

/// What the group knows of a server it holds, for [`release_due`].
#[derive(Debug, Clone, Copy)]
pub struct Standing {
    /// When the hold was put on.
    pub held_at: Instant,
    /// When the server lets the copies go on its own.
    pub until: Instant,
    /// When its INFO was last read.
    pub info_at: Option<Instant>,
    /// A restart was seen and is still to be judged (it is loading).
    pub unjudged: bool,
    /// It was judged to have come back with less than its replicas.
    pub behind: bool,
    /// It is the group's master.
    pub is_master: bool,
    /// The role its last INFO reported.
    pub role: Option<Role>,
}

/// Whether the hold on a server is to be released at `now`: once an INFO
/// read since the hold has judged it, at once if it did not restart or
/// kept its data; if it came back with less (or was failed over
/// meanwhile), only once it is a replica of the new master (its own
/// replicas re-pointed first, by the failover); in any case once the
/// server lets the copies go on its own.
pub fn release_due(s: &Standing, now: Instant) -> bool {
    if now >= s.until {
        return true;
    }
    let judged = s.info_at.is_some_and(|t| t >= s.held_at) && !s.unjudged;
    if !judged {
        return false;
    }
    if s.behind || !s.is_master {
        return !s.is_master && s.role == Some(Role::Replica);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standing(now: Instant) -> Standing {
        Standing {
            held_at: now,
            until: now + Duration::from_secs(3),
            info_at: None,
            unjudged: false,
            behind: false,
            is_master: true,
            role: Some(Role::Master),
        }
    }

    #[test]
    fn a_server_that_did_not_restart_or_kept_its_data_is_released_at_its_first_info() {
        let t0 = Instant::now();
        let mut s = standing(t0);
        // Nothing read since the hold: kept (an INFO from before does not
        // count).
        s.info_at = Some(t0 - Duration::from_millis(1));
        assert!(!release_due(&s, t0 + Duration::from_millis(5)));
        s.info_at = Some(t0 + Duration::from_millis(2));
        assert!(release_due(&s, t0 + Duration::from_millis(5)));
    }

    #[test]
    fn a_loading_server_is_released_once_judged() {
        let t0 = Instant::now();
        let mut s = standing(t0);
        s.info_at = Some(t0 + Duration::from_millis(2));
        s.unjudged = true;
        assert!(!release_due(&s, t0 + Duration::from_secs(1)));
        s.unjudged = false;
        assert!(release_due(&s, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn a_server_back_with_less_is_released_once_it_is_a_replica_of_the_new_master() {
        let t0 = Instant::now();
        let mut s = standing(t0);
        s.info_at = Some(t0 + Duration::from_millis(2));
        s.behind = true;
        let t = t0 + Duration::from_millis(500);
        assert!(!release_due(&s, t), "still the master: its replicas wait");
        // Failed over, not yet demoted.
        s.is_master = false;
        assert!(!release_due(&s, t));
        s.role = Some(Role::Replica);
        assert!(release_due(&s, t));
        // A failover for another reason meanwhile: the same.
        s.behind = false;
        s.role = Some(Role::Master);
        assert!(!release_due(&s, t));
    }

    #[test]
    fn every_hold_is_released_when_the_server_would_let_the_copies_go() {
        let t0 = Instant::now();
        let mut s = standing(t0);
        s.info_at = Some(t0 + Duration::from_millis(2));
        s.behind = true;
        assert!(!release_due(&s, s.until - Duration::from_millis(1)));
        assert!(release_due(&s, s.until));
        // Not even read since: released all the same.
        s.info_at = None;
        assert!(release_due(&s, s.until));
    }

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn the_servers_own_settings_are_kept_to_restore() {
        let found = kv(&[
            ("repl-diskless-sync", "no"),
            ("repl-diskless-sync-delay", "5"),
            ("repl-diskless-sync-max-replicas", "0"),
        ]);
        assert_eq!(to_restore(&found, 2), Some(found.clone()));
        assert_eq!(
            hold_values(&found, 2),
            kv(&[
                ("repl-diskless-sync-delay", "2"),
                ("repl-diskless-sync-max-replicas", "0"),
                ("repl-diskless-sync", "yes"),
            ])
        );
    }

    #[test]
    fn another_daemons_hold_is_not_taken_for_the_servers_settings() {
        let held = kv(&[
            ("repl-diskless-sync", "yes"),
            ("repl-diskless-sync-delay", "2"),
            ("repl-diskless-sync-max-replicas", "0"),
        ]);
        assert_eq!(to_restore(&held, 2), None);
        // A hold of another length is not this daemon's to recognise: its
        // values are restored as found (another daemon's own hold length
        // would only come from another down_after).
        assert_eq!(to_restore(&held, 3), Some(held.clone()));
    }

    #[test]
    fn servers_before_redis_7_have_no_max_replicas() {
        let found = kv(&[
            ("repl-diskless-sync", "yes"),
            ("repl-diskless-sync-delay", "5"),
        ]);
        assert_eq!(
            hold_values(&found, 4),
            kv(&[
                ("repl-diskless-sync-delay", "4"),
                ("repl-diskless-sync", "yes")
            ])
        );
        assert!(to_restore(&found, 4).is_some());
    }

    #[test]
    fn a_config_get_reply_gives_only_the_holds_settings() {
        let bulk = |s: &str| BytesFrame::BulkString(s.as_bytes().to_vec().into());
        let reply = BytesFrame::Array(vec![
            bulk("repl-diskless-sync"),
            bulk("no"),
            bulk("repl-diskless-sync-delay"),
            bulk("5"),
            bulk("repl-diskless-sync-period"),
            bulk("1"),
            bulk("dangling"),
        ]);
        assert_eq!(
            pairs(&reply),
            kv(&[
                ("repl-diskless-sync", "no"),
                ("repl-diskless-sync-delay", "5")
            ])
        );
        assert!(pairs(&BytesFrame::Null).is_empty());
    }

    #[test]
    fn a_hold_lasts_whole_seconds_and_at_least_one() {
        assert_eq!(secs(Duration::from_millis(300)), 1);
        assert_eq!(secs(Duration::from_secs(2)), 2);
        assert_eq!(secs(Duration::from_millis(2500)), 3);
    }
}
