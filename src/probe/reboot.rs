//! Restarts: whether a server is a new process since its last INFO, and
//! whether a restarted master holds less than its replicas, so that letting
//! them resynchronise from it would wipe them.
//!
//! Pure functions over two INFO snapshots, fed by the group (`observe.rs`).
//!
//! What shows a restart, per flavour:
//! - Redis and Valkey: `run_id`, a new random value at every start.
//! - Dragonfly has no `run_id`; a master's `master_replid` is drawn anew at
//!   every start (and changes otherwise only when a replica is promoted,
//!   which a server that was and is a master has not been), and
//!   `uptime_in_seconds` starts again from 0. Either one going back shows a
//!   new process. The `process_id` does not: in a container it is 1 every
//!   time.
//!
//! What a restarted master holds against its replicas: a replica that
//! follows a history the master does not continue (neither its
//! `master_replid` nor its `master_replid2`, which Redis and Valkey fill
//! from the RDB file they loaded) can only take a full copy of the master;
//! when the master has fewer keys than such a replica, or a lower offset in
//! the same history, the copy loses data.

use std::time::Duration;

use super::info::{Flavour, InfoSnapshot, Role};

/// Why a server is taken for a new process: the text of `+reboot`.
pub fn restarted(before: &InfoSnapshot, after: &InfoSnapshot, between: Duration) -> Option<String> {
    if let (Some(a), Some(b)) = (&before.run_id, &after.run_id)
        && a != b
    {
        return Some(format!("run_id {a} -> {b}"));
    }
    // Dragonfly (or any server without run_id): a master whose replication
    // id changed while it stayed a master.
    if before.run_id.is_none()
        && after.run_id.is_none()
        && before.role == Role::Master
        && after.role == Role::Master
        && let (Some(a), Some(b)) = (&before.replid, &after.replid)
        && a != b
    {
        return Some(format!("master_replid {a} -> {b}"));
    }
    // The uptime went back: more than the rounding of whole seconds.
    if let (Some(a), Some(b)) = (before.uptime_secs, after.uptime_secs)
        && b + 1 < a.saturating_add(between.as_secs())
        && b < a
    {
        return Some(format!("uptime_in_seconds {a} -> {b}"));
    }
    None
}

/// What tells a process from one started since at the same address, as
/// read when it was chosen (a failover's candidate): `run_id` on Redis and
/// Valkey; `uptime_in_seconds` on Dragonfly, which has no `run_id` (its
/// replicas show their master's `master_replid`, and a promotion draws
/// none, so the replication id cannot tell).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    /// `run_id`, where the server has one.
    pub run_id: Option<String>,
    /// `uptime_in_seconds` at its last full read.
    pub uptime_secs: Option<u64>,
}

impl Identity {
    /// The identity `info` shows.
    pub fn of(info: &InfoSnapshot) -> Identity {
        Identity {
            run_id: info.run_id.clone(),
            uptime_secs: info.uptime_secs,
        }
    }

    /// Whether the identity says anything (a check is worth a round trip).
    pub fn known(&self) -> bool {
        self.run_id.is_some() || self.uptime_secs.is_some()
    }

    /// Why `now`, read later, is another process, if it is. The uptime
    /// only grows in one process: read in whole seconds, a restart within
    /// the first two seconds of the process chosen does not show.
    pub fn changed(&self, now: &Identity) -> Option<String> {
        if let Some(a) = &self.run_id {
            return (now.run_id.as_ref() != Some(a)).then(|| {
                format!(
                    "run_id {a} -> {}",
                    now.run_id.as_deref().unwrap_or("unknown")
                )
            });
        }
        match (self.uptime_secs, now.uptime_secs) {
            (Some(a), Some(b)) if b + 1 < a => Some(format!("uptime_in_seconds {a} -> {b}")),
            _ => None,
        }
    }
}

/// What a replica held when it was last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The replica, for the reason's text.
    pub name: String,
    /// The history it follows (`master_replid`).
    pub replid: Option<String>,
    /// Its offset in that history.
    pub offset: Option<i64>,
    /// Its keys.
    pub keys: Option<u64>,
}

impl Holding {
    /// What `info`, a replica's last INFO, says it holds.
    pub fn of(name: String, info: &InfoSnapshot) -> Holding {
        Holding {
            name,
            replid: info.replid.clone(),
            offset: info.replica_offset.or(info.master_offset),
            keys: info.keys,
        }
    }
}

/// The verdict on a restarted master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It holds at least what every replica holds (a clean restart with
    /// its data, or replicas that hold nothing more): it stays the master.
    Keeps,
    /// Still loading its data: judged when it is done.
    Loading,
    /// A replica holds more: the reason, for `+sdown ... #reboot`.
    Behind(String),
}

/// Judge the restarted master `master` (a full INFO read on its new
/// connection) against what its replicas held.
pub fn judge(master: &InfoSnapshot, replicas: &[Holding]) -> Verdict {
    if master.loading {
        return Verdict::Loading;
    }
    for r in replicas {
        let continued = r.replid.as_ref().is_some_and(|id| {
            master.replid.as_ref() == Some(id) || master.replid2.as_ref() == Some(id)
        });
        if let (Some(mine), Some(theirs)) = (master.keys, r.keys)
            && mine < theirs
            && !continued
        {
            return Verdict::Behind(format!(
                "{} keys against {theirs} on {} (a new replication history)",
                mine, r.name
            ));
        }
        // In the same history (Redis/Valkey): a lower offset is less data,
        // whatever the keys (overwritten values count the same).
        if continued
            && master.flavour != Flavour::Dragonfly
            && let (Some(mine), Some(theirs)) = (master.master_offset, r.offset)
            && mine < theirs
        {
            return Verdict::Behind(format!("offset {mine} against {theirs} on {}", r.name));
        }
        // A new history and no keys to compare: a full copy of a master
        // that has no offset in the replica's history is all a replica
        // can get, and it holds data (an offset) the master never had.
        if !continued
            && (master.keys.is_none() || r.keys.is_none())
            && r.offset.is_some_and(|o| o > 0)
            && master
                .master_offset
                .is_none_or(|o| o < r.offset.unwrap_or(0))
        {
            return Verdict::Behind(format!(
                "a new replication history without the data {} holds",
                r.name
            ));
        }
    }
    Verdict::Keeps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master(run_id: Option<&str>, replid: &str, keys: u64) -> InfoSnapshot {
        InfoSnapshot {
            run_id: run_id.map(str::to_owned),
            role: Role::Master,
            replid: Some(replid.to_owned()),
            keys: Some(keys),
            master_offset: Some(0),
            uptime_secs: Some(0),
            ..InfoSnapshot::default()
        }
    }

    fn replica(replid: &str, offset: i64, keys: u64) -> Holding {
        Holding {
            name: "r1".into(),
            replid: Some(replid.into()),
            offset: Some(offset),
            keys: Some(keys),
        }
    }

    #[test]
    fn a_chosen_process_is_told_from_one_started_since() {
        let id = |run_id: Option<&str>, up: u64| Identity {
            run_id: run_id.map(str::to_owned),
            uptime_secs: Some(up),
        };
        // Redis: the run_id decides, whatever the uptime.
        assert_eq!(id(Some("a"), 50).changed(&id(Some("a"), 0)), None);
        assert!(id(Some("a"), 0).changed(&id(Some("b"), 90)).is_some());
        assert!(id(Some("a"), 0).changed(&id(None, 90)).is_some());
        // Dragonfly: the uptime went back, beyond the rounding.
        assert_eq!(id(None, 50).changed(&id(None, 57)), None);
        assert_eq!(id(None, 50).changed(&id(None, 49)), None);
        let why = id(None, 50).changed(&id(None, 0)).expect("a restart");
        assert!(why.contains("uptime_in_seconds 50 -> 0"), "{why}");
        assert_eq!(id(None, 1).changed(&id(None, 0)), None);
        assert!(!Identity::default().known());
    }

    #[test]
    fn a_new_run_id_is_a_restart() {
        let a = master(Some("aaa"), "h1", 10);
        let b = master(Some("bbb"), "h2", 0);
        let why = restarted(&a, &b, Duration::from_secs(1)).unwrap();
        assert!(why.contains("run_id aaa -> bbb"), "{why}");
        assert_eq!(restarted(&a, &a, Duration::from_secs(1)), None);
    }

    #[test]
    fn dragonfly_restarts_show_by_replid_or_uptime() {
        let mut a = master(None, "h1", 10);
        a.flavour = Flavour::Dragonfly;
        a.uptime_secs = Some(500);
        let mut b = a.clone();
        b.replid = Some("h2".into());
        b.uptime_secs = Some(0);
        assert!(restarted(&a, &b, Duration::from_secs(1)).is_some());
        // Same replid, uptime back from 500 to 3 over one second.
        let mut c = a.clone();
        c.uptime_secs = Some(3);
        let why = restarted(&a, &c, Duration::from_secs(1)).unwrap();
        assert!(why.contains("uptime"), "{why}");
        // The uptime moving on is no restart, nor is a replica's replid
        // changing (it follows a new master).
        let mut d = a.clone();
        d.uptime_secs = Some(502);
        assert_eq!(restarted(&a, &d, Duration::from_secs(2)), None);
        let mut r1 = a.clone();
        r1.role = Role::Replica;
        let mut r2 = r1.clone();
        r2.replid = Some("h9".into());
        r2.uptime_secs = Some(501);
        assert_eq!(restarted(&r1, &r2, Duration::from_secs(1)), None);
    }

    #[test]
    fn an_empty_master_with_a_new_history_is_behind() {
        let m = master(Some("b"), "new", 0);
        let v = judge(&m, &[replica("old", 5000, 20_000)]);
        assert!(
            matches!(v, Verdict::Behind(ref why) if why.contains("0 keys against 20000")),
            "{v:?}"
        );
    }

    #[test]
    fn a_master_that_loaded_its_rdb_continues_the_history() {
        // Redis after SHUTDOWN and a start from its RDB: a new replid, the
        // old one as replid2, the offset where it was.
        let mut m = master(Some("b"), "new", 20_000);
        m.replid2 = Some("old".into());
        m.master_offset = Some(5000);
        assert_eq!(judge(&m, &[replica("old", 5000, 20_000)]), Verdict::Keeps);
        // The same, but the RDB was older than what the replica holds.
        m.master_offset = Some(4000);
        m.keys = Some(19_000);
        assert!(matches!(
            judge(&m, &[replica("old", 5000, 20_000)]),
            Verdict::Behind(_)
        ));
    }

    #[test]
    fn a_loading_master_is_judged_later() {
        let mut m = master(Some("b"), "new", 10);
        m.loading = true;
        assert_eq!(judge(&m, &[replica("old", 5000, 20_000)]), Verdict::Loading);
    }

    #[test]
    fn replicas_that_hold_nothing_more_keep_the_master() {
        // A Dragonfly master restarted from its snapshot with every key.
        let mut m = master(None, "new", 20_000);
        m.flavour = Flavour::Dragonfly;
        m.master_offset = None;
        assert_eq!(judge(&m, &[replica("old", 7, 20_000)]), Verdict::Keeps);
        // No replica at all.
        assert_eq!(judge(&m, &[]), Verdict::Keeps);
    }

    #[test]
    fn without_keys_a_replica_with_an_offset_in_another_history_is_more() {
        let mut m = master(Some("b"), "new", 0);
        m.keys = None;
        let mut r = replica("old", 5000, 0);
        r.keys = None;
        assert!(matches!(judge(&m, &[r.clone()]), Verdict::Behind(_)));
        r.offset = Some(0);
        assert_eq!(judge(&m, &[r]), Verdict::Keeps);
    }
}
