//! Known bugs that the simulation (`group/scenario.rs`) must catch: a test
//! plants one on its own thread and the code asks [`planted`] where the
//! bug would be. Outside tests [`planted`] is a constant `false`, and the
//! planted branches compile away.

/// A bug of the kind the invariants exist for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// Promote without fencing the old master first (invariant 5).
    SkipFence,
    /// Publish the new master before its promotion is confirmed
    /// (invariant 4).
    PublishBeforePromotion,
    /// Count a peer's vote from an older epoch for this one (invariant 2).
    CountOldEpochVotes,
    /// Forget the persisted vote when the daemon restarts (invariant 1).
    ForgetVote,
    /// Prefer the replica with the lower offset.
    PromoteLaggingReplica,
    /// Let a master that came back with less than its replicas stay the
    /// master (invariant 19).
    KeepRebootedMaster,
    /// Promote a switchover's candidate at once, as an unplanned failover
    /// does (and Sentinel's `SENTINEL FAILOVER`), instead of letting the
    /// old master hand over once the candidate has its writes (invariant
    /// 7).
    SwitchoverWithoutHandover,
    /// Lower the isolation fence to the replicas seen linked to the
    /// master instead of those seen up: a master cut off from live
    /// replicas is unfenced (invariant 15).
    FenceOnLinkedReplicas,
}

#[cfg(test)]
thread_local! {
    static PLANTED: std::cell::Cell<Option<Mutation>> = const { std::cell::Cell::new(None) };
}

/// Whether `m` is planted on this thread.
#[cfg(test)]
pub fn planted(m: Mutation) -> bool {
    PLANTED.with(|p| p.get() == Some(m))
}

/// Whether `m` is planted: never, outside tests.
#[cfg(not(test))]
#[inline(always)]
pub fn planted(_: Mutation) -> bool {
    false
}

/// Plant `m` on this thread (None: take it out).
#[cfg(test)]
pub fn plant(m: Option<Mutation>) {
    PLANTED.with(|p| p.set(m));
}
