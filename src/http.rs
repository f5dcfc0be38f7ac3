//! HTTP on `http_listen`: `/metrics` (Prometheus), `/healthz`, `/readyz`,
//! `/v1/status` (JSON: groups, instances, peers, epochs) and the load
//! balancers' check `/v1/lb/{group}/{server}`, over TLS when
//! `[daemon.tls] http = true`, with an optional plaintext listener for
//! the probes, the check and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::daemon::Daemon;
use crate::group::view::GroupView;
use crate::metrics as m;
use crate::tls::Shared;

/// The body of `/v1/status`.
#[derive(Debug, Serialize)]
pub struct Status {
    /// This daemon's id.
    pub id: String,
    /// Its announced RESP address.
    pub announce: String,
    /// Its current epoch.
    pub current_epoch: u64,
    /// Stall protection active.
    pub tilt: bool,
    /// Why the state file cannot be written (absent while it can); the
    /// daemon neither votes nor starts elections meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_error: Option<String>,
    /// Seconds since start.
    pub uptime_secs: u64,
    /// Every group.
    pub groups: Vec<GroupView>,
}

/// Build the status document.
pub fn status(d: &Daemon) -> Status {
    let now = tokio::time::Instant::now();
    Status {
        id: d.ctx.id.clone(),
        announce: d.ctx.announce.clone(),
        current_epoch: d.ctx.state.current_epoch(),
        tilt: d.ctx.tilt.until().is_some_and(|u| now < u),
        state_error: d.ctx.state.write_error(),
        uptime_secs: now.saturating_duration_since(d.started).as_secs(),
        groups: d.views().iter().map(|v| (**v).clone()).collect(),
    }
}

async fn metrics_handler(State(d): State<Arc<Daemon>>) -> Response {
    match &d.metrics {
        Some(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            crate::metrics::render(h),
        )
            .into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder not installed\n",
        )
            .into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(d): State<Arc<Daemon>>) -> Response {
    if !d.ready.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    } else if let Some(e) = d.ctx.state.write_error() {
        // Alive, and still serving the current master, but not a full
        // member of the quorum: it cannot vote.
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("state not writable: {e}\n"),
        )
            .into_response()
    } else {
        (StatusCode::OK, "ready\n").into_response()
    }
}

/// The answer of `/v1/lb/{group}/{server}`: whether a load balancer may
/// send writes to `server` now, as this daemon knows the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbVerdict {
    /// 200: route to it; 404: no such group; 503: do not.
    pub code: u16,
    /// One line: a keyword (`master`, `replica`, `failover`, `down`,
    /// `no-quorum`, `stale`, `starting`, `tilt`, `unknown-group`), then
    /// the details.
    pub body: String,
}

/// What [`lb_verdict`] decides from, taken out of a group's view so that
/// the rule is a pure function of it.
#[derive(Debug, Clone, PartialEq)]
pub struct LbFacts {
    /// The asked-for server is this daemon's master for the group.
    pub is_master: bool,
    /// The master as this daemon holds it, as written in the config.
    pub master: String,
    /// Its config epoch.
    pub config_epoch: u64,
    /// What the group is doing.
    pub status: crate::group::view::GroupStatus,
    /// The failover under way (if any) has published its candidate as
    /// the master already and is only re-pointing the replicas.
    pub failover_published: bool,
    /// Daemons heard from recently, this one included.
    pub heard: usize,
    /// All daemons.
    pub daemons: usize,
    /// A reachable peer that holds a higher config epoch (its id or
    /// address, and that epoch).
    pub newer_peer: Option<(String, u64)>,
    /// This daemon voted, less than `failover_timeout` ago, in an epoch
    /// above the group's config epoch: a failover is being decided
    /// elsewhere (its leader asked for the vote), even if this daemon
    /// still sees the master up.
    pub pending_vote: Option<u64>,
    /// Milliseconds since this daemon's last valid reply from the master,
    /// as of the view.
    pub master_silent_ms: u64,
    /// The group's `down_after`, in milliseconds.
    pub down_after_ms: u64,
}

impl LbFacts {
    /// The facts about `server` in `v`. `server` is matched against the
    /// master as configured (host name or IP) and as announced to clients
    /// (the IP it resolved to).
    pub fn of(v: &GroupView, server: &str) -> LbFacts {
        let announced = v.announced(&v.master).to_string();
        let is_master = server == v.master.to_string() || server == announced;
        let newer_peer = v
            .peers
            .iter()
            .filter(|p| p.reachable)
            .filter_map(|p| {
                let e = p.config_epoch?;
                (e > v.config_epoch).then(|| (p.id.clone().unwrap_or_else(|| p.addr.clone()), e))
            })
            .max_by_key(|(_, e)| *e);
        LbFacts {
            is_master,
            master: announced,
            config_epoch: v.config_epoch,
            status: v.status,
            failover_published: v
                .failover
                .as_ref()
                .is_some_and(|f| f.candidate.as_ref() == Some(&v.master)),
            heard: v.reachable_daemons(),
            daemons: v.daemons,
            newer_peer,
            pending_vote: None,
            // As of the view: a silent master's failed PINGs rebuild it;
            // a healthy one's replies do not (it is rebuilt once a second
            // for its ages), which can only make this smaller than the
            // truth: noticed later, never wrongly.
            master_silent_ms: v.master_view().map_or(0, |i| i.last_ok_ping_ms),
            down_after_ms: v.down_after_ms,
        }
    }
}

/// When the check first saw each daemon's vote for an epoch above its
/// group's config epoch, by (daemon id, group): such a vote holds the
/// master back for at most `failover_timeout`, so that an election that
/// never completes does not take the master out of the load balancers for
/// good. Kept here, not in the group's state: only the check needs it, and
/// a restarted daemon simply starts afresh.
type VotesSeen = std::collections::HashMap<(String, String), (u64, std::time::Instant)>;
static VOTES_SEEN: std::sync::LazyLock<std::sync::Mutex<VotesSeen>> =
    std::sync::LazyLock::new(Default::default);

/// The epoch of a recent vote of this daemon for a newer config of `v`.
fn pending_vote(daemon: &str, v: &GroupView, now: std::time::Instant) -> Option<u64> {
    let mut seen = VOTES_SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let key = (daemon.to_string(), v.name.clone());
    if v.voted_epoch <= v.config_epoch {
        seen.remove(&key);
        return None;
    }
    let first = seen.entry(key).or_insert((v.voted_epoch, now));
    if first.0 != v.voted_epoch {
        *first = (v.voted_epoch, now);
    }
    let window = std::time::Duration::from_millis(v.failover_timeout_ms);
    (now.saturating_duration_since(first.1) < window).then_some(v.voted_epoch)
}

/// The load-balancer rule: 200 only for the master this daemon holds at
/// its config epoch while nothing suggests that it is being replaced;
/// 503 as soon as anything does (this daemon sees it down or has not
/// heard it for half of `down_after`, a failover runs or it voted for one,
/// this daemon hears no majority of the daemons and may be behind, a peer
/// holds a newer epoch). Each daemon answers for itself: the load balancer
/// asks several. The role the server reports is not asked for:
/// the INFO that shows a promoted replica as a master comes up to a
/// second after its publication, and a server that reports `role:slave`
/// refuses writes itself (nothing is lost by routing to it).
pub fn lb_verdict(f: &LbFacts) -> LbVerdict {
    use crate::group::view::GroupStatus as S;
    let no = |why: String| LbVerdict {
        code: 503,
        body: format!("{why}\n"),
    };
    if !f.is_master {
        return no(format!(
            "replica: the master is {} (config epoch {})",
            f.master, f.config_epoch
        ));
    }
    match f.status {
        S::Starting => return no("starting: no view of the group yet".into()),
        S::Tilt => return no("tilt: this daemon's timer jumped; it acts on nothing".into()),
        S::Sdown | S::Odown => {
            return no(format!("down: {} is down for this daemon", f.master));
        }
        S::Failover if !f.failover_published => {
            return no(format!("failover: {} is being replaced", f.master));
        }
        S::Failover | S::Ok => {}
    }
    // Half of down_after without a reply (the probes ask every quarter):
    // the master may be cut off, and the daemons may be about to replace
    // it; the balancer must have stopped sending it writes by then.
    if f.master_silent_ms > f.down_after_ms / 2 {
        return no(format!(
            "down: no reply from {} for {} ms (down_after {} ms)",
            f.master, f.master_silent_ms, f.down_after_ms
        ));
    }
    if let Some(epoch) = f.pending_vote {
        return no(format!(
            "failover: this daemon voted in epoch {epoch} to replace {}",
            f.master
        ));
    }
    let majority = f.daemons / 2 + 1;
    if f.heard < majority {
        return no(format!(
            "no-quorum: this daemon hears {} of {} daemons and may not know the latest master",
            f.heard, f.daemons
        ));
    }
    if let Some((peer, epoch)) = &f.newer_peer {
        return no(format!(
            "stale: daemon {peer} holds config epoch {epoch}, this one {}",
            f.config_epoch
        ));
    }
    LbVerdict {
        code: 200,
        body: format!("master {} config epoch {}\n", f.master, f.config_epoch),
    }
}

async fn lb_handler(
    State(d): State<Arc<Daemon>>,
    Path((group, server)): Path<(String, String)>,
) -> Response {
    // One group's view, shared (an Arc): cheap enough to be asked every
    // 100 ms by several load balancers.
    let view = d
        .groups
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&group)
        .map(|h| h.view.borrow().clone());
    let verdict = match view {
        Some(v) => lb_verdict(&LbFacts {
            pending_vote: pending_vote(&d.ctx.id, &v, std::time::Instant::now()),
            ..LbFacts::of(&v, &server)
        }),
        None => LbVerdict {
            code: 404,
            body: format!("unknown-group: no group {group:?}\n"),
        },
    };
    let code = StatusCode::from_u16(verdict.code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    (code, [(header::CACHE_CONTROL, "no-store")], verdict.body).into_response()
}

async fn status_handler(State(d): State<Arc<Daemon>>) -> Response {
    axum::Json(status(&d)).into_response()
}

/// Serve HTTP until `cancel`: every endpoint, over TLS when `tls` is set
/// (`[daemon.tls] http = true`; the configuration in force at each
/// handshake).
pub async fn serve(
    listener: TcpListener,
    daemon: Arc<Daemon>,
    tls: Option<Shared<rustls::ServerConfig>>,
    cancel: CancellationToken,
) {
    if let Some(h) = &daemon.metrics {
        // The recorder needs periodic upkeep when it is not run by its own
        // HTTP listener.
        let h = h.clone();
        let c = cancel.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = c.cancelled() => return,
                    _ = t.tick() => h.run_upkeep(),
                }
            }
        });
    }
    let app = probes().route("/v1/status", get(status_handler));
    match tls {
        None => run(listener, app.with_state(daemon), cancel).await,
        Some(tls) => {
            let listener = TlsListener::spawn(listener, tls, cancel.clone());
            run(listener, app.with_state(daemon), cancel).await;
        }
    }
}

/// Serve `/metrics`, `/healthz`, `/readyz` and `/v1/lb/...` in plaintext
/// until `cancel` (`plaintext_http_listen`, for scrapers, probes and load
/// balancers without TLS while `http_listen` has it); `/v1/status` stays
/// on the TLS listener.
pub async fn serve_plaintext_probes(
    listener: TcpListener,
    daemon: Arc<Daemon>,
    cancel: CancellationToken,
) {
    run(listener, probes().with_state(daemon), cancel).await;
}

fn probes() -> Router<Arc<Daemon>> {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/lb/{group}/{server}", get(lb_handler))
}

async fn run<L>(listener: L, app: Router, cancel: CancellationToken)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "HTTP server failed");
    }
}

/// How many TLS handshakes of the HTTP listener may be under way at once;
/// more connections are closed (a client that never finishes its handshake
/// must not hold the others back).
const MAX_HANDSHAKES: usize = 64;
/// How long an HTTP client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The HTTP listener with TLS: a task accepts connections and runs their
/// handshakes concurrently; axum gets the finished ones.
struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
}

impl TlsListener {
    fn spawn(
        listener: TcpListener,
        tls: Shared<rustls::ServerConfig>,
        cancel: CancellationToken,
    ) -> TlsListener {
        let local = listener.local_addr();
        let (tx, rx) = tokio::sync::mpsc::channel(MAX_HANDSHAKES);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let (sock, peer) = tokio::select! {
                    _ = cancel.cancelled() => return,
                    a = listener.accept() => match a {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::warn!(error = %e, "HTTP accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    metrics::counter!(m::API_REJECTED, "reason" => "http_handshakes").increment(1);
                    continue;
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(crate::tls::current(&tls));
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
                        Ok(Ok(stream)) => {
                            drop(permit);
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(client = %peer, "HTTPS handshake refused: {e}")
                        }
                        Err(_) => tracing::debug!(client = %peer, "HTTPS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { rx, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept task ended (shutdown): graceful shutdown ends the
            // server meanwhile.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match &self.local {
            Ok(a) => Ok(*a),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::view::GroupStatus;

    fn healthy() -> LbFacts {
        LbFacts {
            is_master: true,
            master: "10.0.0.5:6379".into(),
            config_epoch: 7,
            status: GroupStatus::Ok,
            failover_published: false,
            heard: 3,
            daemons: 3,
            newer_peer: None,
            pending_vote: None,
            master_silent_ms: 200,
            down_after_ms: 1000,
        }
    }

    fn keyword(f: &LbFacts) -> (u16, String) {
        let v = lb_verdict(f);
        let word = v.body.split([':', ' ']).next().unwrap_or("").to_string();
        (v.code, word)
    }

    #[test]
    fn only_the_held_master_of_a_quiet_group_gets_200() {
        assert_eq!(keyword(&healthy()), (200, "master".into()));
        assert_eq!(
            lb_verdict(&healthy()).body,
            "master 10.0.0.5:6379 config epoch 7\n"
        );
        // Two of three heard is a majority.
        assert_eq!(
            keyword(&LbFacts {
                heard: 2,
                ..healthy()
            })
            .0,
            200
        );
        // Published, the replicas being re-pointed: the new master is it.
        assert_eq!(
            keyword(&LbFacts {
                status: GroupStatus::Failover,
                failover_published: true,
                ..healthy()
            })
            .0,
            200
        );
        // A single daemon hears itself.
        assert_eq!(
            keyword(&LbFacts {
                heard: 1,
                daemons: 1,
                ..healthy()
            })
            .0,
            200
        );
    }

    #[test]
    fn every_doubt_answers_503_with_its_reason() {
        let cases = [
            (
                LbFacts {
                    is_master: false,
                    ..healthy()
                },
                "replica",
            ),
            (
                LbFacts {
                    status: GroupStatus::Starting,
                    ..healthy()
                },
                "starting",
            ),
            (
                LbFacts {
                    status: GroupStatus::Tilt,
                    ..healthy()
                },
                "tilt",
            ),
            (
                LbFacts {
                    status: GroupStatus::Sdown,
                    ..healthy()
                },
                "down",
            ),
            (
                LbFacts {
                    status: GroupStatus::Odown,
                    ..healthy()
                },
                "down",
            ),
            (
                LbFacts {
                    status: GroupStatus::Failover,
                    ..healthy()
                },
                "failover",
            ),
            (
                LbFacts {
                    heard: 1,
                    ..healthy()
                },
                "no-quorum",
            ),
            (
                LbFacts {
                    pending_vote: Some(8),
                    ..healthy()
                },
                "failover",
            ),
            (
                LbFacts {
                    master_silent_ms: 501,
                    ..healthy()
                },
                "down",
            ),
            (
                LbFacts {
                    newer_peer: Some(("picket-b".into(), 8)),
                    ..healthy()
                },
                "stale",
            ),
        ];
        for (facts, want) in cases {
            assert_eq!(keyword(&facts), (503, want.to_string()), "{facts:?}");
        }
        // The replica answer names the master the balancer should use.
        let body = lb_verdict(&LbFacts {
            is_master: false,
            ..healthy()
        })
        .body;
        assert!(
            body.contains("10.0.0.5:6379") && body.contains("epoch 7"),
            "{body}"
        );
    }
}
