//! SDOWN: this daemon's own opinion that an instance is down.
//!
//! Pure state machine: fed with the times of valid replies and of definite
//! failures, and asked at a given instant whether the instance is down.
//! Valid PING replies are `PONG`, `-LOADING` and `-MASTERDOWN` (as Redis
//! Sentinel); anything else, or silence, counts as unavailable. An instance
//! is SDOWN for one of three reasons ([`Reason`]):
//!
//! - **silence**: no valid reply for `down_after` (Sentinel's rule: a dead
//!   host, a partition, a stalled server all look like this);
//! - **refused**: its process is gone on a host that answers. The kernel
//!   says so at once (the connection closed by the peer, every reconnect
//!   refused); once connections have been refused for `down_after_refused`
//!   without one being accepted in between, waiting for the rest of
//!   `down_after` tells nothing more. Any accepted connection, valid reply
//!   or failure of another kind (a timeout) ends the refusal;
//! - **reboot**: the group judged it a master that restarted with less
//!   than its replicas hold (`probe::reboot`); only the group clears it.

use std::time::Duration;

use tokio::time::Instant;

/// Why an instance is SDOWN (the `#reason` of `+sdown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No valid reply for `down_after`.
    Silence,
    /// Connections refused for `down_after_refused`.
    Refused,
    /// A master that restarted with less than its replicas.
    Reboot,
}

impl Reason {
    /// The name in events, `/v1/status` and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Silence => "silence",
            Reason::Refused => "refused",
            Reason::Reboot => "reboot",
        }
    }
}

/// A change of the SDOWN state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The instance just became subjectively down (`+sdown`).
    Down,
    /// The instance answers again (`-sdown`).
    Up,
}

/// The detector for one instance.
#[derive(Debug, Clone)]
pub struct Sdown {
    down_after: Duration,
    down_after_refused: Duration,
    last_valid: Instant,
    down_since: Option<Instant>,
    reason: Reason,
    /// Since when every connection was closed by the peer or refused (the
    /// first such signal after the last valid reply or accepted
    /// connection), and when the last refusal was seen.
    gone_since: Option<Instant>,
    last_refused: Option<Instant>,
    /// The group judged it a master restarted with less data.
    rebooted: bool,
}

impl Sdown {
    /// A detector that counts from `now`: an instance that never answers is
    /// down `down_after` after monitoring started. `down_after_refused`
    /// of refused connections is enough (never more than `down_after`).
    pub fn new(down_after: Duration, down_after_refused: Duration, now: Instant) -> Self {
        Sdown {
            down_after,
            down_after_refused: down_after_refused.min(down_after),
            last_valid: now,
            down_since: None,
            reason: Reason::Silence,
            gone_since: None,
            last_refused: None,
            rebooted: false,
        }
    }

    /// A valid reply arrived at `at`.
    pub fn on_valid_reply(&mut self, at: Instant) -> Option<Transition> {
        if at > self.last_valid {
            self.last_valid = at;
        }
        if self.last_refused.is_none_or(|r| r <= at) {
            self.gone_since = None;
            self.last_refused = None;
        }
        if self.rebooted {
            return None;
        }
        if self.down_since.take().is_some() {
            Some(Transition::Up)
        } else {
            None
        }
    }

    /// The server closed the connection at `at` (EOF): the process may be
    /// gone; a refused reconnect will tell.
    pub fn on_closed(&mut self, at: Instant) {
        if at >= self.last_valid {
            self.gone_since.get_or_insert(at);
        }
    }

    /// A connection attempt was refused at `at` (nothing listens on the
    /// port of a host that answers). Returns the transition when this
    /// refusal confirms the process gone.
    pub fn on_refused(&mut self, at: Instant) -> Option<Transition> {
        if at < self.last_valid {
            return None;
        }
        let since = *self.gone_since.get_or_insert(at);
        self.last_refused = Some(at);
        if self.down_since.is_none()
            && at.saturating_duration_since(since) >= self.down_after_refused
        {
            self.down_since = Some(at);
            self.reason = Reason::Refused;
            return Some(Transition::Down);
        }
        None
    }

    /// A connection attempt failed otherwise (a timeout, TLS, AUTH): the
    /// host or the process answers in some way, so silence rules again.
    pub fn on_other_failure(&mut self) {
        self.gone_since = None;
        self.last_refused = None;
    }

    /// The group judged the instance a master restarted with less than its
    /// replicas hold (true), or no longer (false).
    pub fn set_rebooted(&mut self, rebooted: bool, now: Instant) -> Option<Transition> {
        if rebooted == self.rebooted {
            return None;
        }
        self.rebooted = rebooted;
        if rebooted {
            if self.down_since.is_none() {
                self.down_since = Some(now);
                self.reason = Reason::Reboot;
                return Some(Transition::Down);
            }
            self.reason = Reason::Reboot;
            None
        } else if self.down_since.is_some()
            && now.saturating_duration_since(self.last_valid) <= self.down_after
            && self.gone_since.is_none()
        {
            self.down_since = None;
            Some(Transition::Up)
        } else {
            None
        }
    }

    /// Whether it is held down as a master restarted with less data.
    pub fn rebooted(&self) -> bool {
        self.rebooted
    }

    /// Why it is SDOWN (None while it is not).
    pub fn reason(&self) -> Option<Reason> {
        self.down_since.map(|_| self.reason)
    }

    /// Re-evaluate at `now`.
    pub fn check(&mut self, now: Instant) -> Option<Transition> {
        if self.down_since.is_none()
            && now.saturating_duration_since(self.last_valid) > self.down_after
        {
            self.down_since = Some(now);
            self.reason = Reason::Silence;
            return Some(Transition::Down);
        }
        None
    }

    /// Forget the silence so far: the daemon itself was stalled (TILT), so
    /// the time it could not observe must not count as instance downtime.
    pub fn forgive_until(&mut self, now: Instant) {
        if self.down_since.is_none() && self.last_valid < now {
            self.last_valid = now;
        }
    }

    /// Whether the instance is SDOWN.
    pub fn is_down(&self) -> bool {
        self.down_since.is_some()
    }

    /// Since when it is SDOWN.
    pub fn down_since(&self) -> Option<Instant> {
        self.down_since
    }

    /// When the instance turns SDOWN if no valid reply comes first (None
    /// while it is SDOWN).
    pub fn deadline(&self) -> Option<Instant> {
        self.down_since
            .is_none()
            .then(|| self.last_valid + self.down_after + Duration::from_millis(1))
    }

    /// When the last valid reply arrived.
    pub fn last_valid(&self) -> Instant {
        self.last_valid
    }
}

/// Whether a PING reply counts as "the instance is available".
pub fn is_valid_ping_reply(
    reply: &Result<redis_protocol::resp2::types::BytesFrame, crate::resp::RespError>,
) -> bool {
    use crate::resp::{RespError, ServerError};
    use redis_protocol::resp2::types::BytesFrame;
    match reply {
        Ok(BytesFrame::SimpleString(s)) | Ok(BytesFrame::BulkString(s)) => s.starts_with(b"PONG"),
        Err(RespError::Server(ServerError::Loading(_)))
        | Err(RespError::Server(ServerError::MasterDown(_))) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{RespError, ServerError};
    use bytes::Bytes;
    use redis_protocol::resp2::types::BytesFrame;
    use tokio::time::{Duration, advance};

    const D: Duration = Duration::from_millis(1000);

    const R: Duration = Duration::from_millis(100);

    #[tokio::test(start_paused = true)]
    async fn goes_down_after_silence_and_comes_back() {
        let mut s = Sdown::new(D, R, Instant::now());
        advance(Duration::from_millis(999)).await;
        assert_eq!(s.check(Instant::now()), None);
        advance(Duration::from_millis(2)).await;
        assert_eq!(s.check(Instant::now()), Some(Transition::Down));
        assert!(s.is_down());
        // Only one transition is reported.
        assert_eq!(s.check(Instant::now()), None);
        advance(Duration::from_millis(500)).await;
        assert_eq!(s.on_valid_reply(Instant::now()), Some(Transition::Up));
        assert!(!s.is_down());
        assert_eq!(s.on_valid_reply(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn regular_replies_keep_it_up() {
        let mut s = Sdown::new(D, R, Instant::now());
        for _ in 0..20 {
            advance(Duration::from_millis(250)).await;
            s.on_valid_reply(Instant::now());
            assert_eq!(s.check(Instant::now()), None);
        }
        assert!(!s.is_down());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_reply_does_not_move_time_backwards() {
        let t0 = Instant::now();
        let mut s = Sdown::new(D, R, t0);
        advance(Duration::from_millis(800)).await;
        s.on_valid_reply(Instant::now());
        s.on_valid_reply(t0); // an older reply processed late
        assert_eq!(s.last_valid(), Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_is_forgiven() {
        let mut s = Sdown::new(D, R, Instant::now());
        advance(Duration::from_secs(5)).await;
        // The daemon itself was stopped for 5 s: do not call that downtime.
        s.forgive_until(Instant::now());
        assert_eq!(s.check(Instant::now()), None);
        advance(Duration::from_millis(1001)).await;
        assert_eq!(s.check(Instant::now()), Some(Transition::Down));
        // Forgiving does not clear an SDOWN that was observed before.
        s.forgive_until(Instant::now());
        assert!(s.is_down());
    }

    #[tokio::test(start_paused = true)]
    async fn refused_connections_are_down_after_the_short_window() {
        let mut s = Sdown::new(D, R, Instant::now());
        advance(Duration::from_millis(300)).await;
        s.on_valid_reply(Instant::now());
        // The process dies: EOF, then refusals every 20 ms.
        advance(Duration::from_millis(10)).await;
        s.on_closed(Instant::now());
        for _ in 0..4 {
            advance(Duration::from_millis(20)).await;
            assert_eq!(s.on_refused(Instant::now()), None);
        }
        advance(Duration::from_millis(20)).await;
        assert_eq!(s.on_refused(Instant::now()), Some(Transition::Down));
        assert_eq!(s.reason(), Some(Reason::Refused));
        // Once down, further refusals report nothing more.
        advance(Duration::from_millis(20)).await;
        assert_eq!(s.on_refused(Instant::now()), None);
        // Back: a valid reply clears it.
        advance(Duration::from_millis(20)).await;
        assert_eq!(s.on_valid_reply(Instant::now()), Some(Transition::Up));
        assert_eq!(s.reason(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_accepted_connection_or_a_timeout_ends_the_refusal() {
        let mut s = Sdown::new(D, R, Instant::now());
        s.on_closed(Instant::now());
        advance(Duration::from_millis(60)).await;
        assert_eq!(s.on_refused(Instant::now()), None);
        // A timeout (the host stopped answering): silence rules again.
        s.on_other_failure();
        advance(Duration::from_millis(60)).await;
        assert_eq!(s.on_refused(Instant::now()), None);
        advance(Duration::from_millis(60)).await;
        // 120 ms of refusals, but counted from the refusal after the
        // timeout: 60 ms.
        assert_eq!(s.on_refused(Instant::now()), None);
        // An EOF alone (a server closing a connection, maxclients) is no
        // evidence: it only starts the window that refusals confirm.
        let mut e = Sdown::new(D, R, Instant::now());
        e.on_closed(Instant::now());
        advance(Duration::from_millis(500)).await;
        assert_eq!(e.check(Instant::now()), None);
        assert!(!e.is_down());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_refusal_report_does_not_undo_a_newer_reply() {
        let t0 = Instant::now();
        let mut s = Sdown::new(D, R, t0);
        advance(Duration::from_millis(200)).await;
        s.on_valid_reply(Instant::now());
        // Reports of refusals from before that reply count for nothing.
        assert_eq!(s.on_refused(t0), None);
        advance(Duration::from_millis(150)).await;
        assert_eq!(s.on_refused(Instant::now()), None);
        assert!(!s.is_down());
    }

    #[tokio::test(start_paused = true)]
    async fn the_refusal_window_never_exceeds_down_after() {
        let mut s = Sdown::new(Duration::from_millis(50), D, Instant::now());
        s.on_closed(Instant::now());
        advance(Duration::from_millis(50)).await;
        assert_eq!(s.on_refused(Instant::now()), Some(Transition::Down));
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebooted_master_stays_down_until_the_group_clears_it() {
        let mut s = Sdown::new(D, R, Instant::now());
        advance(Duration::from_millis(10)).await;
        assert_eq!(s.set_rebooted(true, Instant::now()), Some(Transition::Down));
        assert_eq!(s.reason(), Some(Reason::Reboot));
        // It answers PING, but it is still the server that lost its data.
        advance(Duration::from_millis(10)).await;
        assert_eq!(s.on_valid_reply(Instant::now()), None);
        assert!(s.is_down());
        assert_eq!(s.set_rebooted(true, Instant::now()), None);
        // No longer the group's master (failed over): cleared.
        assert_eq!(s.set_rebooted(false, Instant::now()), Some(Transition::Up));
        assert!(!s.is_down());
    }

    #[test]
    fn valid_ping_replies() {
        let pong = Ok(BytesFrame::SimpleString(Bytes::from_static(b"PONG")));
        assert!(is_valid_ping_reply(&pong));
        let loading = Err(RespError::Server(ServerError::Loading("LOADING x".into())));
        assert!(is_valid_ping_reply(&loading));
        let md = Err(RespError::Server(ServerError::MasterDown(
            "MASTERDOWN x".into(),
        )));
        assert!(is_valid_ping_reply(&md));
        let busy = Err(RespError::Server(ServerError::Busy("BUSY x".into())));
        assert!(!is_valid_ping_reply(&busy));
        let noauth = Err(RespError::Server(ServerError::NoAuth("NOAUTH x".into())));
        assert!(!is_valid_ping_reply(&noauth));
        let other = Ok(BytesFrame::SimpleString(Bytes::from_static(b"OK")));
        assert!(!is_valid_ping_reply(&other));
        assert!(!is_valid_ping_reply(&Err(RespError::Closed)));
    }
}
