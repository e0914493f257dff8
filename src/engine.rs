//! The engine wires the stages a request goes through: the [`Catalog`] (datasets, frame tables), the
//! [`Frames`] (cache, single flight, decode fleet) and the shared-memory registry, plus the counters,
//! limits and in-flight memory [`Budget`] every handler reads. It holds no request logic: each RPC's is a module of
//! [`crate::handle`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::budget::Budget;
use crate::catalog::Catalog;
use crate::config::{Config, Limits};
use crate::decode::fleet::{BackendFactory, FleetOptions};
use crate::frames::{FailureHook, Frames};
use crate::journal::Journal;
use crate::metrics::{EngineMetrics, Scraped};
use crate::request::DatasetSummary;
use crate::state::StateDir;
use crate::store::Store;
use crate::transport::shm::{ShmBudget, ShmRegistry};

/// Calls `$then!` with the names of the daemon's counters, the one list of them: [`Stats`]'s fields, the
/// GetStats reply built from it (`api`; the proto's `GetStatsResponse` has the same names, so a field
/// missing here fails that build) and `vserve stats`'s JSON keys (`commands`) are all written from it.
macro_rules! for_each_stat {
    ($then:ident) => {
        $then! {
            frames_decoded gop_runs cache_hits cache_misses cache_bytes cache_entries index_builds
            cache_admitted cache_bypassed requests decode_queue_depth shared_frames frames_skipped active_streams
            inflight_requests
            samples_skipped batches_sent shm_arenas frames_in_place decoders_opened decoders_reused
        }
    };
}
pub(crate) use for_each_stat;

macro_rules! stats_struct {
    ($($field:ident)*) => {
        /// Counters since start-up (each documented at `GetStatsResponse` in the proto).
        #[derive(Debug, Default, Clone)]
        pub struct Stats {
            $(pub $field: u64,)*
        }
    };
}
for_each_stat!(stats_struct);

/// Stream counters, kept by the stream handler.
#[derive(Default)]
pub struct StreamCounters {
    pub active: AtomicU64,
    pub batches: AtomicU64,
    pub skipped: AtomicU64,
}

pub struct Engine {
    catalog: Arc<Catalog>,
    frames: Frames,
    /// Shared-memory arenas (transport SHM).
    shm: Arc<ShmRegistry>,
    /// What is remembered across restarts; `None` when configured off or not writable.
    state: Option<StateDir>,
    /// The crash journal in `state` (None without a state directory).
    journal: Option<Arc<Journal>>,
    /// Probe and GetClips requests since start-up, and those in progress.
    requests: AtomicU64,
    inflight_calls: Arc<AtomicU64>,
    streams: StreamCounters,
    limits: Limits,
    /// How long a stream may wait on its client (`--stream-idle-timeout`; zero: forever).
    stream_idle: std::time::Duration,
    /// What requests and streams hold in memory (`--max-inflight-bytes`).
    budget: Budget,
    /// Set when the server starts draining: streams end after the batch they are preparing.
    draining: watch::Sender<bool>,
    /// Stage timings and decode outcomes for `/metrics` (registered by the server).
    metrics: EngineMetrics,
}

impl Engine {
    /// Opens the datasets and starts the decode fleet (`config.decode.threads` threads).
    pub fn new(config: &Config, factory: BackendFactory) -> Result<Arc<Engine>, String> {
        Engine::with_threads(config, config.decode.threads, factory)
    }

    /// Opens the datasets and starts a decode fleet of `threads` threads (CPU threads plus NVDEC sessions;
    /// `factory` gives each slot its backend).
    pub fn with_threads(
        config: &Config,
        threads: usize,
        factory: BackendFactory,
    ) -> Result<Arc<Engine>, String> {
        let metrics = EngineMetrics::default();
        let state = config
            .state_dir
            .as_deref()
            .and_then(|dir| match StateDir::open(dir) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "state directory unusable; nothing will be remembered across restarts");
                    None
                }
            });
        let (journal, quarantine) = match state.as_ref().map(crate::journal::recover) {
            Some(Ok((j, q))) => (j, Some(q)),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "crash journal unusable; a file that crashes the daemon will crash it again");
                (None, None)
            }
            None => (None, None),
        };
        let store = state
            .as_ref()
            .map(|s| Arc::new(Store::open(s, config.cache.store_bytes)));
        let mut catalog = Catalog::open(config, metrics.clone())?.with_store(store);
        if let Some(q) = quarantine {
            catalog.set_crash_guard(journal.clone(), q);
        }
        let catalog = Arc::new(catalog);
        Catalog::start_rescans(&catalog, config.rescan_interval);
        let fs_bytes = crate::transport::shm::filesystem_bytes(&config.shm_dir).unwrap_or(1 << 30);
        let total = config.tenancy.shm_bytes.unwrap_or(fs_bytes / 4 * 3).max(1) as usize;
        let budget = ShmBudget {
            total,
            per_client: config
                .tenancy
                .client_shm_bytes
                .map_or((total / 2).max(1), |b| b as usize),
        };
        let shm = Arc::new(
            ShmRegistry::new(
                config.shm_dir.clone(),
                std::time::Duration::from_secs(60),
                budget,
            )
            .map_err(|e| e.to_string())?,
        );
        ShmRegistry::start_reaper(&shm);
        let stale = shm.remove_stale();
        if stale > 0 {
            tracing::info!(removed = stale, dir = %config.shm_dir.display(), "removed shared-memory arenas of daemons no longer running");
        }
        let stalled = catalog.clone();
        let on_failure: FailureHook =
            Arc::new(move |id, e| stalled.mark_stalled(id, &e.to_string()));
        let frames = Frames::start(
            threads,
            config.decode.queue,
            factory,
            FleetOptions {
                deadline: config.decode.deadline,
                max_stuck: threads.max(1),
                journal: journal.clone(),
            },
            crate::cache::FrameCache::with_admission(
                config.cache.bytes,
                f64::from(config.cache.admit_ppm) / 1e6,
            ),
            metrics.clone(),
            on_failure,
        )?;
        Ok(Arc::new(Engine {
            catalog,
            frames,
            shm,
            state,
            journal,
            requests: AtomicU64::new(0),
            inflight_calls: Arc::default(),
            streams: StreamCounters::default(),
            limits: config.limits.clone(),
            stream_idle: config.tenancy.stream_idle,
            budget: Budget::shared(
                crate::budget::Shares {
                    capacity: config.limits.max_inflight_bytes,
                    per_client: config
                        .tenancy
                        .client_inflight_bytes(config.limits.max_inflight_bytes),
                    reserved: config
                        .tenancy
                        .reserved_inflight_bytes(config.limits.max_inflight_bytes),
                },
                crate::budget::DEFAULT_WAIT,
            ),
            draining: watch::channel(false).0,
            metrics,
        }))
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn frames(&self) -> &Frames {
        &self.frames
    }

    pub fn shm(&self) -> &Arc<ShmRegistry> {
        &self.shm
    }

    /// The state directory, when there is one.
    pub fn state(&self) -> Option<&StateDir> {
        self.state.as_ref()
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// How long a stream may wait on its client before it is ended (zero: forever).
    pub fn stream_idle(&self) -> std::time::Duration {
        self.stream_idle
    }

    /// The in-flight memory budget requests and streams reserve from.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    pub fn streams(&self) -> &StreamCounters {
        &self.streams
    }

    /// The engine's metric handles, for the server to register.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// Decode threads in the fleet (CPU threads and NVDEC sessions).
    pub fn fleet_threads(&self) -> usize {
        self.frames.threads()
    }

    pub fn datasets(&self, only: Option<&str>, labels: bool) -> Vec<DatasetSummary> {
        self.catalog.datasets(only, labels)
    }

    /// Counts a Probe or GetClips request; the guard counts it in progress until dropped (a GetClips
    /// reply's, by the RPC layer, when its last byte is written).
    pub fn request_started(&self) -> CallGuard {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inflight_calls.fetch_add(1, Ordering::Relaxed);
        CallGuard(self.inflight_calls.clone())
    }

    pub fn stats(&self) -> Stats {
        let f = self.frames.stats();
        let active = self.streams.active.load(Ordering::Relaxed);
        Stats {
            frames_decoded: f.frames_decoded,
            gop_runs: f.gop_runs,
            cache_hits: f.cache_hits,
            cache_misses: f.cache_misses,
            cache_bytes: f.cache_bytes,
            cache_entries: f.cache_entries,
            cache_admitted: f.cache_admitted,
            cache_bypassed: f.cache_bypassed,
            index_builds: self.catalog.index_builds(),
            requests: self.requests.load(Ordering::Relaxed),
            decode_queue_depth: f.decode_queue_depth,
            shared_frames: f.shared_frames,
            frames_skipped: f.frames_skipped,
            active_streams: active,
            inflight_requests: self.inflight_calls.load(Ordering::Relaxed) + active,
            samples_skipped: self.streams.skipped.load(Ordering::Relaxed),
            batches_sent: self.streams.batches.load(Ordering::Relaxed),
            shm_arenas: self.shm.open_arenas(),
            frames_in_place: f.frames_in_place,
            decoders_opened: f.decoders_opened,
            decoders_reused: f.decoders_reused,
        }
    }

    /// Whether the daemon can make progress (`/livez`): Err, saying why, when its decode threads or
    /// index builds are stuck beyond what it replaces.
    pub fn liveness(&self) -> Result<(), String> {
        self.frames.health()?;
        self.catalog.health()
    }

    /// Stops the decode fleet, waiting for its threads until `deadline` (threads stuck in a read are
    /// left behind), then clears the crash journal: nothing crashed.
    pub fn shutdown(&self, deadline: std::time::Instant) {
        self.frames.shutdown(deadline);
        if let Some(j) = &self.journal {
            j.clear_all();
        }
    }

    /// Starts the drain: open streams send the batch they are preparing, then end with UNAVAILABLE
    /// (the client resumes from the next batch elsewhere or later).
    pub fn begin_drain(&self) {
        self.draining.send_replace(true);
    }

    pub fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Resolves once the drain has begun ([`Engine::begin_drain`]).
    pub async fn drained(&self) {
        let mut rx = self.draining.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// The engine's counters for `/metrics`, read at scrape time (`decode_threads` and `gpu_threads`: the
    /// fleet's CPU threads and NVDEC sessions).
    pub fn scrape(&self, decode_threads: usize, gpu_threads: usize) -> Vec<Scraped> {
        let s = self.stats();
        let (index_tables, index_bytes) = self.catalog.index_cache();
        vec![
            Scraped::counter(
                "cache_hits",
                "Frames served from the frame cache.",
                s.cache_hits,
            ),
            Scraped::counter(
                "cache_misses",
                "Frames not in the frame cache.",
                s.cache_misses,
            ),
            Scraped::counter(
                "cache_evictions",
                "Frames evicted from the frame cache to stay within its size.",
                self.frames.stats().cache_evictions,
            ),
            Scraped::counter(
                "cache_admitted",
                "Decoded frames that entered the frame cache.",
                s.cache_admitted,
            ),
            Scraped::counter(
                "cache_bypassed",
                "Decoded frames served without entering the frame cache (scans, one-pass requests).",
                s.cache_bypassed,
            ),
            Scraped::counter("decode_frames_decoded", "Frames decoded.", s.frames_decoded),
            Scraped::counter(
                "decode_frames_in_place",
                "Decoded frames converted straight into the shared-memory reply that wanted them.",
                s.frames_in_place,
            ),
            Scraped::counter(
                "decode_decoders_opened",
                "Decoders opened for a video that was not open on its thread.",
                s.decoders_opened,
            ),
            Scraped::counter(
                "decode_decoders_reused",
                "Of the decoders opened, those that were another video's of the same parameter sets, reused.",
                s.decoders_reused,
            ),
            Scraped::counter(
                "decode_frames_skipped",
                "Disposable frames whose packets were never decoded.",
                s.frames_skipped,
            ),
            Scraped::counter("decode_gop_runs", "GOP runs decoded (consecutive GOPs whose wanted frames meet are one run).", s.gop_runs),
            Scraped::counter(
                "decode_shared_frames",
                "Frames a request got from another request's decode pass.",
                s.shared_frames,
            ),
            Scraped::counter("index_builds", "Video indexes built.", s.index_builds),
            Scraped::counter(
                "engine_requests",
                "Probe and GetClips requests.",
                s.requests,
            ),
            Scraped::counter(
                "stream_samples_skipped",
                "Stream samples replaced because they could not be read.",
                s.samples_skipped,
            ),
            Scraped::counter(
                "stream_batches_sent",
                "Stream batches sent.",
                s.batches_sent,
            ),
            Scraped::counter(
                "budget_refusals",
                "Requests and streams refused because their bytes did not fit the in-flight budget.",
                self.budget.refusals(),
            ),
            Scraped::gauge(
                "budget_inflight_bytes",
                "Bytes reserved by requests and streams in flight.",
                self.budget.in_use(),
            ),
            Scraped::gauge(
                "budget_capacity_bytes",
                "The in-flight memory budget (max-inflight-bytes).",
                self.budget.capacity(),
            ),
            Scraped::gauge(
                "index_cache_tables",
                "Frame tables held in the index cache.",
                index_tables,
            ),
            Scraped::gauge(
                "index_cache_bytes",
                "Weight of the index cache's frame tables, bounded by --index-cache-bytes.",
                index_bytes,
            ),
            Scraped::gauge(
                "shm_arenas",
                "Shared-memory arena files alive (replies, streams, spares kept for reuse).",
                s.shm_arenas,
            ),
            Scraped::gauge(
                "shm_bytes",
                "Bytes of the shared-memory arena files alive (what they may take of --shm-dir).",
                self.shm.bytes_in_use() as u64,
            ),
            Scraped::counter(
                "decode_deadline_exceeded_runs",
                "GOP runs failed for passing --decode-deadline (each abandoned its thread).",
                self.frames.stats().deadline_exceeded,
            ),
            Scraped::counter(
                "index_deadline_exceeded_builds",
                "Index builds whose requests failed for passing --index-deadline.",
                self.catalog.stuck_builds().1,
            ),
            Scraped::counter(
                "decode_runs_paused",
                "GOP runs paused at the end of a time slice for another client's run, each continued where it stopped.",
                self.frames.stats().runs_paused,
            ),
            Scraped::gauge(
                "decode_stuck_threads",
                "Decode threads abandoned in a run past its deadline that have not returned.",
                self.frames.stats().stuck_threads,
            ),
            Scraped::gauge(
                "index_waiting_builds",
                "Index builds waiting for a place (as many as decode threads; places go round the clients).",
                self.catalog.builds_waiting().0 as u64,
            ),
            Scraped::gauge(
                "check_waiting_videos",
                "CheckDataset videos waiting for a check place (as many as decode threads, all calls together).",
                self.catalog.checks_waiting() as u64,
            ),
            Scraped::gauge(
                "index_stuck_builds",
                "Index builds abandoned past their deadline whose threads have not returned.",
                self.catalog.stuck_builds().0,
            ),
            Scraped::counter(
                "journal_synced_records",
                "Crash-journal records made durable (fdatasync): a run on a device entering another file.",
                self.journal.as_ref().map_or(0, |j| j.syncs()),
            ),
            Scraped::gauge(
                "catalog_quarantined_files",
                "Files refused because a daemon crashed while decoding them.",
                self.catalog.quarantined() as u64,
            ),
            Scraped::gauge(
                "cache_size_bytes",
                "Bytes held by the frame cache.",
                s.cache_bytes,
            ),
            Scraped::gauge(
                "cache_entries_frames",
                "Frames held by the frame cache.",
                s.cache_entries,
            ),
            Scraped::gauge(
                "frame_pool_bytes",
                "Bytes of free frame buffers kept for the decoders to reuse.",
                crate::decode::pool::held_bytes() as u64,
            ),
            Scraped::gauge(
                "decode_queue_depth_runs",
                "GOP runs waiting for a decode thread.",
                s.decode_queue_depth,
            ),
            Scraped::gauge(
                "decode_threads",
                "Decode threads (backend cpu).",
                decode_threads as u64,
            ),
            Scraped::gauge(
                "decode_slots_vacant",
                "Decode threads missing: slots whose thread, stuck in a read, was abandoned and not replaced.",
                self.frames.vacant_slots() as u64,
            ),
            Scraped::gauge(
                "decode_gpu_threads",
                "Decode threads that are NVDEC sessions (backend cuda).",
                gpu_threads as u64,
            ),
        ]
    }
}

/// Decrements a gauge when a call ends, however it ends (cancellation included).
pub struct CallGuard(Arc<AtomicU64>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
