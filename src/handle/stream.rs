//! Streams: one rank's share of one epoch, sampled, decoded, augmented and batched by the server.
//!
//! Input: a [`StreamRequest`]. Output: a channel of [`StreamBatch`]es in order, ending after the last
//! batch (or with the error that ended the stream).
//!
//! sample list (manifest or scan) → epoch order (seed, epoch) → this rank's shard → clip slots in
//! batches → per slot: index, clip positions, augmentation → frames through the engine's shared fetch
//! (cache, single flight, fair fleet) → [`batch::assemble_augmented`].
//!
//! Invariants:
//! - Batch b holds clip slots [b·B, (b+1)·B) of the rank's clip sequence (each shard sample's clips in
//!   order). Everything in it is a function of (sample list, seed, epoch, rank, world size, request
//!   parameters) and the files' contents, so resuming at `start_batch` sends exactly the tail of the
//!   uninterrupted stream.
//! - A sample that cannot be read (or is too short under the `skip` policy) is replaced by the next
//!   readable sample of the shard (cyclically), with the clip positions and augmentation keyed by the
//!   replaced slot; the batch reports it in `skipped`. With [`OnError::Fail`] an unreadable sample ends
//!   the stream with its error instead.
//! - Drain: when the server starts shutting down, a stream sends the batch it has ready and ends with
//!   UNAVAILABLE; the client resumes at the next batch.
//! - Bounded: at most `prefetch` batches are being prepared and one waits in the channel; a slow reader
//!   holds only that. When the reader goes away the channel closes, the producer stops, and queued
//!   decode runs nobody waits for are skipped.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::batch;
use crate::cache::VideoId;
use crate::decode::{Frame, Geometry, VideoSource};
use crate::engine::Engine;
use crate::error::{blocking, Code, Error};
use crate::frames::Tenant;
use crate::index::VideoIndex;
use crate::manifest::{Sample, Samples};
use crate::peer::Peer;
use crate::request::{
    display_dims, resolve_positions, ClipMeta, Positions, RequestStats, Transform,
};
use crate::sample::{
    self, AugmentSpec, ClipAug, ClipPositions, CropBox, Purpose, Remainder, Rng, SampleError,
    SamplerSpec, VideoFacts,
};
use crate::transport::shm::{Arena, ShmRef};
use crate::transport::Transport;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    Skip,
    Fail,
}

#[derive(Clone, Debug)]
pub struct StreamRequest {
    pub dataset: String,
    pub sampler: SamplerSpec,
    pub transform: Transform,
    pub augment: AugmentSpec,
    pub batch_size: usize,
    pub drop_last: bool,
    pub seed: u64,
    pub epoch: u64,
    pub rank: usize,
    pub world_size: usize,
    pub start_batch: u64,
    pub prefetch: usize,
    pub shuffle: bool,
    pub remainder: Remainder,
    pub on_error: OnError,
    pub transport: Transport,
    /// Data-loader worker split: send only batches b with (b - start_batch) mod workers == worker.
    pub worker: u64,
    pub workers: u64,
    /// Resume after a change of world size: the epoch's first `start_sample` samples are left out
    /// before sharding.
    pub start_sample: u64,
}

#[derive(Clone, Debug)]
pub struct StreamClip {
    pub meta: ClipMeta,
    pub label: Option<String>,
    pub label_index: i64,
    /// The slot's own sample (position in the dataset's sample list) and clip number.
    pub sample: u64,
    pub clip: u32,
    /// The sample whose video filled the slot, when the slot's own could not be read.
    pub replaced_by: Option<u64>,
    pub crop: Option<CropBox>,
    pub flipped: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    pub sample: u64,
    pub video: String,
    /// A status code name (DATA_LOSS, NOT_FOUND, ...) or TOO_SHORT.
    pub code: String,
    pub message: String,
}

#[derive(Debug)]
pub struct StreamBatch {
    pub batch: u64,
    /// None when the count depends on the videos (regular timestamps).
    pub batches_total: Option<u64>,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
    pub clips: Vec<StreamClip>,
    pub skipped: Vec<Skipped>,
    pub stats: RequestStats,
    /// Transport SHM: where `data`'s bytes went (`data` is then empty).
    pub shm: Option<ShmRef>,
}

/// Why a sample could not be used.
#[derive(Clone, Debug)]
struct Failure {
    error: Error,
    /// Whether it holds whatever positions are asked (index failures, too short), so it may be
    /// remembered for the rest of the stream.
    whole_file: bool,
    /// The clip does not fit the video under the `skip` policy: reported as TOO_SHORT, and under
    /// `on_error = fail` not an error (the sample is replaced).
    too_short: bool,
}

impl Failure {
    fn from_error(e: &Error, whole_file: bool) -> Failure {
        Failure {
            error: e.clone(),
            whole_file,
            too_short: false,
        }
    }

    fn too_short(message: String) -> Failure {
        Failure {
            error: Error::OutOfRange(message),
            whole_file: true,
            too_short: true,
        }
    }

    /// The code a skipped-sample report names: the status code's name, or TOO_SHORT.
    fn code(&self) -> &'static str {
        if self.too_short {
            "TOO_SHORT"
        } else {
            self.error.code().name()
        }
    }

    fn into_error(self) -> Error {
        self.error
    }

    /// Failures that are about this server, not the file: they end the stream whatever the policy.
    fn is_fatal(&self) -> bool {
        matches!(
            self.error.code(),
            Code::Unavailable | Code::Internal | Code::ResourceExhausted
        )
    }
}

/// One sample made ready for a slot: its video indexed and its clips placed.
#[derive(Clone)]
struct Ready {
    sample: usize,
    id: Arc<VideoId>,
    index: Arc<VideoIndex>,
    source: VideoSource,
    geometry: Geometry,
    /// Frame numbers of each of the sample's clips.
    clips: Vec<Vec<usize>>,
}

/// What a stream keeps between batches.
struct Context {
    engine: Arc<Engine>,
    /// The client the stream's arenas belong to.
    peer: Peer,
    req: StreamRequest,
    samples: Arc<Samples>,
    shard: Vec<usize>,
    tenant: Tenant,
    /// Samples that fail whatever is asked of them (cannot be indexed, too short): not tried again.
    bad: Mutex<HashMap<usize, Failure>>,
    /// Transport SHM: the stream's arenas, the current last (a batch larger than its slots, frames of
    /// another size at native size, moves the stream to a new one). Dropped with the stream when the
    /// client goes away; handed to the registry at a normal end, for the client to release.
    arenas: Mutex<Vec<Arc<Arena>>>,
}

impl Context {
    /// The current arena, or a new one when there is none or its slots are smaller than `nbytes`.
    fn arena_for(&self, nbytes: usize, clips: usize) -> Result<Arc<Arena>, Error> {
        let mut arenas = self.arenas.lock();
        if let Some(a) = arenas.last().filter(|a| a.slot_bytes() >= nbytes) {
            return Ok(a.clone());
        }
        let per_clip = nbytes.div_ceil(clips.max(1));
        // Slots: the batches in preparation (prefetch), one in the channel, one on the wire, one the
        // client reads and one it may keep.
        let a = self.engine.shm().stream_arena(
            per_clip * self.req.batch_size,
            self.req.prefetch + 3,
            &self.peer,
        )?;
        arenas.push(a.clone());
        Ok(a)
    }
}

/// Which clips a batch holds: (shard position, clip number) per slot.
type Slots = Vec<(usize, u32)>;

/// Counts held while a stream runs (the engine's stats read them).
struct ActiveGuard(Arc<Engine>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.streams().active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Starts a stream: validates the request, lists the samples and spawns the producer. Errors in the
/// request come back here; errors while streaming come through the channel.
pub async fn start(
    engine: &Arc<Engine>,
    req: StreamRequest,
    peer: Peer,
) -> Result<mpsc::Receiver<Result<StreamBatch, Error>>, Error> {
    validate(engine, &req)?;
    let samples = engine.catalog().samples(&req.dataset).await?;
    let order = sample::epoch_order(samples.len(), req.seed, req.epoch, req.shuffle);
    let left = usize::try_from(req.start_sample).map_or(order.len(), |s| s.min(order.len()));
    let shard = sample::shard(&order[left..], req.rank, req.world_size, req.remainder);
    let prefetch = req.prefetch;
    let ctx = Arc::new(Context {
        engine: engine.clone(),
        peer,
        tenant: engine.frames().new_tenant(false),
        req,
        samples,
        shard,
        bad: Mutex::new(HashMap::new()),
        arenas: Mutex::new(Vec::new()),
    });
    let (tx, rx) = mpsc::channel(1);
    engine.streams().active.fetch_add(1, Ordering::Relaxed);
    let guard = ActiveGuard(engine.clone());
    tokio::spawn(async move {
        let _guard = guard;
        let closed = tx.clone();
        tokio::select! {
            _ = produce(ctx, tx, prefetch) => {}
            // The reader went away: dropping `produce` drops its batches in preparation, and with
            // them every wait on a decode run, so runs nobody else wants are skipped.
            _ = closed.closed() => {}
        }
    });
    Ok(rx)
}

fn validate(engine: &Engine, req: &StreamRequest) -> Result<(), Error> {
    let limits = engine.limits();
    let invalid = |m: String| Err(Error::InvalidArgument(m));
    engine.catalog().dataset(&req.dataset)?;
    req.sampler
        .validate()
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    if req.batch_size == 0 {
        return invalid("batch_size must be at least 1".into());
    }
    if req.batch_size > limits.max_clips {
        return invalid(format!(
            "batch_size {} exceeds the limit of {} clips per batch",
            req.batch_size, limits.max_clips
        ));
    }
    let frames = req
        .batch_size
        .saturating_mul(req.sampler.frames_per_clip as usize);
    if frames > limits.max_frames {
        return invalid(format!(
            "batch of {frames} frames exceeds the limit of {} per batch",
            limits.max_frames
        ));
    }
    if req.world_size == 0 || req.rank >= req.world_size {
        return invalid(format!(
            "rank {} is not in 0..{} (world_size)",
            req.rank, req.world_size
        ));
    }
    if req.prefetch == 0 || req.prefetch > limits.max_prefetch {
        return invalid(format!(
            "prefetch {} is outside 1..={}",
            req.prefetch, limits.max_prefetch
        ));
    }
    if req.workers > 1 && req.worker >= req.workers {
        return invalid(format!(
            "worker {} is not in 0..{} (num_workers)",
            req.worker, req.workers
        ));
    }
    if req.augment.crop.is_some() && req.transform.batch.crop.is_some() {
        return invalid("give either a centre crop or a random crop, not both".into());
    }
    let side = |what: &str, v: u32| {
        if v == 0 || v > limits.max_side {
            invalid(format!("{what} {v} is outside 1..={}", limits.max_side))
        } else {
            Ok(())
        }
    };
    match req.augment.crop {
        None => {}
        Some(sample::CropSpec::Random { width, height }) => {
            side("random crop width", width)?;
            side("random crop height", height)?;
        }
        Some(sample::CropSpec::RandomResized {
            width,
            height,
            scale,
            ratio,
        }) => {
            side("random resized crop width", width)?;
            side("random resized crop height", height)?;
            if !(scale.0 > 0.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
                return invalid(format!(
                    "scale [{}, {}] must satisfy 0 < min <= max <= 1",
                    scale.0, scale.1
                ));
            }
            if !(ratio.0 > 0.0 && ratio.0 <= ratio.1 && ratio.1.is_finite()) {
                return invalid(format!(
                    "ratio [{}, {}] must satisfy 0 < min <= max",
                    ratio.0, ratio.1
                ));
            }
        }
    }
    req.transform.validate(limits)?;
    Ok(())
}

async fn produce(ctx: Arc<Context>, tx: mpsc::Sender<Result<StreamBatch, Error>>, prefetch: usize) {
    let plan = match Plan::new(&ctx).await {
        Ok(p) => p,
        Err(e) => {
            let _ = tx.send(Err(e)).await;
            return;
        }
    };
    let total = plan.total_batches();
    let batches = futures::stream::unfold(plan, |mut plan| async move {
        let next = plan.next_batch().await;
        next.map(|b| (b, plan))
    });
    let prepared = batches
        .map(|item| {
            let ctx = ctx.clone();
            async move {
                let (b, slots, mut skipped) = item?;
                let mut batch = prepare(&ctx, b, &slots).await?;
                skipped.append(&mut batch.skipped);
                batch.skipped = skipped;
                batch.batches_total = total;
                Ok(batch)
            }
        })
        .buffered(prefetch);
    futures::pin_mut!(prepared);
    while let Some(item) = prepared.next().await {
        let failed = item.is_err();
        if let Ok(b) = &item {
            let c = ctx.engine.streams();
            c.batches.fetch_add(1, Ordering::Relaxed);
            c.skipped
                .fetch_add(b.skipped.len() as u64, Ordering::Relaxed);
        }
        if tx.send(item).await.is_err() || failed {
            return;
        }
        if ctx.engine.is_draining() {
            let _ = tx.send(Err(Error::ShuttingDown)).await;
            break;
        }
    }
    // Sent everything: the client may still be reading the last slots.
    for a in ctx.arenas.lock().drain(..) {
        ctx.engine.shm().retire(a);
    }
}

/// The rank's clip sequence cut into batches.
struct Plan {
    ctx: Arc<Context>,
    /// Clips per sample when fixed; otherwise counted per sample as the plan walks.
    fixed: Option<u32>,
    batch: u64,
    /// Next (shard position, clip) to place, for counted plans.
    pos: usize,
    clip: u32,
    /// Clips of the sample at `pos` (counted plans).
    count_at_pos: Option<u32>,
}

type PlannedBatch = Result<(u64, Slots, Vec<Skipped>), Error>;

impl Plan {
    async fn new(ctx: &Arc<Context>) -> Result<Plan, Error> {
        let mut plan = Plan {
            ctx: ctx.clone(),
            fixed: ctx.req.sampler.fixed_clip_count(),
            batch: 0,
            pos: 0,
            clip: 0,
            count_at_pos: None,
        };
        if plan.fixed.is_some() {
            plan.batch = ctx.req.start_batch;
        } else {
            // Counted plans walk the skipped batches (indexing, no decoding).
            for _ in 0..ctx.req.start_batch {
                if plan.next_any_batch().await.transpose()?.is_none() {
                    break;
                }
            }
        }
        Ok(plan)
    }

    fn total_batches(&self) -> Option<u64> {
        let per = self.fixed? as u64;
        let clips = self.ctx.shard.len() as u64 * per;
        let b = self.ctx.req.batch_size as u64;
        Some(if self.ctx.req.drop_last {
            clips / b
        } else {
            clips.div_ceil(b)
        })
    }

    /// The next batch of this worker's share.
    async fn next_batch(&mut self) -> Option<PlannedBatch> {
        loop {
            let planned = self.next_any_batch().await?;
            let ours = match &planned {
                Ok((b, _, _)) => {
                    let req = &self.ctx.req;
                    (b - req.start_batch) % req.workers.max(1) == req.worker
                }
                Err(_) => true,
            };
            if ours {
                return Some(planned);
            }
        }
    }

    async fn next_any_batch(&mut self) -> Option<PlannedBatch> {
        let b = self.ctx.req.batch_size;
        let batch = self.batch;
        if let Some(per) = self.fixed {
            let total_clips = self.ctx.shard.len() as u64 * per as u64;
            if batch >= self.total_batches().unwrap_or(0) {
                return None;
            }
            let first = batch * b as u64;
            let last = (first + b as u64).min(total_clips);
            self.batch += 1;
            let slots = (first..last)
                .map(|i| ((i / per as u64) as usize, (i % per as u64) as u32))
                .collect();
            return Some(Ok((batch, slots, Vec::new())));
        }
        let mut slots = Vec::with_capacity(b);
        let mut skipped = Vec::new();
        while slots.len() < b && self.pos < self.ctx.shard.len() {
            let count = match self.count_at_pos {
                Some(c) => c,
                None => {
                    let (c, failure) = count_clips(&self.ctx, self.pos).await;
                    if let Some(f) = failure {
                        let sample = self.ctx.shard[self.pos];
                        if f.is_fatal() {
                            return Some(Err(f.into_error()));
                        }
                        if self.ctx.req.on_error == OnError::Fail && !f.too_short {
                            return Some(Err(fail_error(&self.ctx, sample, &f)));
                        }
                        skipped.push(skip_record(&self.ctx, sample, &f));
                    }
                    self.count_at_pos = Some(c);
                    c
                }
            };
            if self.clip < count {
                slots.push((self.pos, self.clip));
                self.clip += 1;
            }
            if self.clip >= count {
                self.pos += 1;
                self.clip = 0;
                self.count_at_pos = None;
            }
        }
        if slots.is_empty() || (self.ctx.req.drop_last && slots.len() < b) {
            return None;
        }
        self.batch += 1;
        Some(Ok((batch, slots, skipped)))
    }
}

/// The error ending a stream under [`OnError::Fail`]: DATA_LOSS naming the sample and its own error.
fn fail_error(ctx: &Context, sample: usize, f: &Failure) -> Error {
    Error::DataLoss(format!(
        "sample {sample} ({:?}) cannot be read (on_error = fail): {}: {}",
        ctx.samples.samples[sample].video,
        f.code(),
        f.error
    ))
}

fn skip_record(ctx: &Context, sample: usize, f: &Failure) -> Skipped {
    Skipped {
        sample: sample as u64,
        video: ctx.samples.samples[sample].video.clone(),
        code: f.code().to_owned(),
        message: f.error.to_string(),
    }
}

/// Clips of the sample at a shard position, for plans whose count depends on the video (0 when it
/// cannot be read, with why).
async fn count_clips(ctx: &Arc<Context>, pos: usize) -> (u32, Option<Failure>) {
    let sample = ctx.shard[pos];
    match ready(ctx, sample, clip_key(ctx, sample, None)).await {
        Ok(r) => (r.clips.len() as u32, None),
        Err(f) => (0, Some(f)),
    }
}

/// The clip generator's key for a slot's sample, and for a replacement filling it.
fn clip_key(ctx: &Context, slot_sample: usize, replacement: Option<usize>) -> Vec<u64> {
    let mut key = vec![ctx.req.seed, ctx.req.epoch, slot_sample as u64];
    if let Some(r) = replacement {
        key.push(r as u64);
    }
    key
}

/// Indexes a sample's video and places its clips.
async fn ready(ctx: &Arc<Context>, sample: usize, key: Vec<u64>) -> Result<Ready, Failure> {
    if let Some(f) = ctx.bad.lock().get(&sample) {
        return Err(f.clone());
    }
    let result = ready_uncached(ctx, sample, key).await;
    if let Err(f) = &result {
        if f.whole_file {
            ctx.bad.lock().insert(sample, f.clone());
        }
    }
    result
}

async fn ready_uncached(
    ctx: &Arc<Context>,
    sample: usize,
    key: Vec<u64>,
) -> Result<Ready, Failure> {
    let s: &Sample = &ctx.samples.samples[sample];
    let (id, index, source) = ctx
        .engine
        .catalog()
        .resolve_for_sampling(&ctx.req.dataset, &s.video, None)
        .await
        .map_err(|e| Failure::from_error(&e, true))?;
    let facts = facts_of(&index, s.start, s.end)?;
    let mut rng = Rng::keyed(Purpose::Clips, &key);
    let clips = sample::clips_for(&ctx.req.sampler, &facts, &mut rng).map_err(|e| match e {
        SampleError::TooShort(m) => Failure::too_short(m),
        SampleError::Invalid(m) => Failure::from_error(&Error::InvalidArgument(m), true),
    })?;
    let geometry = ctx
        .req
        .transform
        .geometry(&index, &s.video, ctx.engine.limits())
        .map_err(|e| Failure::from_error(&e, true))?;
    let mut frames = Vec::with_capacity(clips.len());
    for c in clips {
        let positions = match c {
            ClipPositions::Frames(v) => Positions::Frames(v),
            ClipPositions::Times(v) => Positions::Times(v),
        };
        frames.push(
            resolve_positions(&s.video, &index, &positions)
                .map_err(|e| Failure::from_error(&e, true))?,
        );
    }
    Ok(Ready {
        sample,
        id,
        index,
        source,
        geometry,
        clips: frames,
    })
}

/// The sampler's view of a video: its frames between a manifest's start and end seconds.
fn facts_of(
    index: &VideoIndex,
    start: Option<f64>,
    end: Option<f64>,
) -> Result<VideoFacts, Failure> {
    let n = index.frame_count();
    let secs = |k: usize| index.seconds(index.frames[k].pts);
    let (Some(first), Some(last)) = (index.frames.first(), index.frames.last()) else {
        return Err(Failure::too_short("the video has no frames".into()));
    };
    let begin = index.seconds(first.pts);
    let stream_end = index.seconds(last.pts.saturating_add(last.duration));
    // TorchCodec's average_fps for a scanned stream: frames over the span they cover.
    let avg_fps = if stream_end > begin {
        n as f64 / (stream_end - begin)
    } else {
        index.avg_fps
    };
    let lo = match start {
        Some(s) => (0..n).find(|&k| secs(k) >= s).unwrap_or(n),
        None => 0,
    };
    let hi = match end {
        Some(e) => (0..n).rev().find(|&k| secs(k) < e).map_or(0, |k| k + 1),
        None => n,
    };
    if lo >= hi {
        return Err(Failure::too_short(format!(
            "no frame between the manifest's start {start:?} s and end {end:?} s"
        )));
    }
    let view_end = if hi == n {
        stream_end
    } else {
        index.seconds(index.frames[hi].pts)
    };
    Ok(VideoFacts {
        frames: hi - lo,
        first_frame: lo,
        avg_fps,
        begin: begin.max(secs(lo)),
        end: view_end.min(end.unwrap_or(f64::INFINITY)),
    })
}

/// Fills every slot of a batch, decodes, augments and assembles it.
async fn prepare(ctx: &Arc<Context>, b: u64, slots: &Slots) -> Result<StreamBatch, Error> {
    let shard_len = ctx.shard.len();
    let mut skipped = Vec::new();
    let mut stats = RequestStats::default();
    // Per shard position in this batch: the candidate tried now (an offset from the position) and the
    // sample made ready for it.
    let positions: BTreeSet<usize> = slots.iter().map(|&(p, _)| p).collect();
    let mut offset: HashMap<usize, usize> = positions.iter().map(|&p| (p, 0)).collect();
    let mut filled: HashMap<usize, Ready> = HashMap::new();
    // Positions whose own sample failed to decode once and was re-indexed (damaged files get one more
    // try after re-indexing by decoding).
    let mut retried: HashSet<(usize, usize)> = HashSet::new();
    let mut frames: HashMap<(usize, usize), HashMap<usize, Arc<Frame>>> = HashMap::new();
    loop {
        // Make every unfilled position ready, moving to the next candidate on failure.
        for &p in &positions {
            while !filled.contains_key(&p) {
                let off = offset[&p];
                if off >= shard_len {
                    return Err(Error::DataLoss(format!(
                        "no sample of this rank's shard of dataset {:?} can be read",
                        ctx.req.dataset
                    )));
                }
                let slot_sample = ctx.shard[p];
                let candidate = ctx.shard[(p + off) % shard_len];
                let key = clip_key(ctx, slot_sample, (off > 0).then_some(candidate));
                match ready(ctx, candidate, key).await {
                    Ok(r) => {
                        filled.insert(p, r);
                    }
                    Err(f) => {
                        if f.is_fatal() {
                            return Err(f.into_error());
                        }
                        if off == 0 {
                            if ctx.req.on_error == OnError::Fail && !f.too_short {
                                return Err(fail_error(ctx, slot_sample, &f));
                            }
                            skipped.push(skip_record(ctx, slot_sample, &f));
                        }
                        *offset.get_mut(&p).unwrap_or(&mut 0) += 1;
                    }
                }
            }
        }
        // Fetch the frames of every video not fetched yet, all at once.
        let mut wanted: HashMap<(usize, usize), (Ready, BTreeSet<usize>)> = HashMap::new();
        for &(p, clip) in slots {
            let r = &filled[&p];
            let key = (p, r.sample);
            if frames.contains_key(&key) {
                continue;
            }
            let entry = wanted
                .entry(key)
                .or_insert_with(|| (r.clone(), BTreeSet::new()));
            let clip_frames = &r.clips[clip as usize % r.clips.len()];
            entry.1.extend(clip_frames.iter().copied());
        }
        if wanted.is_empty() {
            break;
        }
        let keys: Vec<(usize, usize)> = wanted.keys().copied().collect();
        let fetches = keys.iter().map(|k| {
            let (r, set) = &wanted[k];
            ctx.engine
                .frames()
                .fetch(&r.id, &r.source, r.geometry, set.clone(), ctx.tenant)
        });
        let results = futures::future::join_all(fetches).await;
        for (key, result) in keys.into_iter().zip(results) {
            let (p, sample) = key;
            match result {
                Ok((got, s)) => {
                    stats.add(&s);
                    frames.insert(key, got);
                }
                Err(e) => {
                    let f = Failure::from_error(&e, false);
                    if f.is_fatal() {
                        return Err(e);
                    }
                    filled.remove(&p);
                    if let Error::Damaged(detail) = &e {
                        ctx.engine
                            .catalog()
                            .mark_damaged(&wanted[&key].0.id, detail);
                        if retried.insert((p, sample)) {
                            // Same candidate again, now indexed by decoding.
                            continue;
                        }
                    }
                    let off = offset[&p];
                    if off == 0 {
                        if ctx.req.on_error == OnError::Fail {
                            return Err(fail_error(ctx, ctx.shard[p], &f));
                        }
                        skipped.push(skip_record(ctx, ctx.shard[p], &f));
                    }
                    *offset.get_mut(&p).unwrap_or(&mut 0) += 1;
                }
            }
        }
    }

    // Assemble in slot order.
    let mut clip_frames = Vec::with_capacity(slots.len());
    let mut augs = Vec::with_capacity(slots.len());
    let mut clips = Vec::with_capacity(slots.len());
    for &(p, clip) in slots {
        let r = &filled[&p];
        let got = &frames[&(p, r.sample)];
        let numbers = &r.clips[clip as usize % r.clips.len()];
        let mut list = Vec::with_capacity(numbers.len());
        for k in numbers {
            list.push(
                got.get(k)
                    .cloned()
                    .ok_or_else(|| Error::Internal(format!("frame {k} missing after decode")))?,
            );
        }
        let slot_sample = ctx.shard[p];
        let (w, h) = display_dims(r.geometry);
        let mut rng = Rng::keyed(
            Purpose::Augment,
            &[ctx.req.seed, ctx.req.epoch, slot_sample as u64, clip as u64],
        );
        let aug = match sample::draw_augment(&ctx.req.augment, w, h, &mut rng) {
            Ok(a) => a,
            Err(e) => return Err(Error::InvalidArgument(e.to_string())),
        };
        let aug = with_centre_crop(aug, &ctx.req.transform, w, h)?;
        let s = &ctx.samples.samples[r.sample];
        clips.push(StreamClip {
            meta: ClipMeta {
                video: s.video.clone(),
                frames: numbers.iter().map(|&k| k as u64).collect(),
                pts: numbers.iter().map(|&k| r.index.frames[k].pts).collect(),
                pts_seconds: numbers
                    .iter()
                    .map(|&k| r.index.seconds(r.index.frames[k].pts))
                    .collect(),
                duration_seconds: numbers
                    .iter()
                    .map(|&k| r.index.seconds(r.index.frames[k].stated_duration))
                    .collect(),
            },
            label: s.label.clone(),
            label_index: s.label_index,
            sample: slot_sample as u64,
            clip,
            replaced_by: (r.sample != slot_sample).then_some(r.sample as u64),
            crop: aug.crop,
            flipped: aug.flip,
        });
        clip_frames.push(list);
        augs.push(aug);
    }
    let spec = ctx.req.transform.batch.clone();
    let (shape, data, shm) = if ctx.req.transport == Transport::Shm {
        // Assembled in place, in a slot of the stream's arena (waiting for the client to free one).
        let nbytes =
            batch::shape_bytes(&batch::augmented_shape(&clip_frames, &augs, &spec)?, &spec);
        let arena = ctx.arena_for(nbytes, clip_frames.len())?;
        let slot = arena.acquire().await;
        let (shape, r) = blocking(move || {
            arena.fill(slot, nbytes, |buf| -> Result<Vec<u64>, Error> {
                Ok(batch::assemble_augmented_into(
                    &clip_frames,
                    &augs,
                    &spec,
                    buf,
                )?)
            })
        })
        .await?;
        ctx.engine
            .metrics()
            .sent(crate::metrics::TransportLabel::SHM, nbytes as u64);
        (shape, Vec::new(), Some(r))
    } else {
        let (shape, data) =
            blocking(move || Ok(batch::assemble_augmented(&clip_frames, &augs, &spec)?)).await?;
        (shape, data, None)
    };
    Ok(StreamBatch {
        batch: b,
        batches_total: None,
        shape,
        data,
        clips,
        skipped,
        stats,
        shm,
    })
}

/// A stream's fixed transform (centre crop, horizontal flip) as a per-clip augmentation.
fn with_centre_crop(mut aug: ClipAug, t: &Transform, w: u32, h: u32) -> Result<ClipAug, Error> {
    if let Some((cw, ch)) = t.batch.crop {
        if cw > w || ch > h {
            return Err(Error::InvalidArgument(format!(
                "crop {cw}x{ch} does not fit in frames of {w}x{h}"
            )));
        }
        aug.crop = Some(CropBox {
            x: (w - cw) / 2,
            y: (h - ch) / 2,
            width: cw,
            height: ch,
        });
    }
    if t.batch.hflip {
        aug.flip = !aug.flip;
    }
    Ok(aug)
}
