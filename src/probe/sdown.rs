//! SDOWN: this daemon's own opinion that an instance is down.
//!
//! Pure state machine: fed with the times of valid replies and asked at a
//! given instant whether the instance is down. Valid PING replies are
//! `PONG`, `-LOADING` and `-MASTERDOWN` (as Redis Sentinel); anything else,
//! or silence, counts as unavailable. An instance is SDOWN when no valid
//! reply arrived for `down_after`.

use std::time::Duration;

use tokio::time::Instant;

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
    last_valid: Instant,
    down_since: Option<Instant>,
}

impl Sdown {
    /// A detector that counts from `now`: an instance that never answers is
    /// down `down_after` after monitoring started.
    pub fn new(down_after: Duration, now: Instant) -> Self {
        Sdown {
            down_after,
            last_valid: now,
            down_since: None,
        }
    }

    /// A valid reply arrived at `at`.
    pub fn on_valid_reply(&mut self, at: Instant) -> Option<Transition> {
        if at > self.last_valid {
            self.last_valid = at;
        }
        if self.down_since.take().is_some() {
            Some(Transition::Up)
        } else {
            None
        }
    }

    /// Re-evaluate at `now`.
    pub fn check(&mut self, now: Instant) -> Option<Transition> {
        if self.down_since.is_none()
            && now.saturating_duration_since(self.last_valid) > self.down_after
        {
            self.down_since = Some(now);
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

    #[tokio::test(start_paused = true)]
    async fn goes_down_after_silence_and_comes_back() {
        let mut s = Sdown::new(D, Instant::now());
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
        let mut s = Sdown::new(D, Instant::now());
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
        let mut s = Sdown::new(D, t0);
        advance(Duration::from_millis(800)).await;
        s.on_valid_reply(Instant::now());
        s.on_valid_reply(t0); // an older reply processed late
        assert_eq!(s.last_valid(), Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_is_forgiven() {
        let mut s = Sdown::new(D, Instant::now());
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
