//! Delay with jitter on real packets, for a kernel without netem.
//!
//! netem's `delay 50ms 50ms` holds each packet for a time drawn uniformly
//! from 0–100 ms (50 ms ± 50 ms), and packets held for different times
//! leave out of order. This machine's kernel has no netem (nor `fq`, which
//! a BPF program setting departure times would need), but it has iptables'
//! NFQUEUE target and `nfnetlink_queue`: the kernel hands each matching
//! packet to a user-space program and holds it until that program gives a
//! verdict. [`Jitter`] is that program, on a thread of the test: it takes
//! every queued packet, draws its delay and gives it back (`NF_ACCEPT`)
//! once that has passed, each packet on its own, as netem does.
//!
//! Only the packets' metadata are copied to user space, and a GSO packet
//! (up to 64 KiB on `lo`) is queued whole, as netem would delay it.
//!
//! It runs iptables through the partitions' helper
//! ([`crate::partition::iptables`]).
//!
//! The netlink messages are built by hand (nfnetlink's header, then
//! attributes): the protocol is small and stable (linux/netfilter/
//! nfnetlink_queue.h), and the C library for it is not installed here.

use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    setsockopt, sockopt,
};
use nix::sys::time::TimeVal;

/// nfnetlink subsystem of the queue (`NFNL_SUBSYS_QUEUE`).
const SUBSYS_QUEUE: u16 = 3;
const MSG_PACKET: u16 = SUBSYS_QUEUE << 8;
const MSG_VERDICT: u16 = (SUBSYS_QUEUE << 8) | 1;
const MSG_CONFIG: u16 = (SUBSYS_QUEUE << 8) | 2;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
/// `NFQA_CFG_*` attributes.
const CFG_CMD: u16 = 1;
const CFG_PARAMS: u16 = 2;
const CFG_QUEUE_MAXLEN: u16 = 3;
const CFG_MASK: u16 = 4;
const CFG_FLAGS: u16 = 5;
/// `NFQNL_CFG_CMD_BIND`.
const CMD_BIND: u8 = 1;
/// `NFQNL_COPY_META`: the packet's id and headers' metadata, no payload.
const COPY_META: u8 = 1;
/// `NFQA_CFG_F_GSO`: a GSO packet is queued whole, not segmented.
const F_GSO: u32 = 4;
/// `NFQA_PACKET_HDR` (in a packet) and `NFQA_VERDICT_HDR` (in a verdict).
const PACKET_HDR: u16 = 1;
const VERDICT_HDR: u16 = 2;
const NF_ACCEPT: u32 = 1;

/// What [`Jitter`] did, once stopped.
#[derive(Debug, Default, Clone)]
pub struct JitterStats {
    /// Packets delayed and given back.
    pub packets: u64,
    /// Their mean delay.
    pub mean: Duration,
    /// The longest.
    pub max: Duration,
    /// Most packets held at once.
    pub most_held: usize,
    /// Receive errors (ENOBUFS: the kernel dropped packets it could not
    /// queue to this socket).
    pub errors: u64,
}

/// A running delayer on NFQUEUE `queue`, with the iptables rule that feeds
/// it; both removed on [`Jitter::stop`] or drop.
pub struct Jitter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<JitterStats>>,
    rule: Vec<String>,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// One nfnetlink message: the netlink header, nfnetlink's (family,
/// version 0, the queue number big-endian), then the attributes.
fn message(ty: u16, flags: u16, seq: u32, queue: u16, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    // AF_UNSPEC: the queue, not a protocol family, is addressed.
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&queue.to_be_bytes());
    for (t, payload) in attrs {
        let len = 4 + payload.len();
        m.extend_from_slice(&u16::try_from(len).expect("small attribute").to_ne_bytes());
        m.extend_from_slice(&t.to_ne_bytes());
        m.extend_from_slice(payload);
        m.resize(align4(m.len()), 0);
    }
    let total = u32::try_from(m.len()).expect("small message");
    m[0..4].copy_from_slice(&total.to_ne_bytes());
    m[4..6].copy_from_slice(&ty.to_ne_bytes());
    m[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    m
}

/// The netlink messages in `buf`: (type, the message's bytes).
fn messages(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().expect("4 bytes")) as usize;
        let ty = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().expect("2 bytes"));
        if len < 16 || off + len > buf.len() {
            break;
        }
        out.push((ty, &buf[off..off + len]));
        off += align4(len);
    }
    out
}

/// The packet id of a queued packet's message (its `NFQA_PACKET_HDR`).
fn packet_id(msg: &[u8]) -> Option<u32> {
    // netlink header (16) + nfgenmsg (4), then attributes.
    let mut off = 20;
    while off + 4 <= msg.len() {
        let len = u16::from_ne_bytes(msg[off..off + 2].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes(msg[off + 2..off + 4].try_into().ok()?) & 0x3fff;
        if len < 4 || off + len > msg.len() {
            return None;
        }
        if ty == PACKET_HDR && len >= 8 {
            return Some(u32::from_be_bytes(msg[off + 4..off + 8].try_into().ok()?));
        }
        off += align4(len);
    }
    None
}

/// Send `msg` and wait for the kernel's acknowledgement.
fn request(fd: &OwnedFd, msg: &[u8]) -> Result<(), String> {
    send(fd.as_raw_fd(), msg, MsgFlags::empty()).map_err(|e| format!("netlink send: {e}"))?;
    let mut buf = vec![0u8; 8192];
    let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())
        .map_err(|e| format!("netlink ack: {e}"))?;
    for (ty, m) in messages(&buf[..n]) {
        if ty == NLMSG_ERROR && m.len() >= 20 {
            let err = i32::from_ne_bytes(m[16..20].try_into().expect("4 bytes"));
            if err != 0 {
                return Err(format!(
                    "nfnetlink_queue refused a configuration message: {}",
                    std::io::Error::from_raw_os_error(-err)
                ));
            }
            return Ok(());
        }
    }
    Err("no acknowledgement from nfnetlink_queue".into())
}

/// A packet held until `due`.
#[derive(PartialEq, Eq)]
struct Held {
    due: Instant,
    queued: Instant,
    id: u32,
}

impl Ord for Held {
    // Earliest first out of a max-heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.due.cmp(&self.due).then(other.id.cmp(&self.id))
    }
}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// `iptables OP RULE...` (the shared helper of the partitions).
fn iptables(op: &str, rule: &[String]) -> Result<(), String> {
    let args: Vec<&str> = std::iter::once(op)
        .chain(rule.iter().map(String::as_str))
        .collect();
    crate::partition::iptables(&args)
}

impl Jitter {
    /// Delay every packet that iptables' `matches` select (on this network
    /// namespace's INPUT chain, after the rules already there: a packet a
    /// loss rule drops is never queued) by a time drawn uniformly from
    /// `mean ± jitter`. Call on the thread that entered the test's network
    /// namespace: the queue and the rule are that namespace's.
    pub fn start(
        matches: &[String],
        mean: Duration,
        jitter: Duration,
        queue: u16,
    ) -> Result<Jitter, String> {
        let fd = nix::sys::socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(|e| format!("netlink socket: {e}"))?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(|e| format!("netlink bind: {e}"))?;
        // Room for bursts of queued packets (a replication stream).
        let _ = setsockopt(&fd, sockopt::RcvBufForce, &(4 << 20));
        let cmd = vec![CMD_BIND, 0, 0, 2];
        request(
            &fd,
            &message(MSG_CONFIG, NLM_F_ACK, 1, queue, &[(CFG_CMD, cmd)]),
        )?;
        let mut params = 0u32.to_be_bytes().to_vec();
        params.push(COPY_META);
        request(
            &fd,
            &message(
                MSG_CONFIG,
                NLM_F_ACK,
                2,
                queue,
                &[
                    (CFG_PARAMS, params),
                    (CFG_QUEUE_MAXLEN, 16_384u32.to_be_bytes().to_vec()),
                    (CFG_FLAGS, F_GSO.to_be_bytes().to_vec()),
                    (CFG_MASK, F_GSO.to_be_bytes().to_vec()),
                ],
            ),
        )?;
        let mut rule = vec!["INPUT".to_string()];
        rule.extend(matches.iter().cloned());
        rule.extend(
            ["-j", "NFQUEUE", "--queue-num"]
                .iter()
                .map(|s| s.to_string()),
        );
        rule.push(queue.to_string());
        iptables("-A", &rule)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("jitter".into())
            .spawn(move || run(fd, queue, mean, jitter, &s))
            .map_err(|e| format!("jitter thread: {e}"))?;
        Ok(Jitter {
            stop,
            thread: Some(thread),
            rule,
        })
    }

    /// Remove the rule, give back every held packet and return what was
    /// done.
    pub fn stop(mut self) -> JitterStats {
        self.finish()
    }

    fn finish(&mut self) -> JitterStats {
        let _ = iptables("-D", &self.rule);
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Jitter {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.finish();
        }
    }
}

fn run(
    fd: OwnedFd,
    queue: u16,
    mean: Duration,
    jitter: Duration,
    stop: &AtomicBool,
) -> JitterStats {
    let lo = mean.saturating_sub(jitter).as_micros() as u64;
    let hi = (mean + jitter).as_micros() as u64;
    let mut held: BinaryHeap<Held> = BinaryHeap::new();
    let mut stats = JitterStats::default();
    let mut total = Duration::ZERO;
    let mut buf = vec![0u8; 65_536];
    let mut seq = 10u32;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        // Give back what is due (everything once stopping).
        let now = Instant::now();
        let mut verdicts = Vec::new();
        while held.peek().is_some_and(|h| stopping || h.due <= now) {
            let Some(h) = held.pop() else { break };
            let mut v = NF_ACCEPT.to_be_bytes().to_vec();
            v.extend_from_slice(&h.id.to_be_bytes());
            seq = seq.wrapping_add(1);
            verdicts.extend(message(MSG_VERDICT, 0, seq, queue, &[(VERDICT_HDR, v)]));
            let d = now.saturating_duration_since(h.queued);
            stats.packets += 1;
            total += d;
            stats.max = stats.max.max(d);
        }
        if !verdicts.is_empty() && send(fd.as_raw_fd(), &verdicts, MsgFlags::empty()).is_err() {
            stats.errors += 1;
        }
        if stopping {
            break;
        }
        // Wait for a packet until the next one is due (a 1 ms grain: the
        // delays are tens of milliseconds).
        let wait = held
            .peek()
            .map_or(Duration::from_millis(50), |h| {
                h.due.saturating_duration_since(Instant::now())
            })
            .clamp(Duration::from_millis(1), Duration::from_millis(50));
        let _ = setsockopt(
            &fd,
            sockopt::ReceiveTimeout,
            &TimeVal::new(0, wait.as_micros() as i64),
        );
        match recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(n) => {
                let at = Instant::now();
                for (ty, m) in messages(&buf[..n]) {
                    if ty != MSG_PACKET {
                        continue;
                    }
                    if let Some(id) = packet_id(m) {
                        let delay = Duration::from_micros(rand::random_range(lo..=hi));
                        held.push(Held {
                            due: at + delay,
                            queued: at,
                            id,
                        });
                        stats.most_held = stats.most_held.max(held.len());
                    }
                }
            }
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => stats.errors += 1,
        }
    }
    if stats.packets > 0 {
        stats.mean = total / u32::try_from(stats.packets).unwrap_or(u32::MAX);
    }
    stats
}
