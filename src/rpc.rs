//! The RPC layer: a tower layer around every gRPC service of a listener that counts calls by method and
//! status code, times them, tracks calls in flight, counts reply bytes, and admits streaming calls
//! against `--max-streams`.
//!
//! Input: HTTP/2 requests for any service (vserve, health, reflection). Output: the inner service's
//! response, its body wrapped to observe the end of the call; or, for a call beyond its admission limit
//! ([`crate::admission`]), RESOURCE_EXHAUSTED at once without calling the service, logged through the
//! refusal log's rate limit ([`crate::refusal`]) and always counted in the metrics.
//!
//! Request bodies are bounded while they arrive, in time and in bytes per client and in all
//! ([`bodies`]).
//!
//! A reply's end (its trailers, and with them the call's count, its stream slot and the budget its
//! handler kept) waits until the transport has written the reply's bytes, not only taken them; a reply
//! whose bytes make no progress for `--stream-idle-timeout` is reset ([`crate::budget::sent`]).
//!
//! Invariants: every call is counted exactly once, when its reply ends (code from the trailers, or from the
//! headers of a trailers-only reply) or is dropped unfinished (`CANCELLED`); the method label is one of
//! [`METHODS`] or `other`, so labels stay bounded whatever paths clients send.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;

use crate::admission::{Admission, Class, Permit};
use crate::budget::sent;
use crate::metrics::{MethodCodeLabels, MethodLabel, RpcMetrics, TransportLabel};
use crate::peer::{Link, Peer};

mod bodies;
mod calls;
pub mod codec;
mod timeout;

use timeout::grpc_timeout;

/// What a method's calls are, for the in-flight gauges, admission and byte counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Unary,
    /// A unary call that does work (walks, scans): admitted against `--max-unary`.
    Work,
    /// A reply stream that carries arrays: admitted against `--max-streams`, bytes counted.
    DataStream,
    /// A reply stream of progress lines for long work (CheckDataset decodes a whole dataset on threads
    /// of its own for minutes): admitted against `--max-streams` / `--client-streams` like a data
    /// stream, since it holds the daemon's CPU as long as one; the unary limits are for short calls.
    WorkStream,
    /// Another streaming call (health Watch, reflection): not admitted.
    OtherStream,
}

impl Kind {
    /// Calls that do work (Probe, ListDatasets, Reload, GetClips, StreamBatches, CheckDataset): what the
    /// idle heap trim waits for (`server/trim.rs`); health checks, GetStats and releases do not count.
    pub fn does_work(self) -> bool {
        matches!(self, Kind::Work | Kind::DataStream | Kind::WorkStream)
    }
}

/// The methods the server answers: (path, label, kind).
pub const METHODS: &[(&str, &str, Kind)] = &[
    ("/vserve.v1.VServe/Probe", "Probe", Kind::Work),
    ("/vserve.v1.VServe/GetClips", "GetClips", Kind::DataStream),
    (
        "/vserve.v1.VServe/StreamBatches",
        "StreamBatches",
        Kind::DataStream,
    ),
    ("/vserve.v1.VServe/ListDatasets", "ListDatasets", Kind::Work),
    ("/vserve.v1.VServe/GetStats", "GetStats", Kind::Unary),
    ("/vserve.v1.VServe/Reload", "Reload", Kind::Work),
    ("/vserve.v1.VServe/Quarantine", "Quarantine", Kind::Unary),
    (
        "/vserve.v1.VServe/CheckDataset",
        "CheckDataset",
        Kind::WorkStream,
    ),
    (
        "/vserve.v1.VServe/ReleaseSlots",
        "ReleaseSlots",
        Kind::Unary,
    ),
    ("/grpc.health.v1.Health/Check", "Health.Check", Kind::Unary),
    (
        "/grpc.health.v1.Health/Watch",
        "Health.Watch",
        Kind::OtherStream,
    ),
    (
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "ServerReflectionInfo",
        Kind::OtherStream,
    ),
];

fn classify(path: &str) -> (&'static str, Kind) {
    METHODS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, label, kind)| (*label, *kind))
        .unwrap_or(("other", Kind::Unary))
}

/// The largest request message (tonic refuses larger ones, answered INVALID_ARGUMENT naming the size):
/// far above a real one (a GetClips of 4096 clips with long paths is under 1 MiB); unfinished ones are
/// bounded further by the request bodies' ledger ([`bodies`]).
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// Wraps each service of a listener; clones share the metrics and the stream count.
#[derive(Clone, Debug)]
pub struct RpcLayer {
    metrics: RpcMetrics,
    admission: Admission,
    send_idle: Duration,
}

impl RpcLayer {
    pub fn new(metrics: RpcMetrics, admission: Admission) -> RpcLayer {
        RpcLayer {
            metrics,
            admission,
            send_idle: Duration::ZERO,
        }
    }

    /// Resets a reply whose bytes make no progress for `idle` once its handler is done (never with
    /// zero, the default): `--stream-idle-timeout` ([`sent`]).
    pub fn with_send_idle(mut self, idle: Duration) -> RpcLayer {
        self.send_idle = idle;
        self
    }
}

impl<S> tower::Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> RpcService<S> {
        RpcService {
            inner,
            metrics: self.metrics.clone(),
            admission: self.admission.clone(),
            send_idle: self.send_idle,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RpcService<S> {
    inner: S,
    metrics: RpcMetrics,
    admission: Admission,
    send_idle: Duration,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S> RpcService<S> {
    /// Answers `status` at once without calling the service: logged through the refusal log's rate
    /// limit and always counted in the metrics.
    fn refuse<E: Send + 'static>(
        &self,
        method: &'static str,
        peer: &Peer,
        status: tonic::Status,
    ) -> BoxFuture<http::Response<Body>, E> {
        crate::refusal::RefusalLog::global().log(method, &peer.describe(), status.message());
        self.metrics
            .requests
            .get_or_create(&MethodCodeLabels {
                method,
                code: vserve_client::code_name(status.code()),
            })
            .inc();
        Box::pin(std::future::ready(Ok(status.into_http::<Body>())))
    }
}

impl<S, ReqBody> tower::Service<http::Request<ReqBody>> for RpcService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    ReqBody: HttpBody<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<http::Response<Body>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        let (method, kind) = classify(req.uri().path());
        // A method vserve does not serve: named in the UNIMPLEMENTED answer (tonic's has no message).
        let unknown_path =
            (method == "other").then(|| crate::refusal::quoted(req.uri().path(), 200));
        let peer = Peer::from_extensions(req.extensions());
        req.extensions_mut().insert(peer.clone());
        // Every call counts against the bounds on calls in flight ([`calls`]), whatever its method.
        let ticket = match calls::Ledger::global().enter(&peer) {
            Ok(t) => t,
            Err(why) => return self.refuse(method, &peer, tonic::Status::resource_exhausted(why)),
        };
        let class = match kind {
            Kind::DataStream | Kind::WorkStream => Some(Class::Stream),
            Kind::Work => Some(Class::Unary),
            Kind::Unary | Kind::OtherStream => None,
        };
        // The client's deadline, taken before tonic's own `grpc-timeout` timer starts (that one is made
        // after this call returns), so this one fires first and the call ends DEADLINE_EXCEEDED rather
        // than tonic's CANCELLED "Timeout expired". It covers the wait for the reply's headers, as
        // tonic's does; a reply stream past its deadline is ended by the client resetting it. A
        // malformed one is refused (tonic would serve the call with no deadline at all).
        let deadline = match grpc_timeout(req.headers()) {
            Ok(timeout) => timeout.map(|d| tokio::time::Instant::now() + d),
            Err(bad) => {
                return self.refuse(
                    method,
                    &peer,
                    tonic::Status::invalid_argument(format!(
                        "grpc-timeout {bad:?} is malformed: gRPC writes 1 to 8 digits and a unit (H, M, \
                         S, m, u or n)"
                    )),
                )
            }
        };
        let sent = sent::Sent::on(Link::from_extensions(req.extensions()));
        let permit = match class.map(|class| self.admission.try_admit(class, &peer, Some(&sent))) {
            None => None,
            Some(Ok(p)) => Some(p),
            Some(Err(e)) => return self.refuse(method, &peer, e.into()),
        };
        let call = Call::start(self.metrics.clone(), method, kind, permit, ticket);
        req.extensions_mut().insert(sent.keep());
        let send_idle = self.send_idle;
        let req = req.map(|b| {
            Body::new(bodies::Guarded::new(
                b,
                bodies::Ledger::global(),
                &peer,
                method,
            ))
        });
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut call = call;
            let response = match deadline {
                None => fut.await?,
                Some(at) => match tokio::time::timeout_at(at, fut).await {
                    Ok(response) => response?,
                    Err(_) => {
                        call.code = Some(tonic::Code::DeadlineExceeded);
                        let status = tonic::Status::deadline_exceeded(
                            "the call's deadline passed before its reply began",
                        );
                        return Ok(status.into_http::<Body>());
                    }
                },
            };
            // A trailers-only reply (most refusals) carries its status in the headers.
            if let Some(status) = tonic::Status::from_header_map(response.headers()) {
                // tonic's statuses for a request the client framed wrongly (too large, cut short, no
                // message at all), restated with what they are and logged where the client is known.
                if let Some(status) = codec::restate(&status, MAX_REQUEST_BYTES, method) {
                    call.code = Some(status.code());
                    crate::refusal::RefusalLog::global().log(
                        method,
                        &peer.describe(),
                        status.message(),
                    );
                    return Ok(status.into_http::<Body>());
                }
                if let (tonic::Code::Unimplemented, Some(path)) = (status.code(), &unknown_path) {
                    if status.message().is_empty() {
                        call.code = Some(status.code());
                        return Ok(tonic::Status::unimplemented(format!(
                            "no method {path} (vserve serves vserve.v1.VServe, grpc.health.v1.Health and \
                             server reflection)"
                        ))
                        .into_http::<Body>());
                    }
                }
                call.code = Some(status.code());
                // Requests that never reached a handler: logged here, where the client is known.
                if status.message().starts_with(codec::MALFORMED) {
                    crate::refusal::RefusalLog::global().log(
                        method,
                        &peer.describe(),
                        status.message(),
                    );
                }
            }
            let (parts, body) = response.into_parts();
            let body = Body::new(ObservedBody {
                inner: body,
                call,
                sent,
                ending: None,
                ended: false,
                idle: send_idle,
                timer: None,
                seen: 0,
                peer,
            });
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

/// One call's bookkeeping; recorded once, when the reply's end is read (before the client can see it)
/// or when the call is dropped unfinished.
struct Call {
    metrics: RpcMetrics,
    method: &'static str,
    kind: Kind,
    started: Instant,
    first_data: Option<Instant>,
    code: Option<tonic::Code>,
    finished: bool,
    permit: Option<Permit>,
    /// The call's count in the calls in flight.
    ticket: Option<calls::Ticket>,
}

impl Call {
    fn start(
        metrics: RpcMetrics,
        method: &'static str,
        kind: Kind,
        permit: Option<Permit>,
        ticket: calls::Ticket,
    ) -> Call {
        match kind {
            Kind::Unary | Kind::Work => metrics.in_flight_requests.inc(),
            Kind::DataStream | Kind::WorkStream | Kind::OtherStream => {
                metrics.in_flight_streams.inc()
            }
        };
        if kind.does_work() {
            metrics.calls.started();
        }
        Call {
            metrics,
            method,
            kind,
            started: Instant::now(),
            first_data: None,
            code: None,
            finished: false,
            permit,
            ticket: Some(ticket),
        }
    }

    /// Records the call (once) and frees its stream slot.
    fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        self.permit.take();
        self.ticket.take();
        let m = &self.metrics;
        match self.kind {
            Kind::Unary | Kind::Work => m.in_flight_requests.dec(),
            Kind::DataStream | Kind::WorkStream | Kind::OtherStream => m.in_flight_streams.dec(),
        };
        if self.kind.does_work() {
            m.calls.ended();
        }
        let code = self.code.unwrap_or(tonic::Code::Cancelled);
        m.requests
            .get_or_create(&MethodCodeLabels {
                method: self.method,
                code: vserve_client::code_name(code),
            })
            .inc();
        m.duration
            .get_or_create(&MethodLabel {
                method: self.method,
            })
            .observe(self.started.elapsed().as_secs_f64());
        // A StreamBatches reply lasts an epoch: only GetClips replies time the send stage.
        if self.method == "GetClips" {
            if let Some(first) = self.first_data {
                m.send.observe(first.elapsed().as_secs_f64());
            }
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The reply body, observed: data bytes, and the grpc-status of the trailers. Its data frames are
/// counted until the transport drops them, and its end is held back until it has ([`sent`]).
struct ObservedBody {
    inner: Body,
    call: Call,
    sent: Arc<sent::Sent>,
    /// The inner body's end (trailers, or None for a plain end), held until every piece is written.
    ending: Option<Option<Frame<Bytes>>>,
    /// The end was handed on: nothing follows.
    ended: bool,
    /// `--stream-idle-timeout` for the wait on the last pieces (zero: no limit).
    idle: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The pieces' progress when the timer was last set.
    seen: u64,
    peer: Peer,
}

impl ObservedBody {
    /// Waits for the held end's pieces to be written; resets the reply when they make no progress for
    /// `idle` (see [`sent`]).
    fn poll_end(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        loop {
            if self.sent.poll_sent(cx).is_ready() {
                let end = self.ending.take().flatten();
                match &end {
                    Some(trailers) => {
                        if let Some(status) = trailers
                            .trailers_ref()
                            .and_then(tonic::Status::from_header_map)
                        {
                            self.call.code = Some(status.code());
                        }
                    }
                    // Ended without trailers: a plain end of a successful stream.
                    None => {
                        self.call.code.get_or_insert(tonic::Code::Ok);
                    }
                }
                self.call.finish();
                self.ended = true;
                return Poll::Ready(end.map(Ok));
            }
            if self.idle.is_zero() {
                return Poll::Pending;
            }
            let idle = self.idle;
            if self.timer.is_none() {
                // Progress counts from the end on: what was written before it does not lengthen the wait.
                self.seen = self.sent.progress();
            }
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let progress = self.sent.progress();
            if progress != self.seen {
                self.seen = progress;
                timer.as_mut().reset(tokio::time::Instant::now() + idle);
                continue;
            }
            let unsent = self.sent.unsent();
            tracing::warn!(
                client = %self.peer.describe(),
                method = self.call.method,
                seconds = idle.as_secs_f64(),
                bytes = unsent,
                "reply not read: reset, its bytes and budget released (--stream-idle-timeout)"
            );
            self.ending = None;
            self.ended = true;
            self.call.code = Some(tonic::Code::Cancelled);
            self.call.finish();
            // The reset (RST_STREAM CANCEL, which gRPC clients read as CANCELLED) makes h2 drop the
            // bytes it holds; the error alone would say INTERNAL_ERROR.
            let mut status = tonic::Status::cancelled(format!(
                "the reply was not read for {} s (--stream-idle-timeout)",
                idle.as_secs_f64()
            ));
            status.set_source(Arc::new(h2::Error::from(h2::Reason::CANCEL)));
            return Poll::Ready(Some(Err(status)));
        }
    }
}

impl HttpBody for ObservedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            if this.ending.is_some() {
                return this.poll_end(cx);
            }
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if frame.is_trailers() {
                        this.ending = Some(Some(frame));
                        continue;
                    }
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if this.call.kind == Kind::DataStream {
                        this.call.first_data.get_or_insert_with(Instant::now);
                        this.call
                            .metrics
                            .bytes_sent
                            .get_or_create(&TransportLabel::INLINE)
                            .inc_by(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(this.sent.wrap(data)))));
                }
                Some(Err(status)) => {
                    this.call.code = Some(status.code());
                    this.call.finish();
                    this.ended = true;
                    return Poll::Ready(Some(Err(status)));
                }
                None => {
                    this.ending = Some(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.ending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.ended {
            return SizeHint::with_exact(0);
        }
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::family::Family;

    #[test]
    fn method_labels_are_bounded() {
        assert_eq!(
            classify("/vserve.v1.VServe/GetClips"),
            ("GetClips", Kind::DataStream)
        );
        assert_eq!(classify("/vserve.v1.VServe/Probe").0, "Probe");
        assert_eq!(classify("/vserve.v1.VServe/ReleaseSlots").0, "ReleaseSlots");
        assert_eq!(classify("/some/random/path/x.mp4"), ("other", Kind::Unary));
    }

    /// A call whose handler has not answered by the client's deadline ends DEADLINE_EXCEEDED (in the
    /// reply and in the metrics), not CANCELLED; one that answers in time is untouched.
    #[tokio::test]
    async fn a_call_past_its_deadline_ends_deadline_exceeded() {
        let slow = tower::service_fn(|_req: http::Request<Body>| async {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            Ok::<_, std::convert::Infallible>(tonic::Status::ok("").into_http::<Body>())
        });
        let metrics = RpcMetrics::new(Family::default());
        let layer = RpcLayer::new(metrics.clone(), Admission::streams_only(8));
        let mut svc = tower::Layer::layer(&layer, slow);
        let request = |timeout: &str| {
            http::Request::builder()
                .uri("/vserve.v1.VServe/GetStats")
                .header("grpc-timeout", timeout)
                .body(Body::empty())
                .unwrap()
        };
        let code_of = |r: &http::Response<Body>| {
            tonic::Status::from_header_map(r.headers()).map(|s| s.code())
        };
        let late = tower::Service::call(&mut svc, request("20m"))
            .await
            .unwrap();
        assert_eq!(code_of(&late), Some(tonic::Code::DeadlineExceeded));
        let in_time = tower::Service::call(&mut svc, request("1S")).await.unwrap();
        assert_eq!(code_of(&in_time), Some(tonic::Code::Ok));
        drop(in_time);
        // The longest deadline the header can say (11,000 years) is no overflow.
        let longest = tower::Service::call(&mut svc, request("99999999H"))
            .await
            .unwrap();
        assert_eq!(code_of(&longest), Some(tonic::Code::Ok));
        drop(longest);
        let count = |code| {
            metrics
                .requests
                .get_or_create(&MethodCodeLabels {
                    method: "GetStats",
                    code,
                })
                .get()
        };
        assert_eq!(count("DEADLINE_EXCEEDED"), 1);
        assert_eq!(count("OK"), 2);
        assert_eq!(count("CANCELLED"), 0);
    }

    #[test]
    fn every_rpc_of_the_proto_has_its_own_label() {
        let proto = include_str!("../proto/vserve/v1/vserve.proto");
        let mut seen = 0;
        for line in proto.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("rpc ") else {
                continue;
            };
            let name = rest.split('(').next().unwrap_or_default().trim();
            let (label, kind) = classify(&format!("/vserve.v1.VServe/{name}"));
            assert_eq!(label, name, "add {name} to METHODS");
            let streams_reply = line.contains("returns (stream");
            // Reply streams carry arrays, but CheckDataset's, which carries a line per video checked.
            let carries_arrays = streams_reply && name != "CheckDataset";
            assert_eq!(kind == Kind::DataStream, carries_arrays, "{name}");
            assert_eq!(
                matches!(kind, Kind::Unary | Kind::Work),
                !streams_reply,
                "{name}"
            );
            seen += 1;
        }
        assert!(seen >= 5, "no rpc lines found");
    }
}
