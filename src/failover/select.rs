//! Replica selection (failover step 4, ARCHITECTURE.md).
//!
//! Excluded: replicas this daemon sees down or disconnected, still loading
//! or in full sync, with priority 0, with stale INFO, or whose link to the
//! master was down for much longer than the master itself. Ordered by lower
//! priority, then higher replication offset (an unreadable offset is
//! unknown and ranks after every known one, never as 0), then address.

use std::cmp::Ordering;
use std::time::Duration;

use serde::Serialize;

use crate::addr::Addr;
use crate::probe::Role;

/// What selection needs to know about one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The replica.
    pub addr: Addr,
    /// SDOWN for this daemon.
    pub sdown: bool,
    /// Probe connection is up.
    pub connected: bool,
    /// Time since the last valid PING reply.
    pub last_ok_age: Duration,
    /// Time since the last INFO (None: never).
    pub info_age: Option<Duration>,
    /// Reported role.
    pub role: Role,
    /// `slave_priority` (None: not reported; Redis' default 100 applies).
    pub priority: Option<u32>,
    /// `slave_repl_offset` (None: unknown).
    pub offset: Option<i64>,
    /// `loading:1`.
    pub loading: bool,
    /// `master_sync_in_progress:1`.
    pub sync_in_progress: bool,
    /// `master_link_down_since_seconds`.
    pub link_down_since: Option<Duration>,
    /// Its last reply was `-BUSY` (a script runs).
    pub busy: bool,
    /// It follows the replication history of a master that restarted
    /// with less than its replicas held: it has taken (or is taking) a
    /// copy of that server, not the data the others hold.
    pub copied_restarted_master: bool,
}

/// Why a replica was not chosen (for logs and status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Exclusion {
    /// SDOWN.
    Down,
    /// No connection.
    Disconnected,
    /// No recent valid PING reply.
    NoRecentReply,
    /// INFO missing or too old.
    StaleInfo,
    /// Loading its dataset or in full sync.
    Loading,
    /// `replica-priority 0`: never promoted.
    PriorityZero,
    /// Link to the master down for too long.
    LongDisconnected,
    /// Reports neither master nor replica.
    UnknownRole,
    /// Answers `-BUSY`: a script runs on it.
    Busy,
    /// Took a copy of a master that restarted with less data.
    CopiedRestartedMaster,
    /// Reports `role:master`: a switchover hands over to a replica only.
    NotAReplica,
    /// Reports another master than the group's: a switchover hands over
    /// only to a replica of the master.
    FollowsAnotherMaster,
}

/// Limits used by the exclusions.
#[derive(Debug, Clone, Copy)]
pub struct SelectionLimits {
    /// Oldest acceptable valid PING reply.
    pub max_reply_age: Duration,
    /// Oldest acceptable INFO.
    pub max_info_age: Duration,
    /// Longest acceptable `master_link_down_since_seconds`.
    pub max_link_down: Duration,
}

impl SelectionLimits {
    /// Sentinel's rules scaled to picket's probe cadence: replies and INFO
    /// no older than 5 ping periods (at least 2 s), link down no longer than
    /// the master has been down plus 10 × `down_after`.
    pub fn new(ping_period: Duration, down_after: Duration, master_down_for: Duration) -> Self {
        let recent = (ping_period * 5).max(Duration::from_secs(2));
        SelectionLimits {
            max_reply_age: recent,
            max_info_age: recent,
            max_link_down: master_down_for + down_after * 10,
        }
    }
}

/// Why `c` cannot be promoted, if it cannot.
pub fn exclusion(c: &Candidate, limits: &SelectionLimits) -> Option<Exclusion> {
    if c.sdown {
        return Some(Exclusion::Down);
    }
    if !c.connected {
        return Some(Exclusion::Disconnected);
    }
    if c.busy {
        return Some(Exclusion::Busy);
    }
    if c.last_ok_age > limits.max_reply_age {
        return Some(Exclusion::NoRecentReply);
    }
    match c.info_age {
        Some(age) if age <= limits.max_info_age => {}
        _ => return Some(Exclusion::StaleInfo),
    }
    if c.role == Role::Unknown {
        return Some(Exclusion::UnknownRole);
    }
    if c.loading || c.sync_in_progress {
        return Some(Exclusion::Loading);
    }
    if c.copied_restarted_master {
        return Some(Exclusion::CopiedRestartedMaster);
    }
    if c.priority == Some(0) {
        return Some(Exclusion::PriorityZero);
    }
    if c.role == Role::Replica
        && let Some(down) = c.link_down_since
        && down > limits.max_link_down
    {
        return Some(Exclusion::LongDisconnected);
    }
    None
}

/// `best_replica`: the highest offset among the eligible candidates that
/// report `role:replica`.
fn rank(a: &Candidate, b: &Candidate, best_replica: Option<i64>) -> Ordering {
    // A candidate that already reports role:master was promoted by an
    // earlier attempt of this failover (its leader died): resume with it
    // rather than promote a second one. Not one that holds less than a
    // replica: that is a server that came back as a master on its own (an
    // old master, its demotion not read yet), and choosing it for being a
    // master lost what the replica held (the simulation with the
    // network's faults: a returning old master chosen over a replica
    // ahead of it). A master's offset is its own replication offset.
    let promoted = |c: &Candidate| {
        c.role == Role::Master
            && c.offset
                .is_none_or(|o| best_replica.is_none_or(|best| o >= best))
    };
    promoted(b)
        .cmp(&promoted(a))
        .then_with(|| a.priority.unwrap_or(100).cmp(&b.priority.unwrap_or(100)))
        .then_with(|| match (a.offset, b.offset) {
            (Some(x), Some(y))
                if crate::mutation::planted(crate::mutation::Mutation::PromoteLaggingReplica) =>
            {
                x.cmp(&y)
            }
            (Some(x), Some(y)) => y.cmp(&x),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| a.addr.cmp(&b.addr))
}

/// The result of a selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The best replica, if any qualifies.
    pub chosen: Option<Addr>,
    /// Every excluded replica with the reason.
    pub excluded: Vec<(Addr, Exclusion)>,
}

/// Choose the replica to promote.
pub fn select(candidates: &[Candidate], limits: &SelectionLimits) -> Selection {
    let mut ok: Vec<&Candidate> = Vec::new();
    let mut excluded = Vec::new();
    for c in candidates {
        match exclusion(c, limits) {
            Some(why) => excluded.push((c.addr.clone(), why)),
            None => ok.push(c),
        }
    }
    let best_replica = ok
        .iter()
        .filter(|c| c.role == Role::Replica)
        .filter_map(|c| c.offset)
        .max();
    ok.sort_by(|a, b| rank(a, b, best_replica));
    Selection {
        chosen: ok.first().map(|c| c.addr.clone()),
        excluded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(port: u16, priority: Option<u32>, offset: Option<i64>) -> Candidate {
        Candidate {
            copied_restarted_master: false,
            addr: Addr::new("127.0.0.1", port),
            sdown: false,
            connected: true,
            last_ok_age: Duration::from_millis(100),
            info_age: Some(Duration::from_millis(500)),
            role: Role::Replica,
            priority,
            offset,
            loading: false,
            sync_in_progress: false,
            link_down_since: Some(Duration::from_secs(1)),
            busy: false,
        }
    }

    fn limits() -> SelectionLimits {
        SelectionLimits::new(
            Duration::from_millis(250),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
    }

    #[test]
    fn lower_priority_wins_then_offset_then_address() {
        let cs = vec![
            replica(1, Some(100), Some(500)),
            replica(2, Some(10), Some(100)),
            replica(3, Some(10), Some(200)),
            replica(4, Some(10), Some(200)),
        ];
        assert_eq!(
            select(&cs, &limits()).chosen,
            Some(Addr::new("127.0.0.1", 3))
        );
    }

    #[test]
    fn a_replica_that_copied_a_restarted_master_is_never_chosen() {
        // It has the higher offset, but in the restarted master's new
        // history: what it holds is that server's copy.
        let mut copied = replica(1, Some(100), Some(900));
        copied.copied_restarted_master = true;
        let cs = vec![copied, replica(2, Some(100), Some(500))];
        let sel = select(&cs, &limits());
        assert_eq!(sel.chosen, Some(Addr::new("127.0.0.1", 2)));
        assert_eq!(
            sel.excluded,
            vec![(Addr::new("127.0.0.1", 1), Exclusion::CopiedRestartedMaster)]
        );
    }

    #[test]
    fn unknown_offset_is_not_zero_and_ranks_last() {
        let cs = vec![replica(1, None, None), replica(2, None, Some(0))];
        // A known offset of 0 beats an unknown one.
        assert_eq!(
            select(&cs, &limits()).chosen,
            Some(Addr::new("127.0.0.1", 2))
        );
        // Alone, an unknown offset is still eligible.
        let cs = vec![replica(1, None, None)];
        assert_eq!(
            select(&cs, &limits()).chosen,
            Some(Addr::new("127.0.0.1", 1))
        );
    }

    #[test]
    fn exclusions() {
        let l = limits();
        let mut c = replica(1, Some(0), Some(1));
        assert_eq!(exclusion(&c, &l), Some(Exclusion::PriorityZero));
        c.priority = None;
        c.sdown = true;
        assert_eq!(exclusion(&c, &l), Some(Exclusion::Down));
        c.sdown = false;
        c.connected = false;
        assert_eq!(exclusion(&c, &l), Some(Exclusion::Disconnected));
        c.connected = true;
        c.busy = true;
        assert_eq!(exclusion(&c, &l), Some(Exclusion::Busy));
        c.busy = false;
        c.loading = true;
        assert_eq!(exclusion(&c, &l), Some(Exclusion::Loading));
        c.loading = false;
        c.sync_in_progress = true;
        assert_eq!(exclusion(&c, &l), Some(Exclusion::Loading));
        c.sync_in_progress = false;
        c.info_age = None;
        assert_eq!(exclusion(&c, &l), Some(Exclusion::StaleInfo));
        c.info_age = Some(Duration::from_secs(60));
        assert_eq!(exclusion(&c, &l), Some(Exclusion::StaleInfo));
        c.info_age = Some(Duration::from_millis(1));
        c.last_ok_age = Duration::from_secs(60);
        assert_eq!(exclusion(&c, &l), Some(Exclusion::NoRecentReply));
        c.last_ok_age = Duration::ZERO;
        c.link_down_since = Some(Duration::from_secs(3600));
        assert_eq!(exclusion(&c, &l), Some(Exclusion::LongDisconnected));
        c.link_down_since = None;
        assert_eq!(exclusion(&c, &l), None);
    }

    #[test]
    fn priority_zero_is_never_promoted_even_alone() {
        let cs = vec![replica(1, Some(0), Some(1_000_000))];
        let s = select(&cs, &limits());
        assert_eq!(s.chosen, None);
        assert_eq!(
            s.excluded,
            vec![(Addr::new("127.0.0.1", 1), Exclusion::PriorityZero)]
        );
    }

    #[test]
    fn a_master_behind_a_replica_is_not_taken_for_an_earlier_promotion() {
        let mut returned = replica(9, Some(100), Some(41));
        returned.role = Role::Master;
        let cs = vec![returned, replica(2, Some(100), Some(1000))];
        assert_eq!(
            select(&cs, &limits()).chosen,
            Some(Addr::new("127.0.0.1", 2))
        );
        // Promoted by an earlier attempt: at the offset it had, or beyond.
        let mut promoted = replica(9, Some(100), Some(1000));
        promoted.role = Role::Master;
        let cs = vec![replica(2, Some(100), Some(1000)), promoted];
        assert_eq!(
            select(&cs, &limits()).chosen,
            Some(Addr::new("127.0.0.1", 9))
        );
    }

    #[test]
    fn an_already_promoted_replica_is_resumed() {
        let mut promoted = replica(9, Some(100), None);
        promoted.role = Role::Master;
        let cs = vec![replica(1, Some(1), Some(1000)), promoted];
        assert_eq!(
            select(&cs, &limits()).chosen,
            Some(Addr::new("127.0.0.1", 9))
        );
    }
}
