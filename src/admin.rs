//! The admin listener: plain HTTP/1.1 on `--admin-listen` for operators and orchestrators.
//!
//! - `GET /metrics`: every metric in the OpenMetrics text format (Prometheus scrapes it);
//! - `GET /livez`: 200 while the daemon can make progress; 503, saying why, when it cannot (every decode
//!   thread stuck past its deadline, or more threads stuck than it replaces: restarting it is the cure);
//! - `GET /readyz`: 200 while the gRPC listeners accept calls, 503 before start-up completes, from the
//!   moment a drain starts (so load balancers and Kubernetes stop sending work first), and while
//!   `/livez` is 503.
//!
//! The port is bounded as the gRPC ones are: idle connections once took every descriptor the daemon
//! had (see [`serve`]).
//!
//! Input: a bound TCP listener, the shared [`AdminState`], a stop future. The listener stops after the gRPC
//! drain so `/readyz` keeps answering 503 while calls finish.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use crate::metrics::Metrics;

/// Says whether the daemon can make progress; Err says why not.
pub type Liveness = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What the admin endpoints report.
pub struct AdminState {
    metrics: Arc<Metrics>,
    ready: AtomicBool,
    /// Consulted by `/livez` (None: alive while serving HTTP).
    liveness: Option<Liveness>,
}

impl AdminState {
    pub fn new(metrics: Arc<Metrics>) -> AdminState {
        AdminState {
            metrics,
            ready: AtomicBool::new(false),
            liveness: None,
        }
    }

    /// `/livez` answers 503 while `check` says Err.
    pub fn with_liveness(mut self, check: Liveness) -> AdminState {
        self.liveness = Some(check);
        self
    }

    /// Ready means serving and not draining.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

/// Connections the admin port holds at once. A new connection beyond it closes the oldest one that
/// has answered no request (an idle or dripping client; logged once a minute), else the oldest: a
/// process holding every place open, reopening any that closes, kept `/livez` from every probe.
pub const ADMIN_CONNECTIONS: usize = 64;
/// How long a request's head may take to arrive.
pub const ADMIN_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long one connection is kept, however busy (a scraper reconnects).
pub const ADMIN_CONNECTION_LIFETIME: std::time::Duration = std::time::Duration::from_secs(120);

/// Serves the admin endpoints on `listener` until `stop` resolves: at most [`ADMIN_CONNECTIONS`] at
/// once, each request head within [`ADMIN_HEADER_TIMEOUT`], each connection for at most
/// [`ADMIN_CONNECTION_LIFETIME`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    stop: impl Future<Output = ()>,
) {
    let mut connections = tokio::task::JoinSet::new();
    // Open connections in accept order: task id, whether it has answered a request, its abort switch.
    let mut open: std::collections::VecDeque<(
        tokio::task::Id,
        Arc<AtomicBool>,
        tokio::task::AbortHandle,
    )> = std::collections::VecDeque::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        if let Some(suppressed) = crate::refusal::RefusalLog::minutely()
                            .note_at("admin listener", "accept", std::time::Instant::now())
                        {
                            tracing::warn!(error = %e, suppressed, "admin listener: accept failed");
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if open.len() >= ADMIN_CONNECTIONS {
                    // Idle connections used to be held without bound, until every descriptor was taken;
                    // then refusing new ones let whoever held the places keep out every probe.
                    let victim = open
                        .iter()
                        .position(|(_, answered, _)| !answered.load(Ordering::Relaxed))
                        .unwrap_or(0);
                    if let Some((_, answered, abort)) = open.remove(victim) {
                        abort.abort();
                        if let Some(suppressed) = crate::refusal::RefusalLog::minutely()
                            .note_at("admin listener", "connections", std::time::Instant::now())
                        {
                            tracing::warn!(
                                suppressed,
                                limit = ADMIN_CONNECTIONS,
                                answered_a_request = answered.load(Ordering::Relaxed),
                                "admin port full: its oldest connection closed for a new one"
                            );
                        }
                    }
                }
                let state = state.clone();
                let answered = Arc::new(AtomicBool::new(false));
                let answering = answered.clone();
                let abort = connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        answering.store(true, Ordering::Relaxed);
                        async move { Ok::<_, Infallible>(respond(&req, &state)) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(ADMIN_HEADER_TIMEOUT)
                        .serve_connection(io, service);
                    match tokio::time::timeout(ADMIN_CONNECTION_LIFETIME, conn).await {
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "admin connection ended with an error")
                        }
                        Ok(Ok(())) => {}
                        Err(_) => tracing::debug!("admin connection closed at the end of its lifetime"),
                    }
                });
                open.push_back((abort.id(), answered, abort));
            }
            // Reap finished connection tasks so the set does not grow.
            Some(done) = connections.join_next_with_id(), if !connections.is_empty() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(e) => e.id(),
                };
                open.retain(|(t, _, _)| *t != id);
            }
        }
    }
    connections.abort_all();
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<String> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn respond(req: &Request<Incoming>, state: &AdminState) -> Response<String> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "only GET and HEAD\n".into(),
        );
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return r;
    }
    match req.uri().path() {
        "/metrics" => match state.metrics.encode() {
            Ok(body) => text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                body,
            ),
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                PLAIN,
                "cannot encode metrics\n".into(),
            ),
        },
        "/livez" => match state.liveness.as_ref().map_or(Ok(()), |check| check()) {
            Ok(()) => text(StatusCode::OK, PLAIN, "ok\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("not live: {why}\n"),
            ),
        },
        // Not live is not ready either: a daemon whose decode threads are all stuck answers every call
        // UNAVAILABLE, and work routed to it by readiness would fail (it said ready: probe C).
        "/readyz" => match state.liveness.as_ref().map_or(Ok(()), |check| check()) {
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("not ready: {why}\n"),
            ),
            Ok(()) if state.is_ready() => text(StatusCode::OK, PLAIN, "ready\n".into()),
            Ok(()) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                "not ready (starting or draining)\n".into(),
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found; try /metrics, /livez or /readyz\n".into(),
        ),
    }
}
