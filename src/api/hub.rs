//! Events routed to the subscribers of their channel.
//!
//! Every subscribed connection used to hold a receiver of the daemon's
//! event bus, so each event woke every subscriber, whatever it had
//! subscribed to: a failover's dozen events woke 5,000 `+switch-master`
//! subscribers a dozen times before the one they wanted, and the last of
//! them got it a fifth of a second after the first. As Redis indexes
//! subscribers by channel, one task here reads the bus and puts each event
//! in the mailboxes of the connections subscribed to its channel (or to a
//! pattern that matches it); only those are woken.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, broadcast};

use super::pubsub::{Subscriptions, glob_match};
use crate::events::{Event, Events};

/// Most events one subscriber may have waiting (the bus's own bound):
/// one that falls further behind is disconnected as slow.
pub const MAX_WAITING: usize = 4096;

/// Events waiting for one subscribed connection.
#[derive(Debug)]
pub struct Mailbox {
    queue: Mutex<Waiting>,
    ready: Notify,
}

#[derive(Debug)]
struct Waiting {
    events: VecDeque<Arc<Event>>,
    /// Events dropped for want of room.
    missed: u64,
    /// The first [`Event::seq`] this subscriber is owed.
    since: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Mailbox {
    fn new(since: u64) -> Mailbox {
        Mailbox {
            queue: Mutex::new(Waiting {
                events: VecDeque::new(),
                missed: 0,
                since,
            }),
            ready: Notify::new(),
        }
    }

    fn push(&self, ev: &Arc<Event>) {
        let mut q = lock(&self.queue);
        if ev.seq < q.since {
            return;
        }
        if q.events.len() >= MAX_WAITING {
            q.missed += 1;
        } else {
            q.events.push_back(ev.clone());
        }
        let first = q.events.len() == 1 || q.missed == 1;
        drop(q);
        // The receiver looks at the queue before it waits, so a wake-up
        // is needed only when the queue stops being empty.
        if first {
            self.ready.notify_one();
        }
    }

    fn miss(&self, n: u64) {
        lock(&self.queue).missed += n;
        self.ready.notify_one();
    }

    /// The next waiting event, without waiting; `Err(n)` once `n` events
    /// were missed (the subscriber is too slow).
    pub fn try_recv(&self) -> Result<Option<Arc<Event>>, u64> {
        let mut q = lock(&self.queue);
        if q.missed > 0 {
            return Err(q.missed);
        }
        Ok(q.events.pop_front())
    }

    /// The next event (cancel-safe: an event is taken only by a poll that
    /// returns it).
    pub async fn recv(&self) -> Result<Arc<Event>, u64> {
        loop {
            if let Some(ev) = self.try_recv()? {
                return Ok(ev);
            }
            self.ready.notified().await;
        }
    }
}

/// Who is subscribed to what.
#[derive(Debug, Default)]
struct Index {
    /// Channel → its subscribers' mailboxes, by connection id.
    channels: HashMap<String, HashMap<u64, Arc<Mailbox>>>,
    /// Connections with patterns: their mailbox and patterns.
    patterns: HashMap<u64, (Arc<Mailbox>, Vec<String>)>,
    /// Each subscribed connection's channels.
    subscribed: HashMap<u64, Vec<String>>,
}

impl Index {
    fn remove(&mut self, id: u64) {
        for ch in self.subscribed.remove(&id).unwrap_or_default() {
            if let Some(subs) = self.channels.get_mut(&ch) {
                subs.remove(&id);
                if subs.is_empty() {
                    self.channels.remove(&ch);
                }
            }
        }
        self.patterns.remove(&id);
    }

    fn deliver(&self, ev: &Arc<Event>) {
        let direct = self.channels.get(&ev.channel);
        for mb in direct.into_iter().flat_map(|subs| subs.values()) {
            mb.push(ev);
        }
        for (id, (mb, patterns)) in &self.patterns {
            // One push per connection: it finds its `message` and every
            // `pmessage` in the one event.
            if direct.is_some_and(|subs| subs.contains_key(id)) {
                continue;
            }
            if patterns.iter().any(|p| glob_match(p, &ev.channel)) {
                mb.push(ev);
            }
        }
    }

    fn everyone(&self) -> impl Iterator<Item = &Arc<Mailbox>> {
        self.channels
            .values()
            .flat_map(|subs| subs.values())
            .chain(self.patterns.values().map(|(mb, _)| mb))
    }
}

/// The subscribers of one API (every listener of it) and the task that
/// passes the daemon's events to them.
#[derive(Debug)]
pub struct Hub {
    index: Mutex<Index>,
    /// The bus, read by [`Hub::run`] once a listener starts it. Taken at
    /// creation, so that nothing emitted after it is missed.
    bus: Mutex<Option<broadcast::Receiver<Arc<Event>>>>,
}

impl Hub {
    /// A hub reading `events` from now on.
    pub fn new(events: &Events) -> Hub {
        Hub {
            index: Mutex::new(Index::default()),
            bus: Mutex::new(Some(events.subscribe())),
        }
    }

    /// Pass the events on, on the calling runtime, until the bus closes
    /// (the first listener to start runs it; the others return at once).
    pub async fn run(self: Arc<Self>) {
        let Some(mut rx) = lock(&self.bus).take() else {
            return;
        };
        loop {
            match rx.recv().await {
                Ok(ev) => lock(&self.index).deliver(&ev),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    // Everyone subscribed missed these.
                    for mb in lock(&self.index).everyone() {
                        mb.miss(n);
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Connection `id`'s subscriptions are now `subs`: its mailbox (made
    /// at its first subscription, owed the events from `since` on), or
    /// None once it has none.
    pub fn update(
        &self,
        id: u64,
        mailbox: Option<Arc<Mailbox>>,
        subs: &Subscriptions,
        since: u64,
    ) -> Option<Arc<Mailbox>> {
        let mut index = lock(&self.index);
        index.remove(id);
        if subs.count() == 0 {
            return None;
        }
        let mb = mailbox.unwrap_or_else(|| Arc::new(Mailbox::new(since)));
        let channels: Vec<String> = subs.channel_names().cloned().collect();
        for ch in &channels {
            index
                .channels
                .entry(ch.clone())
                .or_default()
                .insert(id, mb.clone());
        }
        index.subscribed.insert(id, channels);
        if subs.patterns() > 0 {
            index
                .patterns
                .insert(id, (mb.clone(), subs.pattern_names().to_vec()));
        }
        Some(mb)
    }

    /// Connection `id` is gone.
    pub fn remove(&self, id: u64) {
        lock(&self.index).remove(id);
    }

    /// How many connections are subscribed to something.
    pub fn subscribers(&self) -> usize {
        lock(&self.index).subscribed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventKind;

    fn subs(channels: &[&str], patterns: &[&str]) -> Subscriptions {
        let mut s = Subscriptions::default();
        let c: Vec<String> = channels.iter().map(|c| c.to_string()).collect();
        let p: Vec<String> = patterns.iter().map(|c| c.to_string()).collect();
        if !c.is_empty() {
            s.subscribe(&c);
        }
        if !p.is_empty() {
            s.psubscribe(&p);
        }
        s
    }

    fn drain(mb: &Mailbox) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(Some(ev)) = mb.try_recv() {
            out.push(format!("{} {}", ev.channel, ev.message));
        }
        out
    }

    #[tokio::test]
    async fn an_event_reaches_only_the_subscribers_of_its_channel_once_each() {
        let events = Events::new();
        let hub = Arc::new(Hub::new(&events));
        tokio::spawn(hub.clone().run());
        let since = events.next_seq();
        let switch = hub
            .update(1, None, &subs(&["+switch-master"], &[]), since)
            .unwrap();
        let sdown = hub.update(2, None, &subs(&["+sdown"], &[]), since).unwrap();
        // A channel and a pattern that both match: one event in its box.
        let both = hub
            .update(3, None, &subs(&["+sdown"], &["+s*"]), since)
            .unwrap();
        let pattern = hub.update(4, None, &subs(&[], &["-*"]), since).unwrap();
        assert_eq!(hub.subscribers(), 4);
        events.emit(EventKind::Sdown, "a");
        events.emit(EventKind::SwitchMaster, "b");
        events.emit(EventKind::SdownCleared, "c");
        // The last event reached its only subscriber: everything before it
        // was passed on.
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while pattern.queue.lock().unwrap().events.is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        assert_eq!(drain(&switch), ["+switch-master b"]);
        assert_eq!(drain(&sdown), ["+sdown a"]);
        assert_eq!(drain(&both), ["+sdown a", "+switch-master b"]);
        assert_eq!(drain(&pattern), ["-sdown c"]);
    }

    #[tokio::test]
    async fn a_subscription_gets_the_events_from_its_start_and_none_after_its_end() {
        let events = Events::new();
        let hub = Arc::new(Hub::new(&events));
        // Emitted before the subscription, passed on after it: not owed.
        events.emit(EventKind::Sdown, "before");
        let mb = hub
            .update(1, None, &subs(&["+sdown"], &[]), events.next_seq())
            .unwrap();
        events.emit(EventKind::Sdown, "after");
        tokio::spawn(hub.clone().run());
        let ev = tokio::time::timeout(std::time::Duration::from_secs(5), mb.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ev.message, "after");
        assert!(
            hub.update(1, Some(mb.clone()), &subs(&[], &[]), 0)
                .is_none()
        );
        assert_eq!(hub.subscribers(), 0);
        // Another subscriber's event, emitted last, shows when the hub has
        // passed on everything before it.
        let other = hub
            .update(2, None, &subs(&["+odown"], &[]), events.next_seq())
            .unwrap();
        events.emit(EventKind::Sdown, "gone");
        events.emit(EventKind::Odown, "flush");
        tokio::time::timeout(std::time::Duration::from_secs(5), other.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(drain(&mb), Vec::<String>::new());
    }

    #[test]
    fn a_subscriber_that_falls_behind_is_told_how_far() {
        let mb = Mailbox::new(0);
        for i in 0..MAX_WAITING as u64 + 3 {
            mb.push(&Arc::new(Event {
                channel: "+sdown".into(),
                message: String::new(),
                seq: i,
            }));
        }
        assert_eq!(mb.try_recv().unwrap_err(), 3);
    }
}
