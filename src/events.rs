//! Events: Sentinel's pub/sub channels (`+sdown`, `+switch-master`, ...),
//! also written to the log.
//!
//! The decision core names events with [`EventKind`] and says what they are
//! about with [`Detail`]; the group renders the payload with its name and
//! master (Sentinel's `%@` formats), so no event name is ever matched as a
//! string.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::broadcast;

use crate::addr::Addr;

/// Every event picket publishes. The channel names are Sentinel's where
/// Sentinel has the event (`reference/sentinel.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `+sdown`: this daemon sees an instance down.
    Sdown,
    /// `-sdown`: it answers again.
    SdownCleared,
    /// `+odown`: the quorum sees the master down.
    Odown,
    /// `-odown`.
    OdownCleared,
    /// `+new-epoch`: this daemon started a new epoch.
    NewEpoch,
    /// `+try-failover`: an election is starting.
    TryFailover,
    /// `+vote-for-leader`: this daemon voted for another daemon.
    VoteForLeader,
    /// `+elected-leader`: this daemon won the election.
    ElectedLeader,
    /// `-failover-abort-not-elected`.
    AbortNotElected,
    /// `-failover-abort-no-good-slave`.
    AbortNoGoodSlave,
    /// `-failover-abort-slave-timeout`: the promotion did not succeed.
    AbortSlaveTimeout,
    /// `-failover-abort-switchover`: a planned switchover gave up.
    AbortSwitchover,
    /// `+failover-state-select-slave`.
    FailoverStateSelectSlave,
    /// `+selected-slave`.
    SelectedSlave,
    /// `+failover-state-send-slaveof-noone`.
    FailoverStateSendSlaveofNoone,
    /// `+promoted-slave`.
    PromotedSlave,
    /// `+failover-state-reconf-slaves`.
    FailoverStateReconfSlaves,
    /// `-publish-incomplete` (picket's): a backend did not confirm.
    PublishIncomplete,
    /// `+slave-reconf-sent`.
    SlaveReconfSent,
    /// `+slave-reconf-done`.
    SlaveReconfDone,
    /// `-slave-reconf-sent-timeout`.
    SlaveReconfSentTimeout,
    /// `-slave-reconf-failed` (picket's): the `REPLICAOF` was refused.
    SlaveReconfFailed,
    /// `+failover-end`.
    FailoverEnd,
    /// `+failover-end-for-timeout`.
    FailoverEndForTimeout,
    /// `+switch-master`: the group's master changed.
    SwitchMaster,
    /// `+config-update-from`: a newer config came from a peer.
    ConfigUpdateFrom,
    /// `+convert-to-slave`: a stray master is being demoted.
    ConvertToSlave,
    /// `+fix-slave-config`: a replica of the wrong master is re-pointed.
    FixSlaveConfig,
    /// `+slave`: a new replica was discovered.
    Slave,
    /// `+reboot`: an instance restarted (a new `run_id`; on Dragonfly a
    /// master's new replication id or its uptime going back).
    Reboot,
    /// `+reset-master`: `SENTINEL RESET`.
    ResetMaster,
    /// `+script-kill` (picket's): `SCRIPT KILL` sent to an instance that
    /// is SDOWN and answers `-BUSY`.
    ScriptKill,
    /// `+isolation-fence` (picket's): the fence on the master was set or
    /// raised.
    IsolationFence,
    /// `-isolation-fence` (picket's): the fence on the master was lowered,
    /// or cleared on a server that is now a replica.
    IsolationFenceLowered,
    /// `+tilt`: stall protection entered.
    Tilt,
    /// `-tilt`.
    TiltExit,
}

impl EventKind {
    /// The pub/sub channel.
    pub fn channel(self) -> &'static str {
        match self {
            EventKind::Sdown => "+sdown",
            EventKind::SdownCleared => "-sdown",
            EventKind::Odown => "+odown",
            EventKind::OdownCleared => "-odown",
            EventKind::NewEpoch => "+new-epoch",
            EventKind::TryFailover => "+try-failover",
            EventKind::VoteForLeader => "+vote-for-leader",
            EventKind::ElectedLeader => "+elected-leader",
            EventKind::AbortNotElected => "-failover-abort-not-elected",
            EventKind::AbortNoGoodSlave => "-failover-abort-no-good-slave",
            EventKind::AbortSlaveTimeout => "-failover-abort-slave-timeout",
            EventKind::AbortSwitchover => "-failover-abort-switchover",
            EventKind::FailoverStateSelectSlave => "+failover-state-select-slave",
            EventKind::SelectedSlave => "+selected-slave",
            EventKind::FailoverStateSendSlaveofNoone => "+failover-state-send-slaveof-noone",
            EventKind::PromotedSlave => "+promoted-slave",
            EventKind::FailoverStateReconfSlaves => "+failover-state-reconf-slaves",
            EventKind::PublishIncomplete => "-publish-incomplete",
            EventKind::SlaveReconfSent => "+slave-reconf-sent",
            EventKind::SlaveReconfDone => "+slave-reconf-done",
            EventKind::SlaveReconfSentTimeout => "-slave-reconf-sent-timeout",
            EventKind::SlaveReconfFailed => "-slave-reconf-failed",
            EventKind::FailoverEnd => "+failover-end",
            EventKind::FailoverEndForTimeout => "+failover-end-for-timeout",
            EventKind::SwitchMaster => "+switch-master",
            EventKind::ConfigUpdateFrom => "+config-update-from",
            EventKind::ConvertToSlave => "+convert-to-slave",
            EventKind::FixSlaveConfig => "+fix-slave-config",
            EventKind::Slave => "+slave",
            EventKind::Reboot => "+reboot",
            EventKind::ResetMaster => "+reset-master",
            EventKind::ScriptKill => "+script-kill",
            EventKind::IsolationFence => "+isolation-fence",
            EventKind::IsolationFenceLowered => "-isolation-fence",
            EventKind::Tilt => "+tilt",
            EventKind::TiltExit => "-tilt",
        }
    }
}

/// What an event of the decision core is about; the group turns it into
/// Sentinel's payload with [`Detail::render`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detail {
    /// The group's master: `master <name> <ip> <port>`.
    Master,
    /// The master, followed by more text (`#quorum 2/2`, a reason).
    MasterAnd(String),
    /// A replica: `slave <ip>:<port> <ip> <port> @ <name> <mip> <mport>`.
    Replica(Addr),
    /// A payload of its own (`+new-epoch`'s number, a vote).
    Text(String),
}

impl Detail {
    /// Sentinel's payload for `group` whose master is `master`.
    pub fn render(&self, group: &str, master: &Addr) -> String {
        match self {
            Detail::Master => master_details(group, master),
            Detail::MasterAnd(more) => format!("{} {more}", master_details(group, master)),
            Detail::Replica(r) => replica_details(r, group, master),
            Detail::Text(t) => t.clone(),
        }
    }
}

/// One event, as Sentinel publishes it: the channel is the event name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Channel (event type), e.g. `+switch-master`.
    pub channel: String,
    /// Payload, e.g. `cache 10.0.0.1 6379 10.0.0.2 6379`.
    pub message: String,
    /// Its place in the order of this daemon's events (0 first): a
    /// subscription made after [`Events::next_seq`] was `n` receives the
    /// events from `n` on, however late they are passed on to it.
    pub seq: u64,
}

/// The event bus of one daemon.
#[derive(Debug, Clone)]
pub struct Events {
    /// Shared, not cloned, per receiver.
    tx: broadcast::Sender<Arc<Event>>,
    /// The next event's [`Event::seq`].
    seq: Arc<AtomicU64>,
}

impl Default for Events {
    fn default() -> Self {
        Self::new()
    }
}

impl Events {
    /// A bus that keeps up to 4096 undelivered events per slow subscriber.
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(4096);
        Events {
            tx,
            seq: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Publish (and log) an event.
    pub fn emit(&self, kind: EventKind, message: impl Into<String>) {
        let message = message.into();
        let channel = kind.channel();
        tracing::info!(target: "picket::events", event = channel, "{channel} {message}");
        // Numbered when made: two groups emitting at once may send theirs
        // in the other order, but a subscription's start is still exact.
        let _ = self.tx.send(Arc::new(Event {
            channel: channel.to_string(),
            message,
            seq: self.seq.fetch_add(1, Ordering::SeqCst),
        }));
    }

    /// The [`Event::seq`] the next event will have.
    pub fn next_seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Receive every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }
}

/// Sentinel's `%@` details of a master: `master <name> <ip> <port>`.
pub fn master_details(group: &str, master: &Addr) -> String {
    format!("master {group} {} {}", master.host, master.port)
}

/// Sentinel's `%@` details of a replica:
/// `slave <ip>:<port> <ip> <port> @ <group> <mip> <mport>`.
pub fn replica_details(replica: &Addr, group: &str, master: &Addr) -> String {
    format!(
        "slave {}:{} {} {} @ {group} {} {}",
        replica.host, replica.port, replica.host, replica.port, master.host, master.port
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_formats() {
        let m = Addr::new("10.0.0.1", 6379);
        let r = Addr::new("10.0.0.2", 6380);
        assert_eq!(master_details("cache", &m), "master cache 10.0.0.1 6379");
        assert_eq!(
            replica_details(&r, "cache", &m),
            "slave 10.0.0.2:6380 10.0.0.2 6380 @ cache 10.0.0.1 6379"
        );
        assert_eq!(
            Detail::MasterAnd("#quorum 2/2".into()).render("cache", &m),
            "master cache 10.0.0.1 6379 #quorum 2/2"
        );
        assert_eq!(
            Detail::Replica(r.clone()).render("cache", &m),
            replica_details(&r, "cache", &m)
        );
        assert_eq!(Detail::Text("7".into()).render("cache", &m), "7");
    }

    #[test]
    fn channels_are_sentinel_names() {
        assert_eq!(EventKind::SwitchMaster.channel(), "+switch-master");
        assert_eq!(
            EventKind::FailoverStateSendSlaveofNoone.channel(),
            "+failover-state-send-slaveof-noone"
        );
        assert_eq!(EventKind::TiltExit.channel(), "-tilt");
    }
}
