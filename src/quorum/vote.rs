//! The voter's rules (invariant 1, docs/reliability.md): who may get a vote, one
//! vote per group and epoch, and the epoch of a new election. Pure; the
//! state store applies them to the persisted record, and the simulation
//! to its in-memory one.

use crate::addr::Addr;
use crate::quorum::peers::IsDownQuery;

/// Whether a vote request may be considered at all: the asker means this
/// daemon's master and is not behind its config. A candidate with a stale
/// view would promote a replica of a master that is no longer current.
///
/// One exception: an asker whose config is newer than this daemon's, and
/// whose master this daemon sees down or reporting `role:slave`
/// (`its_master_down`). That is a config this daemon refused to adopt, as
/// its master no longer reports `role:master` (a daemon that had not heard
/// of it demoted that master as a stray): refusing the vote as well left
/// the group split for good, the newer config's leader unable to fail its
/// master over and the others unwilling to adopt it (the simulation with
/// the network's faults, seeds 234, 271 and 374). Sentinel votes on the
/// epoch alone.
pub fn may_vote(q: &IsDownQuery, master: &Addr, config_epoch: u64, its_master_down: bool) -> bool {
    q.candidate.is_some()
        && ((q.master == *master && q.config_epoch >= config_epoch)
            || (q.config_epoch > config_epoch && its_master_down))
}

/// A daemon's vote in one group, as persisted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VoteRecord {
    /// The epoch of the last vote.
    pub vote_epoch: u64,
    /// Whom it voted for then (a daemon id).
    pub voted_for: Option<String>,
}

/// The outcome of a vote request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vote {
    /// Whom this daemon voted for in `epoch` (None: nobody).
    pub leader: Option<String>,
    /// The epoch of that vote.
    pub epoch: u64,
}

/// Sentinel's vote rule: one vote per (group, epoch), never in an epoch
/// below the current one; the current epoch rises to the one asked.
/// Returns the vote on record (possibly an earlier one) and whether the
/// state changed (then it must be durable before the answer goes out).
pub fn cast_vote(
    current_epoch: &mut u64,
    record: &mut VoteRecord,
    epoch: u64,
    candidate: &str,
) -> (Vote, bool) {
    let mut changed = false;
    if epoch > *current_epoch {
        *current_epoch = epoch;
        changed = true;
    }
    if record.vote_epoch < epoch && *current_epoch <= epoch {
        record.vote_epoch = epoch;
        record.voted_for = Some(candidate.to_string());
        changed = true;
    }
    let vote = Vote {
        leader: record.voted_for.clone(),
        epoch: record.vote_epoch,
    };
    (vote, changed)
}

/// A new epoch for an election of this daemon, with its own vote in it.
pub fn new_epoch(current_epoch: &mut u64, record: &mut VoteRecord, id: &str) -> u64 {
    *current_epoch += 1;
    record.vote_epoch = *current_epoch;
    record.voted_for = Some(id.to_string());
    *current_epoch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(p: u16) -> Addr {
        Addr::new("127.0.0.1", p)
    }

    #[test]
    fn one_vote_per_epoch_never_below_the_current_one() {
        let mut current = 0;
        let mut rec = VoteRecord::default();
        let (v, changed) = cast_vote(&mut current, &mut rec, 5, "b");
        assert!(changed);
        assert_eq!(
            v,
            Vote {
                leader: Some("b".into()),
                epoch: 5
            }
        );
        // A second candidate in the same epoch gets the recorded vote back.
        let (v, changed) = cast_vote(&mut current, &mut rec, 5, "c");
        assert!(!changed);
        assert_eq!(v.leader.as_deref(), Some("b"));
        // An older epoch gets nothing new.
        let (v, _) = cast_vote(&mut current, &mut rec, 4, "c");
        assert_eq!(v.epoch, 5);
        // An epoch below the current one gets no vote even if never voted in.
        current = 10;
        let (v, _) = cast_vote(&mut current, &mut rec, 9, "c");
        assert_eq!(v.leader.as_deref(), Some("b"));
        let (v, _) = cast_vote(&mut current, &mut rec, 11, "c");
        assert_eq!((v.leader.as_deref(), v.epoch, current), (Some("c"), 11, 11));
        assert_eq!(new_epoch(&mut current, &mut rec, "me"), 12);
        assert_eq!(rec.voted_for.as_deref(), Some("me"));
    }

    #[test]
    fn stale_askers_get_no_vote() {
        let q = IsDownQuery {
            group: "g".into(),
            master: a(1),
            config_epoch: 3,
            epoch: 9,
            candidate: Some("b".into()),
            promote: None,
        };
        assert!(may_vote(&q, &a(1), 3, false));
        assert!(may_vote(&q, &a(1), 2, false));
        assert!(
            !may_vote(&q, &a(1), 4, false),
            "behind this daemon's config"
        );
        assert!(!may_vote(&q, &a(2), 3, false), "another master");
        assert!(!may_vote(&q, &a(2), 3, true), "another master, same epoch");
        assert!(
            !may_vote(&q, &a(2), 2, false),
            "another master, of a newer config, that is a master"
        );
        assert!(
            may_vote(&q, &a(2), 2, true),
            "the master of a newer config, down or a replica to this daemon"
        );
        let q = IsDownQuery {
            candidate: None,
            ..q
        };
        assert!(!may_vote(&q, &a(1), 3, true), "not a vote request");
    }
}
