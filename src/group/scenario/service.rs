//! A Kubernetes Service in front of the group, as traffic gating uses it
//! (`picket-sim --service`): picket labels the master's pod, and the
//! endpoint controller copies the change into the Service's endpoints
//! after a lag of its own (50-1,500 ms here), and not at all while it
//! stalls (2-8 s, every 5-20 virtual s until everything heals; a stall
//! longer than the fence's deadline aborts the failover, a path of its
//! own). A fence is confirmed
//! only once the endpoints no longer hold the fenced master, as the gate
//! (`discovery/kubernetes/gate.rs`) waits for it. The labels follow the
//! backend's routing (the same epoch rules as the file backend's).
//! Checked: the old master is out of the endpoints before the promotion,
//! and a server enters them only as a master.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::Sim;
use crate::addr::Addr;
use crate::context::DaemonCtx;
use crate::discovery::runner::{BackendFailure, FailureReason, OpKind, RunnerError};
use crate::failover::machine::Input;
use crate::group::effects::Internal;

/// A fence waiting for the endpoints to drop the old master.
struct Fencing {
    daemon: usize,
    /// The daemon in this life (one restarted since has forgotten it).
    ctx: Arc<DaemonCtx>,
    epoch: u64,
    old: Addr,
    /// Virtual ms.
    deadline: u64,
}

/// The Service and its endpoint controller.
pub(super) struct Service {
    rng: StdRng,
    /// What clients reach through the Service now.
    pub(super) endpoints: Option<Addr>,
    /// The epoch of the labels the endpoints were copied from.
    endpoints_epoch: u64,
    /// When the controller copies the labels next (virtual ms).
    sync_at: Option<u64>,
    stalled_until: u64,
    next_stall: u64,
    fencing: Vec<Fencing>,
    /// The old master each daemon's failover fenced, per epoch.
    fenced_old: BTreeMap<(usize, u64), Addr>,
}

impl Service {
    /// The Service of a group whose master is `master`, for `seed`.
    pub(super) fn new(seed: u64, master: Addr) -> Service {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7376_635f_7267);
        let next_stall = rng.random_range(5_000..20_000);
        Service {
            rng,
            endpoints: Some(master),
            endpoints_epoch: 0,
            sync_at: None,
            stalled_until: 0,
            next_stall,
            fencing: Vec::new(),
            fenced_old: BTreeMap::new(),
        }
    }

    /// Everything heals: the controller's stall ends and no other comes.
    /// A stall in the time the group has to settle held a failover's
    /// fence past it, and counted as a group that does not settle
    /// (`picket-sim` with every fault, seed 6546).
    pub(super) fn calm(&mut self) {
        self.stalled_until = 0;
        self.next_stall = u64::MAX;
    }
}

impl Sim {
    /// Daemon `i` fenced `old` in `epoch` (the labels already changed, with
    /// the routing): confirmed at once when the endpoints no longer hold
    /// it, or later by [`Sim::step_service`]. `None`: no Service.
    pub(super) fn fence_service(
        &mut self,
        i: usize,
        epoch: u64,
        old: &Addr,
        deadline_ms: u64,
    ) -> Option<Option<Internal>> {
        let ctx = self.daemons[i].ctx.clone();
        let ms = self.ms;
        let svc = self.service.as_mut()?;
        svc.fenced_old.insert((i, epoch), old.clone());
        if svc.endpoints.as_ref() != Some(old) {
            return Some(Some(Internal::Failover(epoch, Input::Fenced(Ok(())))));
        }
        svc.fencing.push(Fencing {
            daemon: i,
            ctx,
            epoch,
            old: old.clone(),
            deadline: ms + deadline_ms,
        });
        Some(None)
    }

    /// Guarantee 5 at a promotion by daemon `i` in `epoch`: the master its
    /// failover replaces (the one it fenced, or its master until the
    /// publication) is out of the Service, unless a newer epoch's
    /// publication brought it back (a stale leader still retrying, the
    /// group moved on: seed 210 of `--ops --service`).
    pub(super) fn check_gated(&mut self, i: usize, epoch: u64, candidate: &Addr) {
        let Some(svc) = self.service.as_ref() else {
            return;
        };
        let replaced = svc
            .fenced_old
            .get(&(i, epoch))
            .unwrap_or(&self.daemons[i].g.master);
        if let Some(old) = svc
            .endpoints
            .as_ref()
            .filter(|e| *e == replaced && *e != candidate && svc.endpoints_epoch <= epoch)
        {
            self.violations.push(format!(
                "{} ms: daemon {i} promoted {candidate} at epoch {epoch} while the Service still \
                 routes to {old}",
                self.ms
            ));
        }
    }

    /// Every 10 virtual ms: the controller stalls, or copies the labels
    /// once its lag has passed; fences the endpoints confirm (or that
    /// their deadline ends) are fed back.
    pub(super) async fn step_service(&mut self) {
        let ms = self.ms;
        let (routed_epoch, routed) = self.routing.clone();
        let n = self.daemons.len();
        let Some(svc) = self.service.as_mut() else {
            return;
        };
        let mut notes = Vec::new();
        if ms >= svc.next_stall {
            svc.stalled_until = ms + svc.rng.random_range(2_000..8_000);
            svc.next_stall = ms + svc.rng.random_range(5_000..20_000);
            notes.push(format!(
                "fault: the endpoint controller stalls until {} ms",
                svc.stalled_until
            ));
        }
        let mut entered = None;
        if svc.endpoints != routed {
            let due = match svc.sync_at {
                Some(t) => t,
                None => {
                    let t = ms + svc.rng.random_range(50..1_500);
                    svc.sync_at = Some(t);
                    t
                }
            };
            if ms >= due && ms >= svc.stalled_until {
                svc.endpoints = routed.clone();
                svc.endpoints_epoch = routed_epoch;
                svc.sync_at = None;
                entered = routed.clone();
                notes.push(format!(
                    "service routes to {}",
                    routed.as_ref().map_or("nobody".into(), |a| a.to_string())
                ));
            }
        } else {
            svc.sync_at = None;
        }
        let mut done = Vec::new();
        let mut k = 0;
        while k < svc.fencing.len() {
            let f = &svc.fencing[k];
            if svc.endpoints.as_ref() != Some(&f.old) {
                done.push((svc.fencing.remove(k), Ok(())));
            } else if ms >= f.deadline {
                let f = svc.fencing.remove(k);
                let err = RunnerError {
                    group: "g".into(),
                    op: OpKind::Fence,
                    epoch: f.epoch,
                    failures: vec![BackendFailure {
                        name: "kubernetes".into(),
                        reason: FailureReason::Deadline { last: None },
                    }],
                };
                done.push((f, Err(err)));
            } else {
                k += 1;
            }
        }
        for what in notes {
            self.note(n, what);
        }
        // A server enters the Service only as a master (guarantee 5): a
        // publication comes after the promotion it names.
        if let Some(a) = entered
            && self
                .servers
                .get(&a)
                .is_some_and(|s| s.alive && s.master.is_some())
        {
            self.violations.push(format!(
                "{ms} ms: the Service routes to {a}, which is a replica"
            ));
        }
        for (f, r) in done {
            let result = Internal::Failover(f.epoch, Input::Fenced(r));
            self.feed_back(f.daemon, &f.ctx, result).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Sim, addr};
    use super::*;

    fn gated(seed: u64) -> Sim {
        let mut sim = Sim::new(3, 2, seed);
        sim.service = Some(Service::new(seed, addr(7000)));
        sim
    }

    /// After 3 s of calm, the endpoint controller stalls for `stall` ms
    /// (and never again) and the master is killed; when.
    async fn kill_master_with_the_controller_stalled(sim: &mut Sim, stall: u64) -> u64 {
        sim.run_for(3_000).await;
        let killed = sim.ms;
        if let Some(svc) = sim.service.as_mut() {
            svc.stalled_until = killed + stall;
            svc.next_stall = u64::MAX;
        }
        sim.servers.get_mut(&addr(7000)).alive = false;
        killed
    }

    #[tokio::test]
    async fn a_fence_waits_for_the_endpoint_controller_and_the_promotion_for_the_fence() {
        let mut sim = gated(21);
        let killed = kill_master_with_the_controller_stalled(&mut sim, 3_000).await;
        sim.run_for(8_000).await;
        let (fence, out) = (sim.at("fence"), sim.at("service routes to nobody"));
        let promote = sim.at("promote");
        let new = sim.trace[promote]
            .2
            .split(' ')
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let back = sim.at(&format!("service routes to {new}"));
        assert!(
            fence < out && out < promote && promote < back,
            "{:#?}",
            sim.trace
        );
        assert!(
            sim.trace[out].0 >= killed + 3_000,
            "the old master left the Service only once the stall ended: {:#?}",
            sim.trace
        );
        for d in &sim.daemons {
            assert_eq!(
                d.g.master.to_string(),
                new,
                "{}: {:#?}",
                d.ctx.id,
                sim.trace
            );
        }
        sim.assert_no_violation();
    }

    /// A master back with less while the fence waits for a stalled
    /// endpoint controller stays paused until the promotion: its replicas
    /// keep their data (the pause of its judgement alone ends after 2 s).
    #[tokio::test]
    async fn a_master_back_with_less_stays_paused_while_its_fence_waits() {
        let mut sim = gated(22);
        let killed = kill_master_with_the_controller_stalled(&mut sim, 6_000).await;
        let m = addr(7000);
        sim.run_for(500).await;
        sim.at("fence 127.0.0.1:7000");
        let before = {
            let s = sim.servers.get_mut(&m);
            s.alive = true;
            s.offset = 0;
            s.run_id = "f".repeat(40);
            std::mem::replace(&mut s.replid, "b".repeat(40))
        };
        sim.mark_emptied(&m, &before);
        sim.run_for(8_000).await;
        let promote = sim.at("promote");
        assert!(
            sim.trace[promote].0 >= killed + 6_000,
            "promoted once the stall ended: {:#?}",
            sim.trace
        );
        for p in [7001, 7002] {
            assert!(
                sim.servers.get(&addr(p)).is_some_and(|s| s.offset > 1_000),
                "{p} kept its data: {:#?}",
                sim.trace
            );
        }
        let pauses = sim
            .trace
            .iter()
            .filter(|(t, _, w)| *t < sim.trace[promote].0 && w.starts_with("pause"))
            .count();
        assert!(pauses >= 4, "paused again while fencing: {:#?}", sim.trace);
        sim.assert_no_violation();
    }

    /// Skipping the fence and publishing before the promotion break the
    /// Service's own checks (the gated order), not only the simulation's
    /// others.
    #[tokio::test]
    async fn the_service_checks_catch_an_ungated_promotion() {
        use crate::mutation::{Mutation, plant};
        for (m, what) in [
            (Mutation::SkipFence, "while the Service still routes to"),
            (Mutation::PublishBeforePromotion, "which is a replica"),
        ] {
            plant(Some(m));
            let mut caught = None;
            for seed in 1..=40 {
                let mut sim = gated(seed);
                sim.run_for(2_000).await;
                sim.chaos(20).await;
                if let Some(v) = sim.violations.iter().find(|v| v.contains(what)) {
                    caught = Some((seed, v.clone()));
                    break;
                }
            }
            plant(None);
            let (seed, v) = caught.unwrap_or_else(|| panic!("{m:?} not caught in 40 seeds"));
            println!("{m:?}: caught at seed {seed}: {v}");
        }
    }
}
