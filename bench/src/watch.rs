//! Observers of the managers during a run: a poller per manager that asks
//! `SENTINEL get-master-addr-by-name` every few milliseconds and keeps every
//! change, and a `+switch-master` subscriber per manager.

use std::time::Duration;

use picket::resp::{Connection, frame_text};
use redis_protocol::resp2::types::BytesFrame;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::GROUP;
use crate::procs::{Access, master_of};

/// What one manager answered over time: `(when, master)` at start and at
/// every change.
pub type Changes = Vec<(Instant, String)>;

/// Pollers and subscribers of one run.
pub struct Watch {
    cancel: CancellationToken,
    pollers: Vec<JoinHandle<Changes>>,
    subscribers: Vec<JoinHandle<Vec<(Instant, String)>>>,
    /// Whether every manager accepted `SUBSCRIBE +switch-master`.
    pub subscribe_supported: bool,
}

/// What the watchers saw.
pub struct Seen {
    /// Per manager: master changes (first entry: the initial answer).
    pub changes: Vec<Changes>,
    /// Per manager: `+switch-master` messages (empty when unsupported).
    pub switch_events: Vec<Vec<(Instant, String)>>,
    /// Whether every manager accepted `SUBSCRIBE +switch-master`.
    pub subscribe_supported: bool,
}

impl Watch {
    /// Start watching the managers at `api`, reached as `access` says.
    pub async fn start(api: &[String], access: &Access, poll_every: Duration) -> Watch {
        let cancel = CancellationToken::new();
        let mut pollers = Vec::new();
        let mut subscribers = Vec::new();
        let mut supported = true;
        for a in api {
            pollers.push(tokio::spawn(poll(
                a.clone(),
                access.clone(),
                poll_every,
                cancel.clone(),
            )));
            let (tx, rx) = tokio::sync::oneshot::channel();
            subscribers.push(tokio::spawn(subscribe(
                a.clone(),
                access.clone(),
                tx,
                cancel.clone(),
            )));
            supported &= rx.await.unwrap_or(false);
        }
        Watch {
            cancel,
            pollers,
            subscribers,
            subscribe_supported: supported,
        }
    }

    /// Stop the watchers and collect what they saw.
    pub async fn stop(self) -> Seen {
        self.cancel.cancel();
        let mut changes = Vec::new();
        for p in self.pollers {
            changes.push(p.await.unwrap_or_default());
        }
        let mut switch_events = Vec::new();
        for s in self.subscribers {
            switch_events.push(s.await.unwrap_or_default());
        }
        Seen {
            changes,
            switch_events,
            subscribe_supported: self.subscribe_supported,
        }
    }
}

async fn poll(addr: String, access: Access, every: Duration, cancel: CancellationToken) -> Changes {
    let mut out: Changes = Vec::new();
    let mut conn: Option<Connection> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return out,
            _ = tick.tick() => {}
        }
        if conn.is_none() {
            conn = Connection::connect(&addr, &access.opts(Duration::from_millis(500)))
                .await
                .ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        match master_of(c, GROUP).await {
            Some(m) => {
                if out.last().map(|(_, l)| l) != Some(&m) {
                    out.push((Instant::now(), m));
                }
            }
            None => conn = None,
        }
    }
}

async fn subscribe(
    addr: String,
    access: Access,
    ready: tokio::sync::oneshot::Sender<bool>,
    cancel: CancellationToken,
) -> Vec<(Instant, String)> {
    let mut out = Vec::new();
    let Ok(mut conn) = Connection::connect(&addr, &access.opts(Duration::from_secs(1))).await
    else {
        let _ = ready.send(false);
        return out;
    };
    let confirmed = matches!(
        conn.call(["SUBSCRIBE", "+switch-master"]).await,
        Ok(BytesFrame::Array(v)) if v.first().and_then(frame_text).as_deref() == Some("subscribe")
    );
    let _ = ready.send(confirmed);
    if !confirmed {
        return out;
    }
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return out,
            f = conn.next_frame() => match f {
                Ok(BytesFrame::Array(v)) if v.first().and_then(frame_text).as_deref() == Some("message") => {
                    out.push((Instant::now(), v.get(2).and_then(frame_text).unwrap_or_default()));
                }
                Ok(_) => {}
                Err(_) => return out,
            }
        }
    }
}

/// Poll every manager until one answers a master other than `from`;
/// returns when and what, or None at `timeout`.
pub async fn first_change(
    api: &[String],
    access: &Access,
    from: &str,
    timeout: Duration,
) -> Option<(Instant, String)> {
    let deadline = Instant::now() + timeout;
    let mut conns: Vec<Option<Connection>> = api.iter().map(|_| None).collect();
    while Instant::now() < deadline {
        for (a, slot) in api.iter().zip(conns.iter_mut()) {
            if slot.is_none() {
                *slot = Connection::connect(a, &access.opts(Duration::from_millis(500)))
                    .await
                    .ok();
            }
            let Some(c) = slot.as_mut() else { continue };
            match master_of(c, GROUP).await {
                Some(m) if m != from => return Some((Instant::now(), m)),
                Some(_) => {}
                None => *slot = None,
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
