//! Events: Sentinel's pub/sub channels (`+sdown`, `+switch-master`, ...),
//! also written to the log.

use tokio::sync::broadcast;

use crate::addr::Addr;

/// One event, as Sentinel publishes it: the channel is the event name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Channel (event type), e.g. `+switch-master`.
    pub channel: String,
    /// Payload, e.g. `cache 10.0.0.1 6379 10.0.0.2 6379`.
    pub message: String,
}

/// The event bus of one daemon.
#[derive(Debug, Clone)]
pub struct Events {
    tx: broadcast::Sender<Event>,
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
        Events { tx }
    }

    /// Publish (and log) an event.
    pub fn emit(&self, channel: &str, message: impl Into<String>) {
        let message = message.into();
        tracing::info!(target: "picket::events", event = channel, "{channel} {message}");
        let _ = self.tx.send(Event {
            channel: channel.to_string(),
            message,
        });
    }

    /// Receive every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
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
    }
}
