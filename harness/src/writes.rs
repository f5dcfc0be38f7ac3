//! A client writing through picket, for tests that count lost writes:
//! it resolves the master with `SENTINEL get-master-addr-by-name` from one
//! daemon, writes `k<i> = i` with increasing `i`, and re-resolves on any
//! error.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{CMD_TIMEOUT, Reply, RespConn, redis_cmd};

/// A client writing through picket: resolves the master from daemon 0 and
/// records every acknowledged write and the longest gap between two.
pub struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(u64, Instant)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    /// Start writing to the master of `group` as daemon `sentinel` names it.
    pub fn start(sentinel: SocketAddr, group: &'static str) -> Writer {
        Writer::start_resolving(move || {
            match redis_cmd(sentinel, &["SENTINEL", "get-master-addr-by-name", group]) {
                Ok(Reply::Array(v)) if v.len() == 2 => format!(
                    "{}:{}",
                    v[0].as_str().unwrap_or(""),
                    v[1].as_str().unwrap_or("")
                )
                .parse::<SocketAddr>()
                .ok(),
                _ => None,
            }
        })
    }

    /// Start writing to whatever `resolve` names (a Service's ready
    /// endpoint, as kube-proxy would pick it), asking again after any
    /// error; a connection is kept while it works, as a client's
    /// connection through a Service outlives a change of its endpoints.
    pub fn start_resolving(resolve: impl Fn() -> Option<SocketAddr> + Send + 'static) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
        let (s, a) = (stop.clone(), acked.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut conn: Option<RespConn> = None;
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                if conn.is_none() {
                    conn = resolve()
                        .and_then(|m| RespConn::connect(m, Duration::from_millis(500)).ok());
                    if conn.is_none() {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                }
                let key = format!("k{i}");
                let val = i.to_string();
                let ok = conn
                    .as_mut()
                    .map(|c| c.cmd(&["SET", &key, &val]))
                    .is_some_and(|r| r.is_ok_and(|r| r.is_ok()));
                if ok {
                    a.lock().unwrap().push((i, Instant::now()));
                    i += 1;
                } else {
                    conn = None;
                }
            }
        });
        Writer {
            stop,
            acked,
            thread: Some(thread),
        }
    }

    /// How many writes were acknowledged so far.
    pub fn count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Stop writing; the acknowledged writes with the time of each.
    pub fn finish(mut self) -> Vec<(u64, Instant)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        std::mem::take(&mut *self.acked.lock().unwrap())
    }
}

/// The acknowledged writes `master` does not hold.
pub fn lost_writes(master: SocketAddr, acked: &[(u64, Instant)]) -> Vec<u64> {
    let mut conn = RespConn::connect(master, CMD_TIMEOUT).unwrap();
    acked
        .iter()
        .filter(|(i, _)| {
            conn.cmd(&["GET", &format!("k{i}")])
                .ok()
                .and_then(|r| r.as_str().map(str::to_string))
                != Some(i.to_string())
        })
        .map(|(i, _)| *i)
        .collect()
}

/// The longest time between two acknowledged writes.
pub fn longest_gap(acked: &[(u64, Instant)]) -> Duration {
    acked
        .windows(2)
        .map(|w| w[1].1.duration_since(w[0].1))
        .max()
        .unwrap_or_default()
}
