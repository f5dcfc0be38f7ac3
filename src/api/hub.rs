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

use bytes::{Bytes, BytesMut};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{Notify, broadcast};

use super::pubsub::{Subscriptions, encode_message, glob_match};
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
    /// While the connection is parked (see [`Mailbox::park`]): its socket
    /// and whether it speaks RESP3.
    direct: Option<(Arc<OwnedWriteHalf>, bool)>,
    /// The end of a message the hub began writing that the socket did not
    /// take: the connection writes it before anything else.
    rest: Option<Bytes>,
}

/// What a connection takes from its mailbox.
#[derive(Debug)]
pub enum Mail {
    /// The end of a message the hub began writing: to be written first,
    /// as it is.
    Rest(Bytes),
    /// An event to encode for the connection's subscriptions.
    Event(Arc<Event>),
}

/// One event's `message`, encoded at most once per protocol for all of
/// its channel's subscribers.
struct Message<'a> {
    ev: &'a Event,
    resp2: Option<Bytes>,
    resp3: Option<Bytes>,
}

impl<'a> Message<'a> {
    fn new(ev: &'a Event) -> Message<'a> {
        Message {
            ev,
            resp2: None,
            resp3: None,
        }
    }

    fn get(&mut self, resp3: bool) -> &Bytes {
        let ev = self.ev;
        let slot = if resp3 {
            &mut self.resp3
        } else {
            &mut self.resp2
        };
        slot.get_or_insert_with(|| {
            let mut b = BytesMut::new();
            encode_message(ev, &mut b, resp3);
            b.freeze()
        })
    }
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
                direct: None,
                rest: None,
            }),
            ready: Notify::new(),
        }
    }

    /// Hand `ev` to the connection: written to its socket at once while
    /// it is parked, otherwise queued for its task.
    ///
    /// Why write here: a fan-out to thousands of subscribers woke each
    /// one's task, which was polled, encoded the same message and wrote
    /// it (about 8.8 µs a subscriber on the listener's core, against
    /// Sentinel's 6.5 µs for appending to a buffer and writing in one
    /// loop). A parked connection has nothing unsent and no task in the
    /// middle of a write, so its socket takes the shared bytes directly.
    fn push(&self, ev: &Arc<Event>, msg: &mut Message<'_>) {
        let mut q = lock(&self.queue);
        if ev.seq < q.since {
            return;
        }
        if let Some((sock, resp3)) = q.direct.take() {
            let bytes = msg.get(resp3);
            match sock.as_ref().try_write(bytes) {
                Ok(n) if n == bytes.len() => {
                    q.direct = Some((sock, resp3));
                    return;
                }
                Ok(n) if n > 0 => {
                    // The socket is full: the connection finishes the
                    // message (its slow-subscriber deadline applies).
                    q.rest = Some(bytes.slice(n..));
                    drop(q);
                    self.ready.notify_one();
                    return;
                }
                // Not writable now, or an error: the connection's task
                // takes the event and meets the socket's state itself.
                _ => {}
            }
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
        let mut q = lock(&self.queue);
        q.missed += n;
        q.direct = None;
        drop(q);
        self.ready.notify_one();
    }

    /// Park the connection: from now on the hub writes its channels'
    /// messages to `sock` itself (in RESP3 when `resp3`), until
    /// [`Mailbox::unpark`]. Only a connection that has nothing unsent and
    /// no pattern (the hub writes a channel's `message` only) may park;
    /// refused (false) while anything waits here for its task.
    pub fn park(&self, sock: &Arc<OwnedWriteHalf>, resp3: bool) -> bool {
        let mut q = lock(&self.queue);
        if !q.events.is_empty() || q.rest.is_some() || q.missed > 0 {
            return false;
        }
        q.direct = Some((sock.clone(), resp3));
        true
    }

    /// The connection writes itself again: the hub queues its events.
    /// Returns once any write of the hub to its socket is over (the
    /// hub writes under the same lock), with the end of a message the
    /// hub began and the socket did not take, if there is one.
    ///
    /// Why hand it back here instead of leaving it for [`Mailbox::recv`]:
    /// a connection that wakes to read a request unparks and writes its
    /// reply. A partial write of the hub between its last look at the
    /// mailbox and the unparking left the message's end behind, and the
    /// reply went into the middle of the message. The caller puts this
    /// first in its output, before any byte of its own.
    pub fn unpark(&self) -> Option<Bytes> {
        let mut q = lock(&self.queue);
        q.direct = None;
        q.rest.take()
    }

    /// The next waiting mail, without waiting; `Err(n)` once `n` events
    /// were missed (the subscriber is too slow).
    pub fn try_recv(&self) -> Result<Option<Mail>, u64> {
        let mut q = lock(&self.queue);
        if q.missed > 0 {
            return Err(q.missed);
        }
        if let Some(b) = q.rest.take() {
            return Ok(Some(Mail::Rest(b)));
        }
        Ok(q.events.pop_front().map(Mail::Event))
    }

    /// The next mail (cancel-safe: it is taken only by a poll that
    /// returns it).
    pub async fn recv(&self) -> Result<Mail, u64> {
        loop {
            if let Some(m) = self.try_recv()? {
                return Ok(m);
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
    /// Forget connection `id`; its mailbox, if it had one.
    fn remove(&mut self, id: u64) -> Option<Arc<Mailbox>> {
        let mut mailbox = None;
        for ch in self.subscribed.remove(&id).unwrap_or_default() {
            if let Some(subs) = self.channels.get_mut(&ch) {
                mailbox = subs.remove(&id).or(mailbox);
                if subs.is_empty() {
                    self.channels.remove(&ch);
                }
            }
        }
        self.patterns.remove(&id).map(|(mb, _)| mb).or(mailbox)
    }

    fn deliver(&self, ev: &Arc<Event>) {
        let mut msg = Message::new(ev);
        let direct = self.channels.get(&ev.channel);
        for mb in direct.into_iter().flat_map(|subs| subs.values()) {
            mb.push(ev, &mut msg);
        }
        for (id, (mb, patterns)) in &self.patterns {
            // One push per connection: it finds its `message` and every
            // `pmessage` in the one event.
            if direct.is_some_and(|subs| subs.contains_key(id)) {
                continue;
            }
            if patterns.iter().any(|p| glob_match(p, &ev.channel)) {
                // Never parked (it has patterns): queued.
                mb.push(ev, &mut msg);
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

    /// Connection `id` is gone (its socket no longer written here, even
    /// if its task ended while parked).
    pub fn remove(&self, id: u64) {
        let mailbox = lock(&self.index).remove(id);
        if let Some(mb) = mailbox {
            mb.unpark();
        }
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
        while let Ok(Some(m)) = mb.try_recv() {
            match m {
                Mail::Event(ev) => out.push(format!("{} {}", ev.channel, ev.message)),
                Mail::Rest(b) => out.push(String::from_utf8_lossy(&b).into_owned()),
            }
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
        let m = tokio::time::timeout(std::time::Duration::from_secs(5), mb.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(m, Mail::Event(ev) if ev.message == "after"));
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

    /// A connected pair: the server side's writing half (as a connection
    /// shares it) and the client's socket.
    async fn pair() -> (Arc<OwnedWriteHalf>, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = l.accept().await.unwrap();
        let (_rd, wr) = server.into_split();
        // The socket's first readiness comes from the reactor.
        wr.as_ref().writable().await.unwrap();
        (Arc::new(wr), client)
    }

    fn event(seq: u64, message: &str) -> Arc<Event> {
        Arc::new(Event {
            channel: "+switch-master".into(),
            message: message.into(),
            seq,
        })
    }

    async fn read_exact(c: &mut tokio::net::TcpStream, n: usize) -> String {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; n];
        tokio::time::timeout(std::time::Duration::from_secs(5), c.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[tokio::test]
    async fn a_parked_subscriber_is_written_to_without_its_task() {
        let (sock, mut client) = pair().await;
        let mb = Mailbox::new(0);
        assert!(mb.park(&sock, false));
        let ev = event(0, "cache 1.2.3.4 1 5.6.7.8 2");
        mb.push(&ev, &mut Message::new(&ev));
        let want =
            "*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$25\r\ncache 1.2.3.4 1 5.6.7.8 2\r\n";
        assert_eq!(read_exact(&mut client, want.len()).await, want);
        assert!(matches!(mb.try_recv(), Ok(None)), "queued as well");
        // RESP3: a push frame.
        mb.unpark();
        assert!(mb.park(&sock, true));
        let ev = event(1, "x");
        mb.push(&ev, &mut Message::new(&ev));
        let want = ">3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$1\r\nx\r\n";
        assert_eq!(read_exact(&mut client, want.len()).await, want);
        // Unparked: queued for the task, nothing written.
        mb.unpark();
        let ev = event(2, "y");
        mb.push(&ev, &mut Message::new(&ev));
        assert!(matches!(mb.try_recv(), Ok(Some(Mail::Event(e))) if e.message == "y"));
    }

    #[tokio::test]
    async fn a_full_socket_hands_the_rest_of_the_message_to_the_task() {
        let (sock, mut client) = pair().await;
        let mb = Mailbox::new(0);
        assert!(mb.park(&sock, false));
        // Large messages until the socket (nobody reads it) takes part of
        // one only; bounded: the kernel's buffers are far below 64 MiB.
        let big = "z".repeat(64 * 1024);
        let one = {
            let ev = event(0, &big);
            Message::new(&ev).get(false).len()
        };
        let mut written = 0usize;
        let mut rest = 0usize;
        let mut queued = false;
        for seq in 0..1024 {
            let ev = event(seq, &big);
            mb.push(&ev, &mut Message::new(&ev));
            match mb.try_recv() {
                Ok(None) => written += one,
                Ok(Some(Mail::Rest(b))) => {
                    rest = b.len();
                    written += one - rest;
                    break;
                }
                // Not one byte taken: queued whole.
                Ok(Some(Mail::Event(_))) => {
                    queued = true;
                    break;
                }
                Err(n) => panic!("missed {n}"),
            }
        }
        assert!(rest > 0 || queued, "the socket never filled");
        // Unparked by the hub: the next event waits for the task.
        let ev = event(2000, "after");
        mb.push(&ev, &mut Message::new(&ev));
        assert!(matches!(mb.try_recv(), Ok(Some(Mail::Event(e))) if e.message == "after"));
        // What went out is whole messages, then the start of the one whose
        // rest the task has.
        let got = read_exact(&mut client, written).await;
        assert_eq!((got.len() + rest) % one, 0);
        assert!(got.starts_with("*3\r\n$7\r\nmessage\r\n"));
    }

    /// The bug behind a reply written into the middle of a `message`:
    /// the hub wrote part of one, the connection woke for a request and
    /// unparked, and the message's end stayed in the mailbox, to be taken
    /// after the reply. Unparking now hands it back, once.
    #[tokio::test]
    async fn unparking_hands_back_the_end_of_a_message_the_hub_began() {
        let (sock, mut client) = pair().await;
        let mb = Mailbox::new(0);
        // Messages larger than a fresh loopback socket's buffers, so that
        // the hub's write is partial; numbered, to check each goes out
        // once and in order.
        let pad = "z".repeat(1 << 20);
        let msg = |seq: u64| format!("{seq:08} {pad}");
        let one = {
            let ev = event(0, &msg(0));
            Message::new(&ev).get(false).len()
        };
        // What the hub wrote, and how much of it the client has read.
        let (mut sent, mut read) = (0usize, Vec::new());
        let mut seq = 0u64;
        let rest = loop {
            assert!(seq < 64, "no partial write in 64 messages");
            assert!(mb.park(&sock, false));
            let ev = event(seq, &msg(seq));
            mb.push(&ev, &mut Message::new(&ev));
            seq += 1;
            let (partial, queued) = {
                let q = lock(&mb.queue);
                (q.rest.as_ref().map(|r| r.len()), !q.events.is_empty())
            };
            if let Some(left) = partial {
                sent += one - left;
                break mb.unpark().expect("the end of the message is handed back");
            }
            if queued {
                // Not one byte taken: the event waits for the task. Make
                // room and try again with the next one.
                mb.unpark();
                assert!(matches!(mb.try_recv(), Ok(Some(Mail::Event(_)))));
                seq -= 1;
                let n = (sent - read.len()).min(256 * 1024);
                read.extend_from_slice(read_exact(&mut client, n).await.as_bytes());
                tokio::time::timeout(std::time::Duration::from_secs(5), sock.as_ref().writable())
                    .await
                    .unwrap()
                    .unwrap();
                continue;
            }
            sent += one;
            mb.unpark();
        };
        // Handed over once: not again through the mailbox.
        assert!(
            matches!(mb.try_recv(), Ok(None)),
            "the end handed over twice"
        );
        assert!(mb.park(&sock, false), "nothing left waiting");
        mb.unpark();
        // The client's stream, with the handed-back end after it, is every
        // message once, in order.
        let n = sent - read.len();
        read.extend_from_slice(read_exact(&mut client, n).await.as_bytes());
        read.extend_from_slice(&rest);
        assert_eq!(read.len(), seq as usize * one);
        for (i, m) in read.chunks(one).enumerate() {
            let want = {
                let ev = event(i as u64, &msg(i as u64));
                Message::new(&ev).get(false).clone()
            };
            assert!(m == &want[..], "message {i} is not whole or not in order");
        }
    }

    #[test]
    fn a_subscriber_that_falls_behind_is_told_how_far() {
        let mb = Mailbox::new(0);
        for i in 0..MAX_WAITING as u64 + 3 {
            let ev = Arc::new(Event {
                channel: "+sdown".into(),
                message: String::new(),
                seq: i,
            });
            mb.push(&ev, &mut Message::new(&ev));
        }
        assert_eq!(mb.try_recv().unwrap_err(), 3);
    }
}
