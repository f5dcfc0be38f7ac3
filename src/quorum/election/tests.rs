//! Unit tests of the election machine, in paused time.

use super::*;
use crate::quorum::vote::Vote;
use tokio::time::advance;

fn a(p: u16) -> Addr {
    Addr::new("127.0.0.1", p)
}

/// Replicas for the tests: `ok` can be promoted, in order of preference.
struct Fixed {
    ok: Vec<Addr>,
}

impl Replicas for Fixed {
    fn select(&self, to: Option<&Addr>) -> Result<Addr, NoGoodReplica> {
        match to {
            Some(t) if self.ok.contains(t) => Ok(t.clone()),
            Some(t) => Err(NoGoodReplica::Unknown(t.clone())),
            None => self
                .ok
                .first()
                .cloned()
                .ok_or(NoGoodReplica::NoneSuitable(Vec::new())),
        }
    }
    fn eligible(&self, addr: &Addr) -> bool {
        self.ok.contains(addr)
    }
}

fn settings(daemons: usize, quorum: usize) -> Settings {
    Settings {
        id: "me".into(),
        daemons,
        quorum,
        ping_period: Duration::from_millis(250),
        down_after: Duration::from_secs(1),
        failover_timeout: Duration::from_secs(30),
    }
}

fn obs<'a>(sdown: bool, r: &'a Fixed) -> Observation<'a> {
    Observation {
        now: Instant::now(),
        master_sdown: sdown,
        tilt: false,
        config_epoch: 1,
        replicas: r,
        // Second: a delay of one step and a random part before starting.
        rank: 1,
        promotion_out: false,
    }
}

fn reply(down: bool, leader: Option<&str>, epoch: u64) -> IsDownReply {
    IsDownReply {
        down,
        leader: leader.map(str::to_string),
        leader_epoch: epoch,
    }
}

fn events(actions: &[Action]) -> Vec<EventKind> {
    actions
        .iter()
        .filter_map(|x| match x {
            Action::Event(k, _) => Some(*k),
            _ => None,
        })
        .collect()
}

fn has(actions: &[Action], f: impl Fn(&Action) -> bool) -> bool {
    actions.iter().any(f)
}

/// Tick until the pre-election delay ends; returns the actions of the
/// tick that started the election.
async fn through_delay(e: &mut Election, r: &Fixed) -> Vec<Action> {
    let mut acts = e.tick(&obs(true, r));
    for _ in 0..20 {
        if has(&acts, |x| *x == Action::PersistNewEpoch) {
            return acts;
        }
        let Some(until) = e.deadline() else {
            return acts;
        };
        advance(until.saturating_duration_since(Instant::now())).await;
        acts = e.tick(&obs(true, r));
    }
    acts
}

/// ODOWN with both peers of three, ready to start.
fn odown_machine(r: &Fixed) -> Election {
    let mut e = Election::new(settings(3, 2), 2, Some(7));
    let o = obs(true, r);
    let acts = e.tick(&o);
    assert!(has(&acts, |x| *x == Action::Ask(Ask { vote: None })));
    let acts = e.on_answer(&o, 0, 1, o.now, &reply(true, None, 0));
    assert!(events(&acts).contains(&EventKind::Odown));
    e
}

#[tokio::test(start_paused = true)]
async fn odown_needs_the_quorum_with_fresh_answers() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = Election::new(settings(3, 2), 2, Some(1));
    let o = obs(true, &r);
    assert!(events(&e.tick(&o)).is_empty(), "SDOWN alone is not ODOWN");
    // A peer that does not see it down does not count.
    let acts = e.on_answer(&o, 0, 1, o.now, &reply(false, None, 0));
    assert!(e.odown_since().is_none(), "{acts:?}");
    let acts = e.on_answer(&o, 1, 1, o.now, &reply(true, None, 0));
    assert_eq!(
        acts.iter()
            .find(|x| matches!(x, Action::Event(EventKind::Odown, _))),
        Some(&Action::Event(
            EventKind::Odown,
            Detail::MasterAnd("#quorum 2/2".into())
        ))
    );
    assert_eq!(e.down_votes(Instant::now(), true), 2);
    // The answer ages out: ODOWN ends with -odown.
    advance(e.settings().answer_ttl() + Duration::from_millis(1)).await;
    let acts = e.tick(&obs(true, &r));
    assert!(events(&acts).contains(&EventKind::OdownCleared), "{acts:?}");
    assert!(e.odown_since().is_none());
}

#[tokio::test(start_paused = true)]
async fn peers_are_asked_at_the_ask_period_not_every_tick() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = Election::new(settings(3, 2), 2, Some(1));
    let asks = |acts: &[Action]| acts.iter().filter(|x| matches!(x, Action::Ask(_))).count();
    assert_eq!(asks(&e.tick(&obs(true, &r))), 1);
    advance(Duration::from_millis(10)).await;
    assert_eq!(asks(&e.tick(&obs(true, &r))), 0);
    // The master going down again asks at once.
    e.master_went_down();
    assert_eq!(asks(&e.tick(&obs(true, &r))), 1);
    advance(Duration::from_millis(125)).await;
    assert_eq!(asks(&e.tick(&obs(true, &r))), 1);
    // Not while the master is up.
    advance(Duration::from_secs(1)).await;
    assert_eq!(asks(&e.tick(&obs(false, &r))), 0);
}

#[tokio::test(start_paused = true)]
async fn tilt_decides_nothing() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = Election::new(settings(3, 2), 2, Some(1));
    let mut o = obs(true, &r);
    o.tilt = true;
    let acts = e.tick(&o);
    assert!(acts.is_empty(), "{acts:?}");
    let acts = e.on_answer(&o, 0, 1, o.now, &reply(true, None, 0));
    assert!(acts.is_empty() && e.odown_since().is_none(), "{acts:?}");
}

#[tokio::test(start_paused = true)]
async fn a_random_delay_then_an_election_won_with_a_majority() {
    let r = Fixed {
        ok: vec![a(2), a(3)],
    };
    let mut e = odown_machine(&r);
    let start = Instant::now();
    let acts = through_delay(&mut e, &r).await;
    assert!(has(&acts, |x| *x == Action::PersistNewEpoch), "{acts:?}");
    assert!(Instant::now() - start <= Duration::from_millis(150));
    assert!(matches!(e.stage(), Stage::Starting { candidate, .. } if *candidate == a(2)));
    assert!(e.busy());
    let o = obs(true, &r);
    let acts = e.on_epoch(&o, Ok(5));
    assert_eq!(
        events(&acts),
        vec![EventKind::NewEpoch, EventKind::TryFailover]
    );
    assert!(has(&acts, |x| *x
        == Action::Ask(Ask {
            vote: Some((5, a(2)))
        })));
    assert!(matches!(e.stage(), Stage::Electing(b) if b.epoch == 5));
    // One vote for me from a peer: 2 of 3.
    let acts = e.on_answer(&o, 1, 5, o.now, &reply(true, Some("me"), 5));
    assert!(has(&acts, |x| *x == Action::Ended(ElectionResult::Won)));
    assert!(events(&acts).contains(&EventKind::ElectedLeader));
    let started = acts.iter().find_map(|x| match x {
        Action::StartFailover(b) => Some(b.clone()),
        _ => None,
    });
    assert_eq!(started.map(|b| (b.epoch, b.candidate)), Some((5, a(2))));
    assert_eq!(
        e.stage(),
        &Stage::FailingOver {
            epoch: 5,
            kind: Kind::Unplanned
        }
    );
    assert_eq!(e.intended(1), Some(&a(2)));
    // Nothing more happens while the failover runs.
    assert!(!has(&e.tick(&obs(true, &r)), |x| matches!(
        x,
        Action::Ask(_)
    )));
    e.on_master_changed(Instant::now(), 5);
    assert_eq!(e.intended(1), None);
    e.on_failover_end(Instant::now(), true);
    assert_eq!(e.stage(), &Stage::Watching);
}

/// Votes found queued after a stall (TILT) are from before it: the
/// election is given up, not won on them.
#[tokio::test(start_paused = true)]
async fn votes_that_come_in_tilt_win_nothing() {
    let r = Fixed {
        ok: vec![a(2), a(3)],
    };
    let mut e = odown_machine(&r);
    through_delay(&mut e, &r).await;
    let o = obs(true, &r);
    e.on_epoch(&o, Ok(5));
    assert!(matches!(e.stage(), Stage::Electing(b) if b.epoch == 5));
    let mut o = obs(true, &r);
    o.tilt = true;
    let acts = e.on_answer(&o, 1, 5, o.now, &reply(true, Some("me"), 5));
    assert!(
        !has(&acts, |x| matches!(x, Action::StartFailover(_))),
        "{acts:?}"
    );
    assert!(
        has(&acts, |x| *x == Action::Ended(ElectionResult::Lost)),
        "{acts:?}"
    );
    assert!(!matches!(
        e.stage(),
        Stage::Electing(_) | Stage::FailingOver { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_long_after_the_delay_draws_it_again_once() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = odown_machine(&r);
    assert!(!has(&e.tick(&obs(true, &r)), |x| *x == Action::PersistNewEpoch));
    let Some(until) = e.deadline() else {
        panic!("a delay: {:?}", e.stage());
    };
    // A stall: the task wakes 400 ms after the delay ended (the peer's
    // answer is still fresh).
    advance(until.saturating_duration_since(Instant::now()) + Duration::from_millis(400)).await;
    let acts = e.tick(&obs(true, &r));
    let redrawn = matches!(e.stage(), Stage::Delay { redrawn: true, .. });
    assert!(
        redrawn || has(&acts, |x| *x == Action::PersistNewEpoch),
        "a new delay, or a start if it drew zero: {:?}",
        e.stage()
    );
    // Another stall does not delay it again.
    advance(Duration::from_millis(400)).await;
    let acts = e.tick(&obs(true, &r));
    assert!(
        has(&acts, |x| *x == Action::PersistNewEpoch) || redrawn && e.busy(),
        "{:?}",
        e.stage()
    );
    assert!(
        matches!(e.stage(), Stage::Starting { .. }),
        "{:?}",
        e.stage()
    );
}

#[tokio::test(start_paused = true)]
async fn a_split_vote_retries_soon_a_lost_one_backs_off() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = odown_machine(&r);
    through_delay(&mut e, &r).await;
    let o = obs(true, &r);
    e.on_epoch(&o, Ok(3));
    // Each peer voted for itself in epoch 3: nobody can win.
    e.on_answer(&o, 0, 3, o.now, &reply(true, Some("b"), 3));
    let acts = e.on_answer(&o, 1, 3, o.now, &reply(true, Some("c"), 3));
    assert!(
        has(&acts, |x| *x == Action::Ended(ElectionResult::Split)),
        "{acts:?}"
    );
    assert!(events(&acts).contains(&EventKind::AbortNotElected));
    let until = e.backoff_until(Instant::now()).unwrap_or(Instant::now());
    assert!(until - Instant::now() <= Duration::from_millis(500));

    // Another round that nobody answers: lost at the election timeout,
    // then no attempt for failover_timeout.
    let mut e = odown_machine(&r);
    through_delay(&mut e, &r).await;
    e.on_epoch(&obs(true, &r), Ok(4));
    advance(Duration::from_secs(2)).await;
    // Keep ODOWN alive with fresh answers that carry no vote.
    let o = obs(true, &r);
    let acts = e.on_answer(&o, 0, 4, o.now, &reply(true, None, 0));
    assert!(
        has(&acts, |x| *x == Action::Ended(ElectionResult::Lost)),
        "{acts:?}"
    );
    let until = e.backoff_until(Instant::now()).unwrap_or(Instant::now());
    assert!(until - Instant::now() >= Duration::from_secs(30));
    advance(Duration::from_secs(29)).await;
    let o = obs(true, &r);
    e.on_answer(&o, 0, 4, o.now, &reply(true, None, 0));
    assert!(!has(&e.tick(&o), |x| *x == Action::PersistNewEpoch));
    assert!(e.deadline().is_none(), "no delay during the back-off");
}

#[tokio::test(start_paused = true)]
async fn a_vote_for_another_daemon_stands_this_one_back() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = odown_machine(&r);
    through_delay(&mut e, &r).await;
    e.on_epoch(&obs(true, &r), Ok(6));
    let q = IsDownQuery {
        group: "g".into(),
        master: a(1),
        config_epoch: 1,
        epoch: 7,
        candidate: Some("b".into()),
        promote: Some(a(3)),
    };
    let mut out = Vec::new();
    let vote = Vote {
        leader: Some("b".into()),
        epoch: 7,
    };
    assert!(e.on_vote_cast(Instant::now(), &q, &vote, &mut out));
    assert_eq!(events(&out), vec![EventKind::VoteForLeader]);
    assert!(matches!(e.stage(), Stage::Backoff { .. }));
    // The voters keep the candidate's replica: neither demoted nor passed over.
    assert_eq!(e.intended(1), Some(&a(3)));
    // A vote on record for someone else is not a grant.
    let mut out = Vec::new();
    let other = Vote {
        leader: Some("c".into()),
        epoch: 7,
    };
    assert!(!e.on_vote_cast(Instant::now(), &q, &other, &mut out));
    assert!(out.is_empty());
    // An epoch persisted after the stand-back starts nothing.
    assert!(e.on_epoch(&obs(true, &r), Ok(8)).is_empty());
    // The leader published its config: the stand-back is over, and the
    // next ODOWN (of the new master) is acted on after the start delay,
    // not after failover_timeout (found by the simulation, seed 60: a
    // new master that restarted empty 2 s after its promotion was left
    // down for 10 s, and its replicas copied it).
    e.on_master_changed(Instant::now(), 7);
    assert_eq!(
        e.backoff_until(Instant::now()),
        Some(Instant::now() + Duration::from_secs(1)),
        "down_after left, not failover_timeout"
    );
    advance(Duration::from_secs(1)).await;
    let o = obs(true, &r);
    e.tick(&o);
    e.on_answer(&o, 0, 7, o.now, &reply(true, None, 0));
    let acts = through_delay(&mut e, &r).await;
    assert!(has(&acts, |x| *x == Action::PersistNewEpoch), "{acts:?}");
}

#[tokio::test(start_paused = true)]
async fn the_intended_replica_goes_first() {
    let r = Fixed {
        ok: vec![a(2), a(3)],
    };
    let mut e = odown_machine(&r);
    let q = IsDownQuery {
        group: "g".into(),
        master: a(1),
        config_epoch: 1,
        epoch: 2,
        candidate: Some("b".into()),
        promote: Some(a(3)),
    };
    let vote = Vote {
        leader: Some("b".into()),
        epoch: 2,
    };
    e.on_vote_cast(Instant::now(), &q, &vote, &mut Vec::new());
    // The leader died half-way; after the back-off this daemon takes over
    // with the same replica, not the "best" one.
    advance(Duration::from_secs(32)).await;
    let o = obs(true, &r);
    e.on_answer(&o, 0, 2, o.now, &reply(true, None, 0));
    through_delay(&mut e, &r).await;
    assert!(matches!(e.stage(), Stage::Starting { candidate, .. } if *candidate == a(3)));
}

#[tokio::test(start_paused = true)]
async fn no_replica_reports_once_and_looks_again_soon() {
    let none = Fixed { ok: Vec::new() };
    let mut e = odown_machine(&none);
    let acts = through_delay(&mut e, &none).await;
    assert!(
        events(&acts).contains(&EventKind::AbortNoGoodSlave),
        "{acts:?}"
    );
    assert!(e.no_candidate());
    // Nothing was started: the next look is a ping period away, not
    // failover_timeout (30 s here).
    let Some(until) = e.backoff_until(Instant::now()) else {
        panic!("backing off: {:?}", e.stage());
    };
    assert_eq!(until - Instant::now(), Duration::from_millis(250));
    // Still none: looked for again, reported no more.
    advance(Duration::from_millis(250)).await;
    let acts = through_delay(&mut e, &none).await;
    assert!(events(&acts).is_empty(), "{acts:?}");
    assert!(e.backoff_until(Instant::now()).is_some());
    // A replica becomes suitable (the replicas of a master found restarted
    // with less are held only for a pause): the election starts at once.
    advance(Duration::from_millis(250)).await;
    let r = Fixed { ok: vec![a(2)] };
    let o = obs(true, &r);
    e.on_answer(&o, 0, 1, o.now, &reply(true, None, 0));
    let acts = through_delay(&mut e, &r).await;
    assert!(has(&acts, |x| *x == Action::PersistNewEpoch), "{acts:?}");
    assert!(!e.no_candidate());
}

#[tokio::test(start_paused = true)]
async fn switchover_requests_and_their_answers() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = Election::new(settings(3, 2), 2, Some(3));
    assert_eq!(
        e.request_switchover(&obs(true, &r), None),
        vec![Action::Switchover(Err(FailoverError::MasterDown))]
    );
    assert_eq!(
        e.request_switchover(&obs(false, &r), Some(&a(9))),
        vec![Action::Switchover(Err(FailoverError::NoGoodReplica(
            NoGoodReplica::Unknown(a(9))
        )))]
    );
    assert_eq!(
        e.request_switchover(&obs(false, &r), None),
        vec![Action::PersistNewEpoch]
    );
    assert_eq!(
        e.request_switchover(&obs(false, &r), None),
        vec![Action::Switchover(Err(FailoverError::InProgress))]
    );
    let o = obs(false, &r);
    e.on_epoch(&o, Ok(2));
    let acts = e.on_answer(&o, 0, 2, o.now, &reply(false, Some("me"), 2));
    assert!(has(&acts, |x| *x == Action::Switchover(Ok(()))), "{acts:?}");
    assert!(has(
        &acts,
        |x| matches!(x, Action::StartFailover(b) if b.kind == Kind::Switchover)
    ));

    // A switchover that cannot win is answered NotElected.
    let mut e = Election::new(settings(3, 2), 2, Some(3));
    e.request_switchover(&obs(false, &r), None);
    e.on_epoch(&obs(false, &r), Ok(3));
    advance(Duration::from_secs(3)).await;
    let acts = e.tick(&obs(false, &r));
    assert!(
        has(&acts, |x| *x
            == Action::Switchover(Err(FailoverError::NotElected))),
        "{acts:?}"
    );

    // A newer config from a peer answers it NewerConfig.
    let mut e = Election::new(settings(3, 2), 2, Some(3));
    e.request_switchover(&obs(false, &r), None);
    assert_eq!(
        e.abandon(),
        vec![Action::Switchover(Err(FailoverError::NewerConfig))]
    );
    assert_eq!(e.stage(), &Stage::Watching);

    // A failed persistence answers it with the error.
    let mut e = Election::new(settings(3, 2), 2, Some(3));
    e.request_switchover(&obs(false, &r), None);
    assert_eq!(
        e.on_epoch(&obs(false, &r), Err("disk full".into())),
        vec![Action::Switchover(Err(FailoverError::Persist(
            "disk full".into()
        )))]
    );
}

#[tokio::test(start_paused = true)]
async fn alone_the_own_vote_wins() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = Election::new(settings(1, 1), 0, Some(5));
    through_delay(&mut e, &r).await;
    let acts = e.on_epoch(&obs(true, &r), Ok(1));
    assert!(
        has(&acts, |x| matches!(x, Action::StartFailover(_))),
        "{acts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_older_answer_does_not_hide_a_vote() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = Election::new(settings(3, 2), 2, Some(5));
    let o = obs(true, &r);
    e.on_answer(&o, 0, 4, o.now, &reply(true, Some("me"), 4));
    e.on_answer(&o, 0, 3, o.now, &reply(true, None, 3));
    assert_eq!(e.peers()[0].leader.as_deref(), Some("me"));
    assert_eq!(e.peers()[0].leader_epoch, 4);
    assert_eq!(e.peers()[0].answered_epoch, 4);
    e.on_stall();
    assert!(e.peers()[0].answered_at.is_none());
    e.reset();
    assert_eq!(e.peers()[0], PeerAnswer::default());
}

#[tokio::test(start_paused = true)]
async fn an_epoch_superseded_by_a_vote_backs_off() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = odown_machine(&r);
    through_delay(&mut e, &r).await;
    assert!(matches!(e.stage(), Stage::Starting { .. }));
    assert!(e.on_epoch_superseded(Instant::now()).is_empty());
    assert!(matches!(e.stage(), Stage::Backoff { .. }));
    // A switchover superseded the same way is answered.
    let mut e = Election::new(settings(3, 2), 2, Some(3));
    e.request_switchover(&obs(false, &r), None);
    assert_eq!(
        e.on_epoch_superseded(Instant::now()),
        vec![Action::Switchover(Err(FailoverError::AnotherLeader))]
    );
}

#[test]
fn the_start_delays_of_ranks_never_overlap() {
    let s = settings(3, 2);
    let step = s.start_step();
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        let d: Vec<Duration> = (0..3).map(|rank| s.start_delay(rank, &mut rng)).collect();
        for (rank, d) in d.iter().enumerate() {
            let from = step * rank as u32;
            assert!(*d >= from && *d <= from + step / 2, "rank {rank}: {d:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn no_election_starts_while_a_peer_reports_a_newer_failover() {
    let r = Fixed { ok: vec![a(2)] };
    let mut e = odown_machine(&r);
    // A peer's hello says a leader is promoting in a newer epoch: however
    // long that lasts, this daemon does not start a second election.
    for _ in 0..10 {
        let o = Observation {
            promotion_out: true,
            ..obs(true, &r)
        };
        e.on_answer(&o, 0, 1, o.now, &reply(true, None, 0));
        assert!(e.odown_since().is_some());
        let acts = e.tick(&o);
        assert!(!has(&acts, |x| *x == Action::PersistNewEpoch), "{acts:?}");
        assert!(!e.busy());
        advance(Duration::from_secs(1)).await;
    }
    // Once no peer says so, it starts after its usual delay.
    let o = obs(true, &r);
    e.on_answer(&o, 0, 1, o.now, &reply(true, None, 0));
    let acts = through_delay(&mut e, &r).await;
    assert!(has(&acts, |x| *x == Action::PersistNewEpoch), "{acts:?}");
}
