//! The engine: one request's path through the stages, in domain types (no protobuf).
//!
//! resolve (dataset) → index (cached per file identity) → positions to frame numbers → geometry → frame
//! cache → plan (GOP runs) → decode fleet, with single flight per run → batch assembly.
//!
//! Single flight: a GOP run in progress is registered under (video, keyframe, geometry). A request that
//! needs frames from a registered run waits for that pass and takes the frames it needs from its output;
//! whatever it still lacks (frames past the other request's stopping point) it decodes in a second round
//! of its own. Decoded frames enter the cache on the decode thread, whether or not the requester is still
//! there, so cancelled work is never wasted; a run nobody waits for any more is skipped before it starts.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::batch::{self, BatchSpec};
use crate::cache::{FrameCache, FrameKey, VideoId};
use crate::config::{Config, Limits};
use crate::dataset::Dataset;
use crate::decode::fleet::{BackendFactory, Fleet, Job, OnDone, PendingRun};
use crate::decode::{DecodeError, Frame, Geometry, GopRun, RunOutput, VideoSource};
use crate::error::Error;
use crate::index::{self, Lookup, VideoIndex};
use crate::plan;

/// Where in a video a clip's frames are.
#[derive(Clone, Debug, PartialEq)]
pub enum Positions {
    Frames(Vec<u64>),
    Times(Vec<f64>),
}

impl Positions {
    fn len(&self) -> usize {
        match self {
            Positions::Frames(v) => v.len(),
            Positions::Times(v) => v.len(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClipRequest {
    pub video: String,
    pub stream: Option<u32>,
    pub positions: Positions,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resize {
    Native,
    Exact { width: u32, height: u32 },
    ShortSide(u32),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Transform {
    pub resize: Resize,
    pub rotate: bool,
    pub batch: BatchSpec,
}

impl Default for Transform {
    fn default() -> Self {
        Transform {
            resize: Resize::Native,
            rotate: true,
            batch: BatchSpec::default(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClipsRequest {
    pub dataset: String,
    pub clips: Vec<ClipRequest>,
    pub transform: Transform,
    /// Assemble the reply straight into a one-shot shared-memory arena (`ClipsReply::shm`) rather than
    /// into `ClipsReply::data`.
    pub shm: bool,
    /// With `shm`: the client lets the arena be reused after releasing it (`reuse_arena`).
    pub shm_reuse: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestStats {
    pub frames_decoded: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub gop_runs: u64,
    pub shared_frames: u64,
    pub frames_skipped: u64,
}

impl RequestStats {
    pub(crate) fn add(&mut self, o: &RequestStats) {
        self.frames_decoded += o.frames_decoded;
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.gop_runs += o.gop_runs;
        self.shared_frames += o.shared_frames;
        self.frames_skipped += o.frames_skipped;
    }
}

#[derive(Clone, Debug)]
pub struct ClipMeta {
    pub video: String,
    pub frames: Vec<u64>,
    pub pts: Vec<i64>,
    pub pts_seconds: Vec<f64>,
    /// Per frame: the duration the stream states for it (FFmpeg's frame duration), in seconds.
    pub duration_seconds: Vec<f64>,
}

#[derive(Debug)]
pub struct ClipsReply {
    pub shape: Vec<u64>,
    /// The array's bytes; empty when they are in `shm`.
    pub data: Vec<u8>,
    /// Where the array is when the request asked for shared memory.
    pub shm: Option<crate::transport::shm::ShmRef>,
    /// Bytes of the array, wherever it is.
    pub nbytes: u64,
    pub clips: Vec<ClipMeta>,
    pub stats: RequestStats,
}

#[derive(Clone, Debug)]
pub struct DatasetSummary {
    pub name: String,
    pub root: String,
    pub video_count: u64,
    /// The samples a stream draws from (manifest rows, else the videos a scan lists).
    pub samples: u64,
    /// Each distinct label and its label index.
    pub classes: Vec<(String, i64)>,
}

/// Counters since start-up.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub frames_decoded: u64,
    pub gop_runs: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_bytes: u64,
    pub cache_entries: u64,
    pub index_builds: u64,
    pub requests: u64,
    pub decode_queue_depth: u64,
    pub shared_frames: u64,
    pub frames_skipped: u64,
    pub active_streams: u64,
    pub inflight_requests: u64,
    pub samples_skipped: u64,
    pub batches_sent: u64,
    pub shm_arenas: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    index_builds: AtomicU64,
    shared_frames: AtomicU64,
    tenants: AtomicU64,
    inflight_calls: AtomicU64,
}

/// Stream counters, kept by the stream module.
#[derive(Default)]
pub(crate) struct StreamCounters {
    pub active: AtomicU64,
    pub batches: AtomicU64,
    pub skipped: AtomicU64,
}

type RunResult = Result<Arc<RunOutput>, DecodeError>;
type RunSender = Arc<watch::Sender<Option<RunResult>>>;

/// A run in the single-flight table: its result channel, the run itself while it may still grow, and
/// its queued job (a joiner from another tenant queues a copy under its own tenant).
#[derive(Clone)]
struct InFlight {
    tx: RunSender,
    pending: Arc<Mutex<PendingRun>>,
    job: Job,
}

/// Whose decode work a fetch queues: the fleet shares threads fairly between tenants. `bounded` work
/// (GetClips) is refused when the queue is full; a stream's is not, since its prefetch bounds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tenant {
    pub id: u64,
    pub bounded: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RunKey {
    video: Arc<VideoId>,
    keyframe: usize,
    geometry: Geometry,
}

pub struct Engine {
    datasets: BTreeMap<String, Dataset>,
    /// Datasets whose root holds GulpIO chunks: videos are ids, frames stored JPEGs.
    gulps: BTreeMap<String, Arc<crate::gulp::reader::GulpDataset>>,
    indexes: moka::sync::Cache<Arc<VideoId>, Arc<VideoIndex>>,
    /// Files that failed to index, remembered briefly (by identity, so a replaced file is tried again at
    /// once): a client repeating a request for a broken file costs a lookup, not another scan.
    failed: moka::sync::Cache<Arc<VideoId>, index::IndexError>,
    frames: FrameCache,
    fleet: Fleet,
    /// GOP runs being decoded now, for single flight.
    inflight: Arc<Mutex<HashMap<RunKey, InFlight>>>,
    counters: Counters,
    streams: StreamCounters,
    limits: Limits,
    /// Parsed manifests, by dataset name (datasets without one are scanned per stream).
    manifests: BTreeMap<String, Arc<crate::manifest::Samples>>,
    /// Files whose coded data turned out damaged (by identity without `decode_table`): they are indexed
    /// by decoding from then on.
    damaged: Mutex<std::collections::HashSet<VideoId>>,
    /// Dataset scans of the last seconds: every rank and data-loader worker opening a stream at an
    /// epoch's start shares one directory walk.
    pub(crate) recent_scans: moka::sync::Cache<String, Arc<crate::manifest::Samples>>,
    /// Shared-memory arenas (transport SHM).
    pub(crate) shm: crate::transport::shm::ShmRegistry,
    /// Set when the server starts draining: streams end after the batch they are preparing.
    draining: watch::Sender<bool>,
    /// Bounds concurrent index builds (file scans, and full decodes for irregular files) to the decode
    /// thread count, so a batch of new videos cannot oversubscribe the cores from the blocking pool.
    index_permits: Arc<tokio::sync::Semaphore>,
    /// Stage timings and decode outcomes for `/metrics` (registered by the server).
    metrics: crate::metrics::EngineMetrics,
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
        let mut datasets = BTreeMap::new();
        let mut manifests = BTreeMap::new();
        let mut gulps = BTreeMap::new();
        for d in &config.datasets {
            let ds = Dataset::new(&d.name, &d.root)
                .map_err(|e| format!("dataset {:?}: root {:?}: {e}", d.name, d.root))?;
            if crate::gulp::is_gulp_dir(&ds.root) {
                let g = crate::gulp::reader::GulpDataset::open(&ds.root)
                    .map_err(|e| format!("dataset {:?}: {e}", d.name))?;
                tracing::info!(dataset = %d.name, videos = g.len(), unreadable_chunks = g.broken.len(), "gulp dataset opened");
                if d.manifest.is_none() {
                    manifests.insert(d.name.clone(), Arc::new(g.samples()));
                }
                gulps.insert(d.name.clone(), Arc::new(g));
            }
            datasets.insert(d.name.clone(), ds);
            if let Some(m) = &d.manifest {
                let samples = crate::manifest::Samples::from_manifest(m)
                    .map_err(|e| format!("dataset {:?}: {e}", d.name))?;
                tracing::info!(dataset = %d.name, manifest = %m.display(), samples = samples.len(), "manifest loaded");
                manifests.insert(d.name.clone(), Arc::new(samples));
            }
        }
        let shm = crate::transport::shm::ShmRegistry::new(
            config.shm_dir.clone(),
            0o640,
            std::time::Duration::from_secs(60),
        );
        let stale = shm.remove_stale();
        if stale > 0 {
            tracing::info!(removed = stale, dir = %config.shm_dir.display(), "removed shared-memory arenas of daemons no longer running");
        }
        let fleet = Fleet::start(threads, config.decode.queue, factory)
            .map_err(|e| format!("cannot start decode threads: {e}"))?;
        let indexes = moka::sync::Cache::builder()
            .max_capacity(config.cache.index_bytes)
            .weigher(|_k: &Arc<VideoId>, v: &Arc<VideoIndex>| {
                u32::try_from(v.approx_bytes()).unwrap_or(u32::MAX)
            })
            .build();
        let failed = moka::sync::Cache::builder()
            .max_capacity(10_000)
            .time_to_live(std::time::Duration::from_secs(30))
            .build();
        Ok(Arc::new(Engine {
            datasets,
            gulps,
            indexes,
            failed,
            frames: FrameCache::new(config.cache.bytes),
            fleet,
            inflight: Arc::new(Mutex::new(HashMap::new())),
            counters: Counters::default(),
            streams: StreamCounters::default(),
            limits: config.limits.clone(),
            manifests,
            index_permits: Arc::new(tokio::sync::Semaphore::new(config.decode.threads.max(1))),
            damaged: Mutex::new(std::collections::HashSet::new()),
            draining: watch::channel(false).0,
            shm,
            recent_scans: moka::sync::Cache::builder()
                .max_capacity(64)
                .time_to_live(std::time::Duration::from_secs(10))
                .build(),
            metrics: Default::default(),
        }))
    }

    /// Decode threads in the fleet (CPU threads and NVDEC sessions).
    pub fn fleet_threads(&self) -> usize {
        self.fleet.threads()
    }

    pub fn datasets(&self) -> Vec<DatasetSummary> {
        self.datasets
            .values()
            .map(|d| {
                let manifest = self.manifests.get(&d.name);
                DatasetSummary {
                    name: d.name.clone(),
                    root: d.root.display().to_string(),
                    video_count: self
                        .gulps
                        .get(&d.name)
                        .map_or_else(|| d.count_videos(), |g| g.len() as u64),
                    samples: manifest.map_or_else(
                        || crate::manifest::Samples::scan(&d.root).len(),
                        |m| m.len(),
                    ) as u64,
                    classes: manifest.map(|m| m.classes()).unwrap_or_default(),
                }
            })
            .collect()
    }

    pub fn stats(&self) -> Stats {
        self.frames.sync();
        let c = &self.counters;
        let f = &self.fleet.counters;
        Stats {
            frames_decoded: f.frames_decoded.load(Ordering::Relaxed),
            gop_runs: f.runs.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
            cache_misses: c.cache_misses.load(Ordering::Relaxed),
            cache_bytes: self.frames.weighted_bytes(),
            cache_entries: self.frames.entries(),
            index_builds: c.index_builds.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            decode_queue_depth: self.fleet.queue_depth() as u64,
            shared_frames: c.shared_frames.load(Ordering::Relaxed),
            frames_skipped: f.frames_skipped.load(Ordering::Relaxed),
            active_streams: self.streams.active.load(Ordering::Relaxed),
            inflight_requests: c.inflight_calls.load(Ordering::Relaxed)
                + self.streams.active.load(Ordering::Relaxed),
            samples_skipped: self.streams.skipped.load(Ordering::Relaxed),
            batches_sent: self.streams.batches.load(Ordering::Relaxed),
            shm_arenas: self.shm.open_arenas(),
        }
    }

    /// Starts the drain: open streams send the batch they are preparing, then end with UNAVAILABLE
    /// (the client resumes from the next batch elsewhere or later).
    pub fn begin_drain(&self) {
        self.draining.send_replace(true);
    }

    pub(crate) fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    pub(crate) fn stream_counters(&self) -> &StreamCounters {
        &self.streams
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    pub(crate) fn manifest_of(
        &self,
        dataset: &str,
    ) -> Result<Option<Arc<crate::manifest::Samples>>, Error> {
        self.dataset(dataset)?;
        Ok(self.manifests.get(dataset).cloned())
    }

    /// Resolves and indexes one video on a blocking thread, within the index-build bound.
    pub(crate) async fn index_video(
        self: &Arc<Self>,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
    ) -> Result<(Arc<VideoId>, Arc<VideoIndex>, VideoSource), Error> {
        let permit = self.index_permit().await?;
        let (this, d, v) = (self.clone(), dataset.to_owned(), video.to_owned());
        blocking(move || {
            let _permit = permit;
            this.index_blocking(&d, &v, stream)
        })
        .await
    }

    pub(crate) fn new_tenant(&self, bounded: bool) -> Tenant {
        Tenant {
            id: self.counters.tenants.fetch_add(1, Ordering::Relaxed),
            bounded,
        }
    }

    /// The engine's metric handles, for the server to register.
    pub fn metrics(&self) -> &crate::metrics::EngineMetrics {
        &self.metrics
    }

    /// Frames the frame cache evicted to stay within its size.
    pub fn cache_evictions(&self) -> u64 {
        self.frames.evictions()
    }

    async fn index_permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Error> {
        self.index_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::ShuttingDown)
    }

    pub(crate) fn dataset(&self, name: &str) -> Result<&Dataset, Error> {
        self.datasets
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("dataset {name:?} not served here")))
    }

    /// Resolves and indexes one video. Blocking (FFmpeg); call from a blocking thread.
    fn index_blocking(
        &self,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
    ) -> Result<(Arc<VideoId>, Arc<VideoIndex>, VideoSource), Error> {
        let ds = self.dataset(dataset)?;
        if let Some(g) = self.gulps.get(dataset) {
            return self.index_stored(g, video);
        }
        let (path, meta) = ds.resolve(video)?;
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i128);
        let mut id = VideoId {
            path: path.clone(),
            size: meta.len(),
            mtime_ns,
            stream,
            decode_table: false,
        };
        id.decode_table = self.damaged.lock().contains(&id);
        let id = Arc::new(id);
        let force_decode = id.decode_table;
        if let Some(e) = self.failed.get(&id) {
            return Err(e.into());
        }
        let index = self
            .indexes
            .try_get_with(id.clone(), || {
                self.counters.index_builds.fetch_add(1, Ordering::Relaxed);
                let started = std::time::Instant::now();
                let built = index::build(&path, stream.map(|s| s as usize), force_decode);
                if let Ok(ix) = &built {
                    tracing::debug!(
                        path = %path.display(),
                        frames = ix.frame_count(),
                        method = ?ix.method,
                        ms = started.elapsed().as_millis() as u64,
                        "indexed"
                    );
                }
                built.map(Arc::new)
            })
            .map_err(|e| {
                self.metrics.index_failures.inc();
                self.failed.insert(id.clone(), (*e).clone());
                Error::from((*e).clone())
            })?;
        let source = VideoSource {
            path,
            index: index.clone(),
            gulp: None,
        };
        Ok((id, index, source))
    }

    /// A video of a gulp dataset, by id: its table comes from the meta file, its identity (cache key) is
    /// its chunk's data file plus the id.
    fn index_stored(
        &self,
        g: &Arc<crate::gulp::reader::GulpDataset>,
        video: &str,
    ) -> Result<(Arc<VideoId>, Arc<VideoIndex>, VideoSource), Error> {
        let (data_path, size, mtime_ns) = g.identity(video)?;
        let id = Arc::new(VideoId {
            // Only a cache key (never opened): the chunk's data file and the id.
            path: std::path::PathBuf::from(format!("{}#{video}", data_path.display())),
            size,
            mtime_ns,
            stream: None,
            decode_table: false,
        });
        let index = self
            .indexes
            .try_get_with(id.clone(), || g.index(video).map(Arc::new))
            .map_err(|e| Error::from((*e).clone()))?;
        let source = VideoSource {
            path: id.path.clone(),
            index: index.clone(),
            gulp: Some(crate::gulp::reader::GulpVideo {
                dataset: g.clone(),
                id: video.into(),
            }),
        };
        Ok((id, index, source))
    }

    pub async fn probe(
        self: &Arc<Self>,
        dataset: &str,
        video: &str,
        stream: Option<u32>,
    ) -> Result<Arc<VideoIndex>, Error> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let _permit = self.index_permit().await?;
        let (this, d, v) = (self.clone(), dataset.to_owned(), video.to_owned());
        let (_, index, _) = blocking(move || this.index_blocking(&d, &v, stream)).await?;
        Ok(index)
    }

    pub async fn get_clips(self: &Arc<Self>, req: ClipsRequest) -> Result<ClipsReply, Error> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.counters.inflight_calls.fetch_add(1, Ordering::Relaxed);
        let _inflight = CallGuard(&self.counters.inflight_calls);
        match self.get_clips_once(&req).await {
            // The damaged video is now indexed by decoding; frame numbers may have changed, so the whole
            // request is resolved again.
            Err(Error::Damaged(_)) => self.get_clips_once(&req).await,
            other => other,
        }
    }

    /// Records that a video's coded data is damaged, so its next index comes from a decode.
    pub(crate) fn mark_damaged(&self, id: &VideoId, detail: &str) {
        let mut plain = id.clone();
        plain.decode_table = false;
        if self.damaged.lock().insert(plain) {
            self.metrics.damaged_files.inc();
            tracing::warn!(path = %id.path.display(), %detail, "decode errors in a cleanly scanned file; indexing it by decoding");
        }
    }

    async fn get_clips_once(self: &Arc<Self>, req: &ClipsRequest) -> Result<ClipsReply, Error> {
        self.validate(req)?;
        let tenant = self.new_tenant(true);
        self.dataset(&req.dataset)?;

        // Index every distinct video once, in parallel on blocking threads. `clip_video[i]` is the
        // position of clip i's video in `distinct`.
        let mut distinct: Vec<(String, Option<u32>)> = Vec::new();
        let mut position: HashMap<(&str, Option<u32>), usize> = HashMap::new();
        let clip_video: Vec<usize> = req
            .clips
            .iter()
            .map(|c| {
                *position.entry((&c.video, c.stream)).or_insert_with(|| {
                    distinct.push((c.video.clone(), c.stream));
                    distinct.len() - 1
                })
            })
            .collect();
        let index_timer = crate::metrics::Timer::start();
        let mut handles = Vec::with_capacity(distinct.len());
        for (video, stream) in &distinct {
            let (this, d, v, s) = (self.clone(), req.dataset.clone(), video.clone(), *stream);
            let permit = self.index_permit().await?;
            handles.push(tokio::task::spawn_blocking(move || {
                let _permit = permit;
                this.index_blocking(&d, &v, s)
            }));
        }
        let mut videos = Vec::with_capacity(handles.len());
        for h in handles {
            videos.push(
                h.await
                    .map_err(|e| Error::Internal(format!("index task failed: {e}")))??,
            );
        }
        index_timer.observe(&self.metrics.index);

        // Positions → frame numbers.
        let mut clip_frames: Vec<Vec<usize>> = Vec::with_capacity(req.clips.len());
        for (c, &vi) in req.clips.iter().zip(&clip_video) {
            let (_, index, _) = &videos[vi];
            clip_frames.push(resolve_positions(&c.video, index, &c.positions)?);
        }

        // Geometry per video, and the common output size.
        let mut geometries = Vec::with_capacity(videos.len());
        for (i, (_, index, _)) in videos.iter().enumerate() {
            geometries.push(geometry_for(
                index,
                &req.transform,
                &distinct[i].0,
                &self.limits,
            )?);
        }
        let (w, h) = display_dims(geometries[clip_video[0]]);
        for (c, &vi) in req.clips.iter().zip(&clip_video) {
            let g = geometries[vi];
            // With a crop, frames of other sizes are fine as long as each holds the crop (batch checks).
            if req.transform.batch.crop.is_none() && display_dims(g) != (w, h) {
                let (w2, h2) = display_dims(g);
                return Err(Error::InvalidArgument(format!(
                    "clips have different frame sizes ({w}x{h} and {w2}x{h2} for {:?}); request an output size",
                    c.video
                )));
            }
        }
        let t = clip_frames[0].len();
        for &vi in &clip_video {
            let (cw, ch) = display_dims(geometries[vi]);
            batch::output_shape(1, t, cw, ch, &req.transform.batch)?;
        }
        let shape = batch::output_shape(req.clips.len(), t, w, h, &req.transform.batch)?;
        let nbytes = shape.iter().product::<u64>() * req.transform.batch.dtype.size() as u64;
        if nbytes > self.limits.max_output_bytes {
            return Err(Error::InvalidArgument(format!(
                "output of {nbytes} bytes (shape {shape:?}) exceeds the limit of {} bytes",
                self.limits.max_output_bytes
            )));
        }

        // Frames, per video.
        // Every video's runs are queued before any is awaited, so the fleet decodes them in parallel.
        let mut wanted: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); videos.len()];
        for (frames, &vi) in clip_frames.iter().zip(&clip_video) {
            wanted[vi].extend(frames.iter().copied());
        }
        let mut fetches = Vec::with_capacity(videos.len());
        for (i, ((id, _, source), wanted)) in videos.iter().zip(wanted).enumerate() {
            fetches.push(self.fetch(id, source, geometries[i], wanted, tenant));
        }
        let mut stats = RequestStats::default();
        let mut per_video: Vec<HashMap<usize, Arc<Frame>>> = Vec::with_capacity(videos.len());
        let fetched_all = futures::future::join_all(fetches).await;
        for (i, fetched) in fetched_all.iter().enumerate() {
            if let Err(Error::Damaged(detail)) = fetched {
                self.mark_damaged(&videos[i].0, detail);
            }
        }
        for fetched in fetched_all {
            let (frames, s) = fetched?;
            stats.add(&s);
            per_video.push(frames);
        }

        // Assemble.
        let mut frames_by_clip: Vec<Vec<Arc<Frame>>> = Vec::with_capacity(req.clips.len());
        let mut metas = Vec::with_capacity(req.clips.len());
        for ((c, frames), &vi) in req.clips.iter().zip(&clip_frames).zip(&clip_video) {
            let index = &videos[vi].1;
            let mut list = Vec::with_capacity(frames.len());
            for k in frames {
                let f = per_video[vi].get(k).cloned().ok_or_else(|| {
                    Error::Internal(format!("frame {k} of {:?} missing after decode", c.video))
                })?;
                list.push(f);
            }
            frames_by_clip.push(list);
            metas.push(ClipMeta {
                video: c.video.clone(),
                frames: frames.iter().map(|&k| k as u64).collect(),
                pts: frames.iter().map(|&k| index.frames[k].pts).collect(),
                pts_seconds: frames
                    .iter()
                    .map(|&k| index.seconds(index.frames[k].pts))
                    .collect(),
                duration_seconds: frames
                    .iter()
                    .map(|&k| index.seconds(index.frames[k].stated_duration))
                    .collect(),
            });
        }
        let spec = req.transform.batch.clone();
        let assembly_timer = crate::metrics::Timer::start();
        let (to_shm, reuse, engine) = (req.shm, req.shm_reuse, self.clone());
        let (shape, data, shm) = blocking(move || {
            if !to_shm {
                let (shape, data) = batch::assemble(&frames_by_clip, &spec)?;
                return Ok((shape, data, None));
            }
            let augs = batch::centre_augs(&frames_by_clip, &spec)?;
            let shape = batch::augmented_shape(&frames_by_clip, &augs, &spec)?;
            let nbytes = batch::shape_bytes(&shape, &spec);
            let (shape, r) = engine.shm.one_shot_with(nbytes, reuse, |buf| {
                Ok::<_, Error>(batch::assemble_augmented_into(
                    &frames_by_clip,
                    &augs,
                    &spec,
                    buf,
                )?)
            })?;
            Ok((shape, Vec::new(), Some(r)))
        })
        .await?;
        assembly_timer.observe(&self.metrics.batch_assembly);
        let nbytes = shape.iter().product::<u64>() * req.transform.batch.dtype.size() as u64;
        Ok(ClipsReply {
            shape,
            data,
            shm,
            nbytes,
            clips: metas,
            stats,
        })
    }

    /// Checks everything that needs no file before any work or allocation.
    fn validate(&self, req: &ClipsRequest) -> Result<(), Error> {
        let limits = &self.limits;
        if req.clips.is_empty() {
            return Err(Error::InvalidArgument("request has no clips".into()));
        }
        if req.clips.len() > limits.max_clips {
            return Err(Error::InvalidArgument(format!(
                "{} clips exceed the limit of {} per request",
                req.clips.len(),
                limits.max_clips
            )));
        }
        let t = req.clips[0].positions.len();
        let mut total: usize = 0;
        for c in &req.clips {
            let n = c.positions.len();
            if n == 0 {
                return Err(Error::InvalidArgument(format!(
                    "clip of {:?} has no frames or times",
                    c.video
                )));
            }
            if n != t {
                return Err(Error::InvalidArgument(format!(
                    "clips differ in length ({t} and {n} frames); every clip of a request has the same length"
                )));
            }
            total = total.saturating_add(n);
        }
        if total > limits.max_frames {
            return Err(Error::InvalidArgument(format!(
                "{total} frames exceed the limit of {} per request",
                limits.max_frames
            )));
        }
        self.validate_transform(&req.transform)
    }

    /// Checks a transform's sizes and normalisation.
    pub(crate) fn validate_transform(&self, transform: &Transform) -> Result<(), Error> {
        let limits = &self.limits;
        let side = |what: &str, v: u32| {
            if v == 0 || v > limits.max_side {
                Err(Error::InvalidArgument(format!(
                    "{what} {v} is outside 1..={}",
                    limits.max_side
                )))
            } else {
                Ok(())
            }
        };
        match transform.resize {
            Resize::Native => {}
            Resize::Exact { width, height } => {
                side("output width", width)?;
                side("output height", height)?;
            }
            Resize::ShortSide(s) => side("short side", s)?,
        }
        let spec = &transform.batch;
        if let Some((cw, ch)) = spec.crop {
            side("crop width", cw)?;
            side("crop height", ch)?;
        }
        if spec.dtype == batch::DType::U8 && (spec.mean != [0.0; 3] || spec.std != [1.0; 3]) {
            return Err(Error::InvalidArgument(
                "mean/std need a float dtype (float16 or float32)".into(),
            ));
        }
        if let Some(s) = spec.std.iter().find(|s| !s.is_finite() || **s == 0.0) {
            return Err(Error::InvalidArgument(format!(
                "std {s} must be finite and non-zero"
            )));
        }
        if let Some(m) = spec.mean.iter().find(|m| !m.is_finite()) {
            return Err(Error::InvalidArgument(format!("mean {m} must be finite")));
        }
        Ok(())
    }

    /// Returns the wanted frames of one video: from the cache, another request's pass, or new GOP runs.
    pub(crate) async fn fetch(
        &self,
        id: &Arc<VideoId>,
        source: &VideoSource,
        geometry: Geometry,
        wanted: BTreeSet<usize>,
        tenant: Tenant,
    ) -> Result<(HashMap<usize, Arc<Frame>>, RequestStats), Error> {
        let mut stats = RequestStats::default();
        let key_of = |frame: usize| FrameKey {
            video: id.clone(),
            frame,
            geometry,
        };
        let lookup_timer = crate::metrics::Timer::start();
        let mut got = HashMap::with_capacity(wanted.len());
        let mut missing = BTreeSet::new();
        for &k in &wanted {
            match self.frames.get(&key_of(k)) {
                Some(f) => {
                    got.insert(k, f);
                }
                None => {
                    missing.insert(k);
                }
            }
        }
        lookup_timer.observe(&self.metrics.cache_lookup);
        let hits = got.len() as u64;
        stats.cache_hits += hits;
        stats.cache_misses += missing.len() as u64;
        self.counters.cache_hits.fetch_add(hits, Ordering::Relaxed);
        self.counters
            .cache_misses
            .fetch_add(missing.len() as u64, Ordering::Relaxed);

        // Round 0 may join passes already in flight; round 1 decodes whatever those did not produce.
        for round in 0..2 {
            if missing.is_empty() {
                break;
            }
            let mut waits = Vec::new();
            for run in plan::gop_runs(&source.index, &missing) {
                let key = RunKey {
                    video: id.clone(),
                    keyframe: run.keyframe,
                    geometry,
                };
                // Join a pass of the same run; while it is still queued, add our frames to it so one
                // pass serves both (a started pass gives what it gives; round 1 decodes the rest).
                let joined = if round == 0 {
                    let found = self.inflight.lock().get(&key).map(|f| {
                        let queued = f.pending.lock().extend(&run.wanted);
                        (f.tx.subscribe(), queued.then(|| f.job.clone()))
                    });
                    found.map(|(rx, queued)| {
                        // Still queued under another tenant: queue a copy under ours too, so the run
                        // starts at whichever turn comes first (fair share holds for joiners).
                        if let Some(mut job) = queued.filter(|j| j.tenant != tenant.id) {
                            job.tenant = tenant.id;
                            let _ = if tenant.bounded {
                                self.fleet.submit(job)
                            } else {
                                self.fleet.submit_unbounded(job)
                            };
                        }
                        rx
                    })
                } else {
                    None
                };
                match joined {
                    Some(rx) => waits.push((rx, false)),
                    None => waits.push((self.start_run(key, source, run, geometry, tenant)?, true)),
                }
            }
            for (mut rx, leader) in waits {
                let outcome = rx
                    .wait_for(|v| v.is_some())
                    .await
                    .map(|v| v.clone())
                    .ok()
                    .flatten();
                match outcome {
                    Some(Ok(out)) => {
                        if leader {
                            stats.frames_decoded += out.decoded;
                            stats.frames_skipped += out.skipped;
                            stats.gop_runs += 1;
                        }
                        for (k, f) in &out.frames {
                            if missing.remove(k) {
                                if !leader {
                                    stats.shared_frames += 1;
                                    self.counters.shared_frames.fetch_add(1, Ordering::Relaxed);
                                }
                                got.insert(*k, f.clone());
                            }
                        }
                    }
                    Some(Err(e)) if leader => return Err(e.into()),
                    None if leader => {
                        return Err(Error::Internal("decode job vanished".into()));
                    }
                    // Another request's pass failed or vanished: decode ourselves next round.
                    _ => {}
                }
            }
        }
        if let Some(k) = missing.first() {
            return Err(Error::Internal(format!(
                "frame {k} of {} still missing after decoding",
                source.path.display()
            )));
        }
        Ok((got, stats))
    }

    /// Registers a run for single flight and queues it on the fleet.
    fn start_run(
        &self,
        key: RunKey,
        source: &VideoSource,
        run: GopRun,
        geometry: Geometry,
        tenant: Tenant,
    ) -> Result<watch::Receiver<Option<RunResult>>, Error> {
        let (tx, rx) = watch::channel(None);
        let tx: RunSender = Arc::new(tx);
        let pending = Arc::new(Mutex::new(PendingRun {
            started: false,
            run,
        }));
        let (cache, inflight, done_tx, done_key) = (
            self.frames.clone(),
            self.inflight.clone(),
            tx.clone(),
            key.clone(),
        );
        let video = key.video.clone();
        let wanted_tx = tx.clone();
        // Stage timings: queued at submit, taken by a decode thread when it asks whether the run is still
        // wanted (just before decoding), done at `on_done`.
        let (metrics, queued_at) = (self.metrics.clone(), std::time::Instant::now());
        let taken_at = Arc::new(std::sync::OnceLock::new());
        let taken = taken_at.clone();
        let job = Job {
            tenant: tenant.id,
            source: source.clone(),
            run: pending,
            geometry,
            on_done: Arc::new(Mutex::new(Some(Box::new(
                move |result: Result<RunOutput, DecodeError>| {
                    let result = result.map(Arc::new);
                    if let Ok(out) = &result {
                        let started = *taken_at.get_or_init(std::time::Instant::now);
                        metrics.observe_run(
                            out.decoded_on,
                            started.saturating_duration_since(queued_at),
                            started.elapsed(),
                            out.decoded,
                            out.frames.len() as u64,
                        );
                        for (k, f) in &out.frames {
                            cache.insert(
                                FrameKey {
                                    video: video.clone(),
                                    frame: *k,
                                    geometry,
                                },
                                f.clone(),
                            );
                        }
                    }
                    {
                        let mut map = inflight.lock();
                        if map
                            .get(&done_key)
                            .is_some_and(|f| Arc::ptr_eq(&f.tx, &done_tx))
                        {
                            map.remove(&done_key);
                        }
                    }
                    done_tx.send_replace(Some(result));
                },
            ) as OnDone))),
            still_wanted: Arc::new(move || {
                taken.get_or_init(std::time::Instant::now);
                wanted_tx.receiver_count() > 0
            }),
        };
        self.inflight.lock().insert(
            key.clone(),
            InFlight {
                tx: tx.clone(),
                pending: job.run.clone(),
                job: job.clone(),
            },
        );
        let submitted = if tenant.bounded {
            self.fleet.submit(job)
        } else {
            self.fleet.submit_unbounded(job)
        };
        if let Err(e) = submitted {
            let mut map = self.inflight.lock();
            if map.get(&key).is_some_and(|f| Arc::ptr_eq(&f.tx, &tx)) {
                map.remove(&key);
            }
            return Err(e.into());
        }
        Ok(rx)
    }
}

/// Decrements a gauge when a call ends, however it ends (cancellation included).
struct CallGuard<'a>(&'a AtomicU64);

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
}

pub(crate) fn resolve_positions(
    video: &str,
    index: &VideoIndex,
    positions: &Positions,
) -> Result<Vec<usize>, Error> {
    let n = index.frame_count();
    let check = |what: String, lookup: Lookup| {
        match lookup {
        Lookup::Frame(k) => Ok(k),
        Lookup::Lost => Err(Error::DataLoss(format!(
            "{what} of {video:?} is missing: the file is truncated ({n} of {} declared frames are decodable)",
            index.declared_frames
        ))),
        Lookup::OutOfRange => Err(Error::OutOfRange(format!(
            "{what} is out of range for {video:?} ({n} frames, {:.3} s from {:.3} s)",
            index.duration_seconds(),
            index.frames.first().map_or(0.0, |f| index.seconds(f.pts))
        ))),
    }
    };
    match positions {
        Positions::Frames(frames) => frames
            .iter()
            .map(|&k| check(format!("frame {k}"), index.lookup_frame(k)))
            .collect(),
        Positions::Times(times) => times
            .iter()
            .map(|&t| check(format!("time {t} s"), index.lookup_time(t)))
            .collect(),
    }
}

/// Output size of a video's frames after rotation and resize, as the decoder must produce them.
pub(crate) fn geometry_for(
    index: &VideoIndex,
    transform: &Transform,
    video: &str,
    limits: &Limits,
) -> Result<Geometry, Error> {
    let rotation = if transform.rotate { index.rotation } else { 0 };
    let (dw, dh) = if rotation % 180 == 90 {
        (index.height, index.width)
    } else {
        (index.width, index.height)
    };
    let (ow, oh) = match transform.resize {
        Resize::Native => (dw, dh),
        Resize::Exact { width, height } => (width, height),
        Resize::ShortSide(s) => {
            let (s64, w64, h64) = (s as u64, dw as u64, dh as u64);
            // Round half up, at least 1 pixel.
            // Computed in u64 and clamped before narrowing, so extreme aspect ratios cannot wrap into a
            // size that passes the check below.
            let narrow = |v: u64| v.clamp(1, u32::MAX as u64) as u32;
            if dw <= dh {
                (s, narrow((h64 * s64 * 2 + w64) / (2 * w64)))
            } else {
                (narrow((w64 * s64 * 2 + h64) / (2 * h64)), s)
            }
        }
    };
    if ow > limits.max_side || oh > limits.max_side || ow == 0 || oh == 0 {
        return Err(Error::InvalidArgument(format!(
            "output size {ow}x{oh} for {video:?} is outside 1..={} per side",
            limits.max_side
        )));
    }
    let (sw, sh) = if rotation % 180 == 90 {
        (oh, ow)
    } else {
        (ow, oh)
    };
    Ok(Geometry {
        scaled_width: sw,
        scaled_height: sh,
        rotation,
    })
}

pub(crate) fn display_dims(g: Geometry) -> (u32, u32) {
    if g.rotation % 180 == 90 {
        (g.scaled_height, g.scaled_width)
    } else {
        (g.scaled_width, g.scaled_height)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CacheConfig, DatasetConfig, DecodeConfig};
    use crate::decode::fake::{fake_value, FakeBackend};

    /// An engine over the committed demo clips whose decoding is the fake backend: the index is real
    /// (nasa_13013.mp4, keyframes 0 and 240 of 390), frame k is a solid image of value fake_value(k).
    fn engine(delay_ms: u64) -> Arc<Engine> {
        engine_with(delay_ms, 2)
    }

    fn engine_with(delay_ms: u64, threads: usize) -> Arc<Engine> {
        let config = Config {
            listen: vec![],
            datasets: vec![DatasetConfig {
                name: "demo".into(),
                root: concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/demo").into(),
                manifest: None,
            }],
            cache: CacheConfig {
                bytes: 64 << 20,
                index_bytes: 1 << 20,
            },
            decode: DecodeConfig {
                threads,
                threads_explicit: true,
                queue: 16,
                threads_per_decoder: 1,
                gpus: crate::config::GpuSpec::None,
                nvdec_sessions: 1,
            },
            limits: Limits::default(),
            shutdown_grace: std::time::Duration::from_secs(1),
            shm_dir: std::env::temp_dir(),
            ops: Default::default(),
        };
        let factory: BackendFactory = Arc::new(move |_slot| {
            Box::new(FakeBackend {
                delay: std::time::Duration::from_millis(delay_ms),
            })
        });
        Engine::new(&config, factory).unwrap()
    }

    fn request(frames: &[u64]) -> ClipsRequest {
        ClipsRequest {
            shm: false,
            shm_reuse: false,
            dataset: "demo".into(),
            clips: vec![ClipRequest {
                video: "nasa_13013.mp4".into(),
                stream: None,
                positions: Positions::Frames(frames.to_vec()),
            }],
            transform: Transform {
                resize: Resize::Exact {
                    width: 8,
                    height: 4,
                },
                ..Transform::default()
            },
        }
    }

    /// A request that joins a run still queued behind another tenant's backlog is served at its own
    /// turn, not at the end of that backlog.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn joined_runs_start_at_the_joiners_turn() {
        let e = engine_with(30, 1);
        let (id, _, source) = e.index_video("demo", "nasa_13013.mp4", None).await.unwrap();
        let a = e.new_tenant(false);
        let b = e.new_tenant(false);
        let geometry = |w: u32| Geometry {
            scaled_width: w,
            scaled_height: 4,
            rotation: 0,
        };
        // Tenant a queues ten runs (one per geometry); the last is the one b will want.
        let mut backlog = Vec::new();
        for w in 1..=10 {
            let (e, id, source) = (e.clone(), id.clone(), source.clone());
            backlog.push(tokio::spawn(async move {
                e.fetch(&id, &source, geometry(w), BTreeSet::from([5]), a)
                    .await
                    .map(|_| ())
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let (got, stats) = e
            .fetch(&id, &source, geometry(10), BTreeSet::from([5]), b)
            .await
            .unwrap();
        assert_eq!(got[&5].data[0], fake_value(5));
        assert_eq!(stats.shared_frames, 1, "b joined a's queued run");
        let runs_done = e.fleet.counters.runs.load(Ordering::Relaxed);
        assert!(
            runs_done <= 4,
            "b waited for {runs_done} runs of a's backlog"
        );
        for h in backlog {
            h.await.unwrap().unwrap();
        }
        assert_eq!(e.fleet.counters.runs.load(Ordering::Relaxed), 10);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn decodes_gop_runs_once_then_serves_from_cache() {
        let e = engine(0);
        let first = e.get_clips(request(&[250, 5, 7])).await.unwrap();
        // Runs: keyframe 0 → 7 (8 frames) and keyframe 240 → 250 (11 frames).
        assert_eq!(first.stats.frames_decoded, 8 + 11);
        assert_eq!(first.stats.gop_runs, 2);
        assert_eq!(first.shape, vec![1, 3, 4, 8, 3]);
        let per = 4 * 8 * 3;
        for (i, k) in [250usize, 5, 7].iter().enumerate() {
            assert!(first.data[i * per..(i + 1) * per]
                .iter()
                .all(|&v| v == fake_value(*k)));
        }
        let second = e.get_clips(request(&[250, 5, 7])).await.unwrap();
        assert_eq!(second.stats.frames_decoded, 0);
        assert_eq!(second.stats.cache_hits, 3);
        assert_eq!(second.data, first.data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_requests_share_one_pass() {
        let e = engine(300);
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let e = e.clone();
            tasks.push(tokio::spawn(
                async move { e.get_clips(request(&[3, 9])).await },
            ));
        }
        let mut decoded = 0;
        let mut shared = 0;
        let mut datas = Vec::new();
        for t in tasks {
            let r = t.await.unwrap().unwrap();
            decoded += r.stats.frames_decoded;
            shared += r.stats.shared_frames;
            datas.push(r.data);
        }
        assert_eq!(decoded, 10, "one pass of keyframe 0 → frame 9");
        assert_eq!(
            shared, 6,
            "three requests took both frames from the one pass"
        );
        assert!(datas.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(e.stats().gop_runs, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_queued_run_grows_to_serve_a_later_request() {
        // One decode thread, busy with GOP 240 while both requests for GOP 0 arrive.
        let e = engine_with(500, 1);
        let blocker = {
            let e = e.clone();
            tokio::spawn(async move { e.get_clips(request(&[250])).await })
        };
        // Wait (not sleep) for each state, so a loaded machine cannot reorder the steps.
        let until = |cond: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !cond() {
                assert!(std::time::Instant::now() < deadline, "state not reached");
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        };
        // The blocker's run has started (left the queue).
        until(&|| {
            let map = e.inflight.lock();
            map.len() == 1 && map.values().all(|f| f.pending.lock().started)
        });
        let first = {
            let e = e.clone();
            tokio::spawn(async move { e.get_clips(request(&[3])).await })
        };
        // The first request's run is registered and queued behind the blocker.
        until(&|| {
            let map = e.inflight.lock();
            map.len() == 2 && map.values().filter(|f| !f.pending.lock().started).count() == 1
        });
        let second = e.get_clips(request(&[9])).await.unwrap();
        let first = first.await.unwrap().unwrap();
        blocker.await.unwrap().unwrap();
        // The queued run 0 → 3 grew to 0 → 9 before it started: one pass served both.
        assert_eq!(first.stats.frames_decoded, 10);
        assert_eq!(second.stats.frames_decoded, 0);
        assert_eq!(second.stats.shared_frames, 1);
        assert!(second.data.iter().all(|&v| v == fake_value(9)));
        assert!(first.data.iter().all(|&v| v == fake_value(3)));
        assert_eq!(e.stats().gop_runs, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refuses_bad_requests_before_work() {
        let e = engine(0);
        let many = vec![0u64; 1_000_000];
        assert!(matches!(
            e.get_clips(request(&many)).await,
            Err(Error::InvalidArgument(_))
        ));
        let mut huge = request(&[0]);
        huge.transform.resize = Resize::Exact {
            width: 100_000,
            height: 100_000,
        };
        assert!(matches!(
            e.get_clips(huge).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            e.get_clips(request(&[390])).await,
            Err(Error::OutOfRange(_))
        ));
        let mut outside = request(&[0]);
        outside.clips[0].video = "../demo/nasa_13013.mp4".into();
        assert!(matches!(
            e.get_clips(outside).await,
            Err(Error::PermissionDenied(_))
        ));
        assert_eq!(e.stats().frames_decoded, 0);
        assert!(e.get_clips(request(&[1])).await.is_ok());
    }
}
