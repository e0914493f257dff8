//! Metrics: one Prometheus registry per process, created at server start-up and passed down; each component
//! owns its handles and registers them under its stage prefix.
//!
//! Inputs: observations from the engine ([`EngineMetrics`]), from the RPC layer ([`RpcMetrics`], see
//! [`crate::rpc`]), and, at scrape time, values a component reads from its own counters ([`Scraped`], registered with
//! [`Metrics::register_scrape`]; the engine registers its cache, fleet and stream counters). Output: the
//! OpenMetrics text served on the admin listener's `/metrics` ([`Metrics::encode`]).
//!
//! Invariants: every name is `vserve_<stage>_<what>_<unit>` (counters gain `_total` when encoded); labels
//! take a bounded set of values (method names, status code names, stage, backend, transport), never a path,
//! a dataset or a request id.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Latency buckets from 50 µs to about 100 s.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(50e-6, 2.5, 17))
}

/// Stage timings and decode outcomes the engine observes as it works.
#[derive(Clone, Debug)]
pub struct EngineMetrics {
    /// Time a GOP run waited in the decode queue before a decode thread took it.
    pub queue_wait: Histogram,
    /// Time to resolve and index the videos of a request (a cache hit costs a lookup).
    pub index: Histogram,
    /// Time a decode thread spent on one GOP run.
    pub decode: Histogram,
    /// Time to look a request's frames up in the frame cache.
    pub cache_lookup: Histogram,
    /// Time to crop, flip, convert and stack a request's frames into one array.
    pub batch_assembly: Histogram,
    /// Frames decoded per GOP run (keyframe to last wanted frame, less skipped disposable frames).
    pub run_length: Histogram,
    /// Frames the decoder produced that no request asked for (GOP lead-in).
    pub frames_undelivered: Counter,
    /// Seconds decode threads spent decoding, by backend (utilisation = rate ÷ threads).
    pub busy_seconds: Family<BackendLabel, Counter<f64, AtomicU64>>,
    /// GOP runs decoded, by backend (`cuda`: on NVDEC; `cpu`: in software, including runs an NVDEC
    /// session sent to the CPU).
    pub runs: Family<BackendLabel, Counter>,
    /// GOP runs an NVDEC session decoded on the CPU because NVDEC could not decode the video.
    pub gpu_fallbacks: Counter,
    /// Files that could not be indexed (not media, corrupt, unreadable).
    pub index_failures: Counter,
    /// Files found damaged inside their coded data (re-indexed by decoding).
    pub damaged_files: Counter,
    /// Batch bytes handed to clients, by transport (shared with [`RpcMetrics::bytes_sent`], which counts
    /// inline bytes as they leave; shared-memory bytes are counted where a slot is written).
    pub bytes_sent: Family<TransportLabel, Counter>,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        let m = EngineMetrics {
            queue_wait: seconds_histogram(),
            index: seconds_histogram(),
            decode: seconds_histogram(),
            cache_lookup: seconds_histogram(),
            batch_assembly: seconds_histogram(),
            run_length: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            frames_undelivered: Counter::default(),
            busy_seconds: Family::default(),
            runs: Family::default(),
            gpu_fallbacks: Counter::default(),
            index_failures: Counter::default(),
            damaged_files: Counter::default(),
            bytes_sent: Family::default(),
        };
        // Series exist from the start, so rates over them are defined before the first decode.
        for b in [BackendLabel::CPU, BackendLabel::CUDA] {
            m.busy_seconds.get_or_create(&b).inc_by(0.0);
            m.runs.get_or_create(&b).inc_by(0);
        }
        for t in [TransportLabel::INLINE, TransportLabel::SHM] {
            m.bytes_sent.get_or_create(&t).inc_by(0);
        }
        m
    }
}

impl EngineMetrics {
    /// Counts batch bytes handed to a client through `transport`.
    pub fn sent(&self, transport: TransportLabel, bytes: u64) {
        self.bytes_sent.get_or_create(&transport).inc_by(bytes);
    }

    /// Bytes counted for `transport` so far.
    pub fn sent_bytes(&self, transport: TransportLabel) -> u64 {
        self.bytes_sent.get_or_create(&transport).get()
    }

    /// Records one finished GOP run: where it was decoded, its queue wait, decode time, length and lead-in.
    pub fn observe_run(
        &self,
        backend: BackendLabel,
        fallback: bool,
        waited: Duration,
        decoding: Duration,
        decoded: u64,
        delivered: u64,
    ) {
        self.queue_wait.observe(waited.as_secs_f64());
        self.decode.observe(decoding.as_secs_f64());
        if fallback {
            self.gpu_fallbacks.inc();
        }
        self.busy_seconds
            .get_or_create(&backend)
            .inc_by(decoding.as_secs_f64());
        self.runs.get_or_create(&backend).inc();
        self.run_length.observe(decoded as f64);
        self.frames_undelivered
            .inc_by(decoded.saturating_sub(delivered));
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "decode_queue_wait_seconds",
            "Time GOP runs waited for a decode thread",
            self.queue_wait.clone(),
        );
        r.register(
            "index_duration_seconds",
            "Time to resolve and index the videos of a request",
            self.index.clone(),
        );
        r.register(
            "decode_duration_seconds",
            "Time decode threads spent on one GOP run",
            self.decode.clone(),
        );
        r.register(
            "cache_lookup_duration_seconds",
            "Time to look a request's frames up in the frame cache",
            self.cache_lookup.clone(),
        );
        r.register(
            "batch_assembly_duration_seconds",
            "Time to crop, flip, convert and stack frames into one array",
            self.batch_assembly.clone(),
        );
        r.register(
            "decode_run_length_frames",
            "Frames decoded per GOP run",
            self.run_length.clone(),
        );
        r.register(
            "decode_frames_undelivered",
            "Frames decoded that no request asked for (GOP lead-in)",
            self.frames_undelivered.clone(),
        );
        r.register(
            "decode_busy_seconds",
            "Seconds decode threads spent decoding, by backend",
            self.busy_seconds.clone(),
        );
        r.register(
            "decode_runs",
            "GOP runs decoded, by backend",
            self.runs.clone(),
        );
        r.register(
            "decode_gpu_fallback_runs",
            "GOP runs an NVDEC session decoded on the CPU because NVDEC could not",
            self.gpu_fallbacks.clone(),
        );
        r.register(
            "index_failed_files",
            "Files that could not be indexed (not media, corrupt, unreadable)",
            self.index_failures.clone(),
        );
        r.register(
            "decode_damaged_files",
            "Files found damaged inside their coded data",
            self.damaged_files.clone(),
        );
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    pub backend: &'static str,
}

impl BackendLabel {
    pub const CPU: BackendLabel = BackendLabel { backend: "cpu" };
    pub const CUDA: BackendLabel = BackendLabel { backend: "cuda" };
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodCodeLabels {
    pub method: &'static str,
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabel {
    pub transport: &'static str,
}

impl TransportLabel {
    pub const INLINE: TransportLabel = TransportLabel {
        transport: "inline",
    };
    pub const SHM: TransportLabel = TransportLabel { transport: "shm" };
}

/// What the RPC layer observes for every call, whatever the service.
#[derive(Clone, Debug)]
pub struct RpcMetrics {
    /// Finished calls by method and gRPC status code name.
    pub requests: Family<MethodCodeLabels, Counter>,
    /// Call duration, from the request's arrival to the reply's last byte.
    pub duration: Family<MethodLabel, Histogram>,
    /// Unary calls in flight.
    pub in_flight_requests: Gauge,
    /// Streaming calls in flight (GetClips, StreamBatches, health Watch).
    pub in_flight_streams: Gauge,
    /// Time from a GetClips reply's first message to its end (the send stage).
    pub send: Histogram,
    /// Reply bytes written for array-carrying calls, by transport.
    pub bytes_sent: Family<TransportLabel, Counter>,
    /// Places (stream or unary) taken back from replies left unread for a refused client
    /// ([`crate::admission`]).
    pub places_taken_back: Counter,
    /// Calls that do work (Probe, ListDatasets, Reload and the reply streams; not health checks,
    /// GetStats or releases), in flight and finished: not exported, read by the idle heap trim.
    pub calls: CallActivity,
}

/// Calls that do work in flight, and finished so far (see [`RpcMetrics::calls`]).
#[derive(Clone, Debug, Default)]
pub struct CallActivity {
    active: Arc<AtomicI64>,
    finished: Arc<AtomicU64>,
}

impl CallActivity {
    pub fn started(&self) {
        self.active.fetch_add(1, Ordering::Relaxed);
    }

    pub fn ended(&self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
        self.finished.fetch_add(1, Ordering::Relaxed);
    }

    pub fn active(&self) -> i64 {
        self.active.load(Ordering::Relaxed)
    }

    pub fn finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }
}

impl RpcMetrics {
    /// New RPC metrics counting reply bytes into `bytes_sent` (the engine's family, one series per
    /// transport).
    pub fn new(bytes_sent: Family<TransportLabel, Counter>) -> Self {
        RpcMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(seconds_histogram),
            in_flight_requests: Gauge::default(),
            in_flight_streams: Gauge::default(),
            send: seconds_histogram(),
            bytes_sent,
            places_taken_back: Counter::default(),
            calls: CallActivity::default(),
        }
    }
}

impl RpcMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "rpc_requests",
            "Finished RPCs by method and status code",
            self.requests.clone(),
        );
        r.register(
            "rpc_duration_seconds",
            "RPC duration from arrival to the reply's end",
            self.duration.clone(),
        );
        r.register(
            "rpc_in_flight_requests",
            "Unary RPCs in flight",
            self.in_flight_requests.clone(),
        );
        r.register(
            "rpc_in_flight_streams",
            "Streaming RPCs in flight",
            self.in_flight_streams.clone(),
        );
        r.register(
            "transport_send_duration_seconds",
            "Time from a GetClips reply's first message to its end",
            self.send.clone(),
        );
        r.register(
            "transport_sent_bytes",
            "Batch bytes sent to clients, by transport",
            self.bytes_sent.clone(),
        );
        r.register(
            "places_taken_back",
            "Stream and unary places taken back from replies whose client left them unread, for a refused client",
            self.places_taken_back.clone(),
        );
    }
}

/// One value read at scrape time: a counter or a gauge, by name (without the `vserve_` prefix) and help.
#[derive(Clone, Debug)]
pub struct Scraped {
    pub name: &'static str,
    pub help: &'static str,
    pub value: u64,
    pub gauge: bool,
}

impl Scraped {
    pub fn counter(name: &'static str, help: &'static str, value: u64) -> Scraped {
        Scraped {
            name,
            help,
            value,
            gauge: false,
        }
    }

    pub fn gauge(name: &'static str, help: &'static str, value: u64) -> Scraped {
        Scraped {
            name,
            help,
            value,
            gauge: true,
        }
    }
}

/// Reads a component's values at scrape time (a closure the component supplies; it holds no strong
/// reference that would keep the component alive).
struct ScrapeCollector(Box<dyn Fn() -> Vec<Scraped> + Send + Sync>);

impl std::fmt::Debug for ScrapeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapeCollector").finish_non_exhaustive()
    }
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for s in (self.0)() {
            if s.gauge {
                let g = ConstGauge::new(i64::try_from(s.value).unwrap_or(i64::MAX));
                g.encode(encoder.encode_descriptor(s.name, s.help, None, g.metric_type())?)?;
            } else {
                let c = ConstCounter::new(s.value);
                c.encode(encoder.encode_descriptor(s.name, s.help, None, c.metric_type())?)?;
            }
        }
        Ok(())
    }
}

/// The process's registry and the handles the server layers need.
pub struct Metrics {
    registry: Registry,
    pub rpc: RpcMetrics,
}

impl Metrics {
    /// Creates the registry with the engine's observed metrics and the RPC layer's, all under the
    /// `vserve` prefix.
    pub fn new(engine: &EngineMetrics) -> Metrics {
        let mut registry = Registry::with_prefix("vserve");
        engine.register(&mut registry);
        let rpc = RpcMetrics::new(engine.bytes_sent.clone());
        rpc.register(&mut registry);
        Metrics { registry, rpc }
    }

    /// Registers values read at scrape time.
    pub fn register_scrape(&mut self, read: impl Fn() -> Vec<Scraped> + Send + Sync + 'static) {
        self.registry
            .register_collector(Box::new(ScrapeCollector(Box::new(read))));
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::with_capacity(16 << 10);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Measures a span of work: `let t = Timer::start(); …; t.observe(&histogram)`.
pub struct Timer(std::time::Instant);

impl Timer {
    pub fn start() -> Timer {
        Timer(std::time::Instant::now())
    }

    pub fn observe(self, h: &Histogram) {
        h.observe(self.0.elapsed().as_secs_f64());
    }
}
