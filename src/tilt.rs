//! Stall protection (Sentinel's TILT): when the daemon's own timer jumps
//! (SIGSTOP, a VM pause, CPU starvation), nothing was observed meanwhile,
//! so it stops acting for a while and does not count the stall as
//! downtime. Shared by every group: a stall of the process is a stall of
//! all of them.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::events::{EventKind, Events};
use crate::metrics as m;

/// The daemon's TILT state.
#[derive(Debug)]
pub struct Tilt {
    until: Mutex<Option<Instant>>,
    entered: Mutex<Option<Instant>>,
    events: Events,
}

impl Tilt {
    /// Not in TILT.
    pub fn new(events: Events) -> Self {
        Tilt {
            until: Mutex::new(None),
            entered: Mutex::new(None),
            events,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stall of `gap` was seen at `now`: stay in TILT for `period`.
    pub fn enter(&self, now: Instant, gap: Duration, period: Duration) {
        let mut g = self.lock();
        let was = g.is_some_and(|u| now < u);
        *g = Some(now + period);
        if !was {
            *self.entered.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
            metrics::counter!(m::TILTS).increment(1);
            metrics::gauge!(m::TILT).set(1.0);
            self.events.emit(
                EventKind::Tilt,
                format!("#tilt mode entered (timer jumped {} ms)", gap.as_millis()),
            );
        }
    }

    /// Whether TILT is active at `now` (leaving it emits `-tilt`).
    pub fn active(&self, now: Instant) -> bool {
        let mut g = self.lock();
        match *g {
            Some(u) if now < u => true,
            Some(_) => {
                *g = None;
                metrics::gauge!(m::TILT).set(0.0);
                self.events.emit(EventKind::TiltExit, "#tilt mode exited");
                false
            }
            None => false,
        }
    }

    /// When TILT ends (or ended).
    pub fn until(&self) -> Option<Instant> {
        *self.lock()
    }

    /// When the latest TILT began (INFO's `sentinel_tilt_since_seconds`).
    pub fn since(&self) -> Option<Instant> {
        *self.entered.lock().unwrap_or_else(|e| e.into_inner())
    }
}
