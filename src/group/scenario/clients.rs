//! Clients that write to the master they are routed to, and what becomes
//! of the writes acknowledged to them: invariant 7 (a planned switchover
//! loses no acknowledged write), checked in schedules whose only faults
//! are switchovers and the daemons' own (`picket-sim --switchovers`).
//!
//! A server's data is a lineage and an offset: it holds the writes of its
//! lineage up to that offset, and a lineage that forked from another
//! holds that one's writes up to the fork. The replication ids and
//! offsets alone do not say whose writes a server holds (a replica that
//! continues a promoted master's history by a partial resynchronisation
//! takes its new id with what it had, as on Redis); the lineages do:
//! - a master writes on a lineage of its own: the first write of a server
//!   that became a master (promoted, handed over to, a master left as it
//!   was while the others moved on) forks one from what it held;
//! - a server that lost its data (an offset gone back on the same
//!   lineage: restarted empty) starts one with nothing before it;
//! - a replica's copy takes its master's lineage and offset, partial or
//!   full alike: the writes it held beyond its master's are gone, as a
//!   full resync drops them (`Servers::replicate`).

use std::collections::BTreeMap;

use super::{Server, Servers};
use crate::addr::Addr;

/// The clients and the writes acknowledged to them.
pub(super) struct Clients {
    /// Per lineage: the lineage and offset it forked from (`None`:
    /// nothing before it), and the server that writes on it.
    lineages: Vec<(Option<(usize, u64)>, Addr)>,
    /// Each server's lineage and offset at the last write.
    last: BTreeMap<Addr, (usize, u64)>,
    /// Per lineage, the newest write acknowledged to a client.
    acked: BTreeMap<usize, u64>,
    /// A lost write is a violation: no fault of the schedule may lose one
    /// (its only faults are switchovers and the daemons' own).
    pub(super) checked: bool,
}

impl Clients {
    /// Clients of a group whose servers all hold lineage 0, written by
    /// `master`.
    pub(super) fn new(master: Addr) -> Clients {
        Clients {
            lineages: vec![(None, master)],
            last: BTreeMap::new(),
            acked: BTreeMap::new(),
            checked: false,
        }
    }

    fn fork(&mut self, from: Option<(usize, u64)>, writer: &Addr) -> usize {
        self.lineages.push((from, writer.clone()));
        self.lineages.len() - 1
    }

    /// Before the servers write at `ms` (`Servers::replicate`): a server
    /// whose offset went back on its lineage lost its data, and a master
    /// about to write on a lineage another server wrote gets its own.
    pub(super) fn before_writes(&mut self, servers: &mut Servers, ms: u64) {
        for s in servers.0.iter_mut() {
            if self
                .last
                .get(&s.addr)
                .is_some_and(|(l, o)| *l == s.lineage && s.offset < *o)
            {
                s.lineage = self.fork(None, &s.addr);
            }
            let writes = s.takes_writes(ms) && s.failing_over_to.is_none();
            if writes && self.lineages[s.lineage].1 != s.addr {
                s.lineage = self.fork(Some((s.lineage, s.offset)), &s.addr);
            }
        }
    }

    /// After the servers wrote at `ms`: the clients' write to `target`
    /// (the server they are routed to) was acknowledged if it took it: a
    /// master, answering, its fence met (`fence.rs`), neither handing over
    /// (`FAILOVER` pauses writes), paused nor refusing writes
    /// (`-MISCONF`).
    pub(super) fn after_writes(&mut self, servers: &Servers, target: Option<&Addr>, ms: u64) {
        if let Some(s) = target.and_then(|t| servers.get(t))
            && s.takes_writes(ms)
            && s.failing_over_to.is_none()
            && !s.misconf
            && ms >= s.paused_until
        {
            let newest = self.acked.entry(s.lineage).or_default();
            *newest = (*newest).max(s.offset);
        }
        for s in &servers.0 {
            self.last.insert(s.addr.clone(), (s.lineage, s.offset));
        }
    }

    /// Whether data of `lineage` up to `offset` holds write `w`.
    fn holds(&self, mut lineage: usize, mut offset: u64, w: (usize, u64)) -> bool {
        loop {
            if lineage == w.0 {
                return offset >= w.1;
            }
            match self.lineages[lineage].0 {
                Some((parent, at)) => {
                    offset = offset.min(at);
                    lineage = parent;
                }
                None => return false,
            }
        }
    }

    /// The newest acknowledged write of a lineage that `s` does not hold,
    /// and who wrote it.
    pub(super) fn missing(&self, s: &Server) -> Option<(u64, &Addr)> {
        self.acked
            .iter()
            .find(|(l, o)| !self.holds(s.lineage, s.offset, (**l, **o)))
            .map(|(l, o)| (*o, &self.lineages[*l].1))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Servers, Sim, addr};
    use super::*;

    fn servers() -> Servers {
        let sim = Sim::new(1, 1, 1);
        Servers(sim.servers.0.clone())
    }

    /// A replica promoted while it lagged lacks the old master's last
    /// acknowledged writes, whatever its offset reaches after; one that
    /// had copied them holds them, and so do its own replicas.
    #[tokio::test]
    async fn a_promoted_replica_holds_what_it_had_copied_and_nothing_after() {
        let mut s = servers();
        let mut c = Clients::new(addr(7000));
        let (m, slow, fast) = (addr(7000), addr(7001), addr(7002));
        for ms in [100, 200] {
            c.before_writes(&mut s, ms);
            s.replicate(ms);
            c.after_writes(&s, Some(&m), ms);
        }
        // 7001 copies every 300 ms: one write behind, 7002 caught up.
        assert_eq!(s.get(&slow).map(|x| x.offset), Some(1000));
        assert!(c.missing(s.get(&fast).expect("7002")).is_none());
        let lost = c.missing(s.get(&slow).expect("7001"));
        assert_eq!(lost, Some((1002, &m)));
        // 7001 promoted: its own writes go past 1002, the loss stays.
        s.get_mut(&slow).master = None;
        s.get_mut(&fast).master = Some(slow.clone());
        s.get_mut(&m).master = Some(slow.clone());
        for ms in [300, 400, 500] {
            c.before_writes(&mut s, ms);
            s.replicate(ms);
            c.after_writes(&s, Some(&slow), ms);
        }
        assert_eq!(s.get(&slow).map(|x| x.offset), Some(1003));
        assert_eq!(c.missing(s.get(&slow).expect("7001")), Some((1002, &m)));
        // The old master's copy of the new one drops its 1002 too.
        assert_eq!(c.missing(s.get(&m).expect("7000")), Some((1002, &m)));
        // A server back empty holds nothing.
        let e = s.get_mut(&fast);
        e.offset = 0;
        e.master = None;
        c.before_writes(&mut s, 600);
        assert!(c.missing(s.get(&fast).expect("7002")).is_some());
    }
}
