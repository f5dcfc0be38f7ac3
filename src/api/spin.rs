//! The listener's thread polls its sockets instead of sleeping while
//! requests come in fast.
//!
//! Why: a server that finishes a batch before the client sends the next
//! goes to sleep in `epoll_wait`, and every request then costs a wake-up on
//! both sides (the client's `send` wakes the server's thread, the reply
//! wakes the client). Sentinel, slower, is still busy when the next request
//! comes and is seldom woken: at 50 clients pipelining 16 deep, its thread
//! switched out 353 times over 3,000,000 requests, picket's 34,648, and the
//! client, at a full core, spent 10 % more of it in the kernel against
//! picket, whose own thread had a quarter of its core to spare. So after
//! every batch, when batches have come faster than [`BUSY_BATCHES`] in
//! [`BUSY_WITHIN`], the thread yields to its runtime instead of parking:
//! each turn polls the sockets without blocking (an `epoll_wait` with no
//! timeout), until no batch has come for [`SPIN_FOR`]. An idle daemon, or
//! one answering its peers and a few clients, never spins.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long the thread keeps polling after the last batch: longer than
/// the gap between two requests of one client that sends the next as soon
/// as it has read the reply, over loopback (about 40 µs on the 2-core
/// test machine), short enough that a burst's end costs little.
pub const SPIN_FOR: Duration = Duration::from_micros(100);
/// Batches that make the listener busy when they come within
/// [`BUSY_WITHIN`] (8,000 batches a second): a daemon's peers and a few
/// clients stay below.
pub const BUSY_BATCHES: u64 = 16;
/// See [`BUSY_BATCHES`].
pub const BUSY_WITHIN: Duration = Duration::from_millis(2);

/// One listener thread's activity.
struct Activity {
    /// Batches of requests answered on this thread.
    batches: Cell<u64>,
    /// When the last [`BUSY_BATCHES`] began.
    window_start: Cell<Option<Instant>>,
    /// The spinner is polling now.
    spinning: Cell<bool>,
    /// Wakes the spinner when the batches come fast.
    busy: Notify,
}

thread_local! {
    static ACTIVITY: Rc<Activity> = Rc::new(Activity {
        batches: Cell::new(0),
        window_start: Cell::new(None),
        spinning: Cell::new(false),
        busy: Notify::new(),
    });
}

/// A batch of requests was answered on this thread.
pub fn batch_answered() {
    ACTIVITY.with(|a| {
        let n = a.batches.get() + 1;
        a.batches.set(n);
        if a.spinning.get() || !n.is_multiple_of(BUSY_BATCHES) {
            return;
        }
        let now = Instant::now();
        let fast = a
            .window_start
            .replace(Some(now))
            .is_some_and(|t| now.duration_since(t) <= BUSY_WITHIN);
        if fast {
            a.busy.notify_one();
        }
    });
}

/// Run beside the listener on its own thread (in the current-thread
/// runtime's `block_on`: the future is not `Send`), for as long as it
/// serves: polls while busy (see the module's comment).
pub async fn run() {
    let a = ACTIVITY.with(Rc::clone);
    loop {
        a.busy.notified().await;
        a.spinning.set(true);
        let mut last = a.batches.get();
        let mut quiet_since = Instant::now();
        loop {
            tokio::task::yield_now().await;
            let n = a.batches.get();
            let now = Instant::now();
            if n != last {
                last = n;
                quiet_since = now;
            } else if now.duration_since(quiet_since) >= SPIN_FOR {
                break;
            }
        }
        a.spinning.set(false);
        a.window_start.set(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spinning() -> bool {
        ACTIVITY.with(|a| a.spinning.get())
    }

    /// Yield to the runtime up to `turns` times until `want` is the state
    /// of the polling; whether it was reached.
    async fn until_spinning(want: bool, turns: usize) -> bool {
        for _ in 0..turns {
            if spinning() == want {
                return true;
            }
            tokio::task::yield_now().await;
        }
        spinning() == want
    }

    #[test]
    fn the_thread_polls_only_while_batches_come_fast() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            let spinner = tokio::task::spawn_local(run());
            // Batches 250 µs apart (16 in 4 ms): a peer's messages, a few
            // clients. No polling.
            for _ in 0..3 * BUSY_BATCHES {
                std::thread::sleep(Duration::from_micros(250));
                batch_answered();
                assert!(until_spinning(false, 5).await);
            }
            assert!(!until_spinning(true, 20).await, "polls for a slow client");
            // Then 16 at once: it polls, and stops SPIN_FOR after the last.
            for _ in 0..BUSY_BATCHES {
                batch_answered();
            }
            let last = Instant::now();
            assert!(until_spinning(true, 20).await, "does not poll under load");
            assert!(until_spinning(false, 1_000_000).await, "never stops");
            assert!(last.elapsed() >= SPIN_FOR);
            spinner.abort();
        });
    }
}
