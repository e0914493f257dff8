//! A batch's clip slots: each filled with a readable sample and its decoded frames, and the
//! shared-memory arenas batches are assembled into.
//!
//! Input: the [`Slots`] the schedule gave a batch. Output: [`Filled`]: per shard position the sample
//! that fills it ([`Ready`]: its own, or the next readable one of the shard as a replacement), every
//! clip's frames from the engine's shared fetch, and the skipped-sample reports.
//!
//! Invariants:
//! - A position's own sample is tried first; on failure the next shard samples are tried cyclically,
//!   and only the position's own failure is reported (once per batch). The replacement's clips are
//!   keyed by the slot's sample and the replacement, so they do not depend on what else failed.
//! - A failure that is about this server (UNAVAILABLE, INTERNAL, RESOURCE_EXHAUSTED) ends the stream;
//!   under [`OnError::Fail`] so does a sample's own failure (but not TOO_SHORT: that sample is replaced).
//! - A video found damaged while decoding is marked and tried once more (its next index comes from a
//!   decode) before it counts as failed.
//! - A batch's decoded frames are covered by the stream's window ([`Window`]) before they are fetched.
//! - Arenas: a stream's current arena is the last; a batch larger than its slots moves the stream to a
//!   new one. At a normal end every arena is handed to the registry until the client releases its slots.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::budget::{Reservation, Who};
use crate::cache::VideoId;
use crate::decode::{Frame, Geometry, VideoSource};
use crate::error::{Code, Error};
use crate::index::VideoIndex;
use crate::manifest::Sample;
use crate::request::{frame_bytes, resolve_positions, Positions, RequestStats};
use crate::sample::{self, ClipPositions, Purpose, Rng, SampleError, VideoFacts};
use crate::transport::shm::Arena;

use super::{Context, OnError, Skipped, Slots};

/// Why a sample could not be used.
#[derive(Clone, Debug)]
pub(super) struct Failure {
    error: Error,
    /// Whether it holds whatever positions are asked (index failures, too short), so it may be
    /// remembered for the rest of the stream.
    whole_file: bool,
    /// The clip does not fit the video under the `skip` policy: reported as TOO_SHORT, and under
    /// `on_error = fail` not an error (the sample is replaced).
    pub(super) too_short: bool,
    /// The request is at fault whatever the sample (its sampler gives a video more clips than may be
    /// planned): ends the stream.
    request: bool,
}

impl Failure {
    fn from_error(e: &Error, whole_file: bool) -> Failure {
        Failure {
            error: e.clone(),
            whole_file,
            too_short: false,
            request: false,
        }
    }

    /// The request's own fault, found at a sample: INVALID_ARGUMENT ending the stream.
    fn request(message: String) -> Failure {
        Failure {
            error: Error::InvalidArgument(message),
            whole_file: true,
            too_short: false,
            request: true,
        }
    }

    fn too_short(message: String) -> Failure {
        Failure {
            error: Error::OutOfRange(message),
            whole_file: true,
            too_short: true,
            request: false,
        }
    }

    /// The code a skipped-sample report names: the status code's name, or TOO_SHORT.
    pub(super) fn code(&self) -> &'static str {
        if self.too_short {
            "TOO_SHORT"
        } else {
            self.error.code().name()
        }
    }

    pub(super) fn into_error(self) -> Error {
        self.error
    }

    /// Failures that are about this server or the request, not the file: they end the stream whatever
    /// the policy.
    pub(super) fn is_fatal(&self) -> bool {
        self.request
            || matches!(
                self.error.code(),
                Code::Unavailable | Code::Internal | Code::ResourceExhausted
            )
    }
}

/// One sample made ready for a slot: its video indexed and its clips placed.
#[derive(Clone)]
pub(super) struct Ready {
    /// The sample (position in the dataset's sample list) whose video fills the slot.
    pub(super) sample: usize,
    pub(super) id: Arc<VideoId>,
    pub(super) index: Arc<VideoIndex>,
    pub(super) source: VideoSource,
    pub(super) geometry: Geometry,
    /// Frame numbers of each of the sample's clips (shared by the batches that use them).
    pub(super) clips: Arc<Vec<Vec<usize>>>,
    /// A large plan's bytes in the in-flight budget, held as long as the plan ([`PLAN_CHARGED_FROM`]).
    _plan: Option<Arc<Reservation>>,
}

/// Positions from which a sample's clip plan is charged to the in-flight budget while it is placed and
/// held: below, a plan is a few KiB, bounded by the samples a stream prepares at once. Above, a
/// sampler asking the most positions a sample may plan made each stream hold hundreds of MB that no
/// budget saw.
pub const PLAN_CHARGED_FROM: u64 = 4096;

impl Context {
    /// The current arena, or a new one when there is none or its slots are smaller than `nbytes`; None
    /// when the stream's first arena is more than the shared-memory budgets could ever hold: that
    /// batch and every later one go inline ([`crate::transport::shm::ShmRegistry::inline_instead`]; a
    /// later arena that cannot fit is refused, as clients read a stream's batches all one way).
    pub(super) fn arena_for(
        &self,
        nbytes: usize,
        clips: usize,
    ) -> Result<Option<Arc<Arena>>, Error> {
        let mut arenas = self.arenas.lock();
        if self.inline.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        if let Some(a) = arenas.last().filter(|a| a.slot_bytes() >= nbytes) {
            return Ok(Some(a.clone()));
        }
        let per_clip = nbytes.div_ceil(clips.max(1));
        // Slots: the batches in preparation (prefetch), one in the channel, one on the wire, one the
        // client reads and one it may keep.
        let (slot_bytes, slots) = (per_clip * self.req.batch_size, self.req.prefetch + 3);
        let shm = self.engine.shm();
        let bytes = slot_bytes.saturating_mul(slots);
        if arenas.is_empty() && shm.inline_instead(bytes, &self.peer, "StreamBatches") {
            self.inline
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return Ok(None);
        }
        let a = shm.stream_arena(slot_bytes, slots, &self.peer)?;
        arenas.push(a.clone());
        Ok(Some(a))
    }
}

/// The error ending a stream under [`OnError::Fail`]: DATA_LOSS naming the sample and its own error.
pub(super) fn fail_error(ctx: &Context, sample: usize, f: &Failure) -> Error {
    Error::DataLoss(format!(
        "sample {sample} ({:?}) cannot be read (on_error = fail): {}: {}",
        ctx.samples.video(sample),
        f.code(),
        f.error
    ))
}

pub(super) fn skip_record(ctx: &Context, sample: usize, f: &Failure) -> Skipped {
    Skipped {
        sample: sample as u64,
        video: ctx.samples.video(sample).to_owned(),
        code: f.code().to_owned(),
        message: f.error.to_string(),
    }
}

/// Clips of the sample at a shard position, for plans whose count depends on the video (0 when it
/// cannot be read, with why).
pub(super) async fn count_clips(ctx: &Arc<Context>, pos: usize) -> (u32, Option<Failure>) {
    let sample = ctx.sample_at(pos);
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

/// Large clip plans a stream keeps placed ([`Placed`]).
pub const PLACED_KEEP: usize = 4;

/// The stream's latest large clip plans (at least [`PLAN_CHARGED_FROM`] positions), by sample and clip
/// key, the newest last, at most [`PLACED_KEEP`]. A sample's clips fill consecutive batches (a batch of
/// one clip takes one of a sample's million): placed once, not once a batch (286 ms a batch for a
/// sample of 1,048,576 positions; 16 such streams held the daemon's blocking threads and other
/// clients waited seconds), and once for the batches prepared at the same time (single flight). A
/// kept plan keeps its budget reservation.
#[derive(Default)]
pub(super) struct Placed {
    plans: parking_lot::Mutex<std::collections::VecDeque<(usize, Vec<u64>, PlacedCell)>>,
}

type PlacedCell = Arc<tokio::sync::OnceCell<Ready>>;

impl Placed {
    /// The cell of `sample` placed with `key`: the kept one, or a new one (the oldest dropped).
    pub(super) fn cell(&self, sample: usize, key: &[u64]) -> PlacedCell {
        let mut plans = self.plans.lock();
        if let Some(i) = plans.iter().position(|(s, k, _)| *s == sample && k == key) {
            let entry = plans.remove(i).expect("found");
            let cell = entry.2.clone();
            plans.push_back(entry);
            return cell;
        }
        let cell = PlacedCell::default();
        plans.push_back((sample, key.to_vec(), cell.clone()));
        if plans.len() > PLACED_KEEP {
            plans.pop_front();
        }
        cell
    }
}

/// The most positions placing a sample's clips may produce: the sampler's fixed clip count times its
/// frames per clip, else [`sample::MAX_SAMPLE_POSITIONS`].
fn plan_bound(ctx: &Context) -> u64 {
    ctx.req
        .sampler
        .fixed_clip_count()
        .map_or(sample::MAX_SAMPLE_POSITIONS, |n| {
            (n.max(1) as u64).saturating_mul(ctx.req.sampler.frames_per_clip as u64)
        })
        .min(sample::MAX_SAMPLE_POSITIONS)
}

/// Indexes a sample's video and places its clips (a large plan once for the batches that use it).
async fn ready(ctx: &Arc<Context>, sample: usize, key: Vec<u64>) -> Result<Ready, Failure> {
    if let Some(f) = ctx.bad.lock().get(&sample) {
        return Err(f.clone());
    }
    let result = if plan_bound(ctx) >= PLAN_CHARGED_FROM {
        let cell = ctx.placed.cell(sample, &key);
        cell.get_or_try_init(|| ready_uncached(ctx, sample, key))
            .await
            .cloned()
    } else {
        ready_uncached(ctx, sample, key).await
    };
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
    let s: Sample = ctx.samples.get(sample);
    let (id, index, source) = ctx
        .engine
        .catalog()
        .resolve_for_sampling(&ctx.req.dataset, s.video, None, &ctx.peer.key)
        .await
        .map_err(|e| Failure::from_error(&e, true))?;
    // Placing clips is as large as the sampler makes it (bounded by sample::MAX_SAMPLE_POSITIONS):
    // done on a blocking thread, and charged to the budget first when it may be large.
    let bound = plan_bound(ctx);
    let mut plan = if bound >= PLAN_CHARGED_FROM {
        let who = Who::new(format!(
            "StreamBatches clip plan of sample {sample} (up to {bound} positions)"
        ))
        .client(&ctx.peer);
        Some(
            ctx.engine
                .budget()
                .try_reserve(bound * sample::POSITION_BYTES, who)
                .await
                .map_err(|e| Failure::from_error(&e, false))?,
        )
    } else {
        None
    };
    let (spec, transform, limits) = (
        ctx.req.sampler.clone(),
        ctx.req.transform.clone(),
        ctx.engine.limits().clone(),
    );
    let (video, start, end, idx) = (s.video.to_owned(), s.start, s.end, index.clone());
    let placed = tokio::task::spawn_blocking(move || -> Result<_, Failure> {
        let facts = facts_of(&idx, start, end)?;
        let mut rng = Rng::keyed(Purpose::Clips, &key);
        let clips = sample::clips_for(&spec, &facts, &mut rng).map_err(|e| match e {
            SampleError::TooShort(m) => Failure::too_short(m),
            SampleError::Invalid(m) => Failure::from_error(&Error::InvalidArgument(m), true),
            SampleError::TooMany(m) => {
                Failure::request(format!("sample {sample} ({:?}): {m}", video))
            }
        })?;
        let geometry = transform
            .geometry(&idx, &video, &limits)
            .map_err(|e| Failure::from_error(&e, true))?;
        let mut frames = Vec::with_capacity(clips.len());
        for c in clips {
            let positions = match c {
                ClipPositions::Frames(v) => Positions::Frames(v),
                ClipPositions::Times(v) => Positions::Times(v),
            };
            frames.push(
                resolve_positions(&video, &idx, &positions)
                    .map_err(|e| Failure::from_error(&e, true))?,
            );
        }
        Ok((geometry, frames))
    })
    .await;
    let (geometry, frames) = placed.map_err(|e| {
        Failure::from_error(
            &Error::Internal(format!("placing clips failed: {e}")),
            false,
        )
    })??;
    if let Some(r) = &mut plan {
        let placed: u64 = frames.iter().map(|c| c.len() as u64).sum();
        r.shrink_to(placed.max(1) * sample::POSITION_BYTES);
    }
    Ok(Ready {
        sample,
        id,
        index,
        source,
        geometry,
        clips: Arc::new(frames),
        _plan: plan.map(Arc::new),
    })
}

/// The sampler's view of a video: its frames between a manifest's start and end seconds.
fn facts_of(
    index: &VideoIndex,
    start: Option<f64>,
    end: Option<f64>,
) -> Result<VideoFacts, Failure> {
    let n = index.frame_count();
    let secs = |k: usize| index.seconds(index.frames.at(k).pts);
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
        let bound =
            |b: Option<f64>, none: &str| b.map_or_else(|| none.to_owned(), |s| format!("{s} s"));
        return Err(Failure::too_short(format!(
            "no frame between the manifest's start ({}) and end ({})",
            bound(start, "the video's start"),
            bound(end, "the video's end")
        )));
    }
    let view_end = if hi == n {
        stream_end
    } else {
        index.seconds(index.frames.at(hi).pts)
    };
    Ok(VideoFacts {
        frames: hi - lo,
        first_frame: lo,
        avg_fps,
        begin: begin.max(secs(lo)),
        end: view_end.min(end.unwrap_or(f64::INFINITY)),
    })
}

/// A batch's slots made ready: per shard position the sample filling it and, per (position, sample),
/// the frames its clips need.
pub(super) struct Filled {
    pub(super) ready: HashMap<usize, Ready>,
    pub(super) frames: HashMap<(usize, usize), HashMap<usize, Arc<Frame>>>,
    /// The positions' own samples that could not be used, in the order found.
    pub(super) skipped: Vec<Skipped>,
    pub(super) stats: RequestStats,
}

/// The error of a shard none of whose samples can be used (a slot none can fill, or a counted plan
/// with no clip at all), saying why with the last failure met: OUT_OF_RANGE when every sample was too
/// short for its clips (the sampler's request does not fit this shard's videos), else DATA_LOSS.
pub(super) fn none_readable(ctx: &Context, last: Option<&Skipped>, all_too_short: bool) -> Error {
    let why = last.map_or_else(String::new, |s| {
        format!(
            " (the last tried, {:?}: {}: {})",
            s.video, s.code, s.message
        )
    });
    let what = format!(
        "no sample of this rank's shard of dataset {:?} ({} samples) can be read",
        ctx.req.dataset,
        ctx.shard.len()
    );
    if all_too_short && last.is_some() {
        Error::OutOfRange(format!("{what}: every one is too short for its clips{why}"))
    } else {
        Error::DataLoss(format!("{what}{why}"))
    }
}

/// Fills every slot of a batch with a readable sample and fetches the frames of its clips.
pub(super) async fn fill_slots(ctx: &Arc<Context>, slots: &Slots) -> Result<Filled, Error> {
    // Bytes of the decoded frames this batch holds until it is assembled (all rounds).
    let mut frames_held: u64 = 0;
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
    // The last failure met, and whether every one was a clip that does not fit (for the message when no
    // sample of the shard can fill a slot).
    let mut last: Option<Skipped> = None;
    let mut all_too_short = true;
    loop {
        // Make every unfilled position ready, moving to the next candidate on failure.
        for &p in &positions {
            while !filled.contains_key(&p) {
                let off = offset[&p];
                if off >= shard_len {
                    return Err(none_readable(ctx, last.as_ref(), all_too_short));
                }
                let slot_sample = ctx.sample_at(p);
                let candidate = ctx.sample_at((p + off) % shard_len);
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
                        all_too_short &= f.too_short;
                        last = Some(skip_record(ctx, candidate, &f));
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
        // The decoded frames are held until the batch is assembled: the stream's window covers them
        // before they exist.
        let bytes = wanted
            .values()
            .map(|(r, set)| (set.len() as u64).saturating_mul(frame_bytes(r.geometry)))
            .fold(0, u64::saturating_add);
        frames_held = frames_held.saturating_add(bytes);
        ctx.ensure_window(0, frames_held).await?;
        let keys: Vec<(usize, usize)> = wanted.keys().copied().collect();
        let fetches = keys.iter().map(|k| {
            let (r, set) = &wanted[k];
            ctx.engine.frames().fetch(
                &r.id,
                &r.source,
                r.geometry,
                set.clone(),
                ctx.tenant,
                ctx.req.cache_policy,
                None,
            )
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
                            return Err(fail_error(ctx, ctx.sample_at(p), &f));
                        }
                        skipped.push(skip_record(ctx, ctx.sample_at(p), &f));
                    }
                    *offset.get_mut(&p).unwrap_or(&mut 0) += 1;
                }
            }
        }
    }

    Ok(Filled {
        ready: filled,
        frames,
        skipped,
        stats,
    })
}

/// A stream's reservation against the in-flight budget, and what it covers: `batches_held` outputs
/// of the largest batch seen and `prefetch` batches' decoded frames of the most seen. It only grows, so
/// a stream admitted once is never starved by streams admitted after it.
#[derive(Debug, Default)]
pub(super) struct Window {
    pub(super) reservation: Option<Reservation>,
    pub(super) batch_bytes: u64,
    pub(super) frame_bytes: u64,
}

impl Window {
    fn bytes(&self) -> u64 {
        self.reservation.as_ref().map_or(0, Reservation::bytes)
    }
}

impl Context {
    /// The window's bytes for batches of `batch_bytes` whose decoded frames are `frame_bytes`.
    fn window_need(&self, batch_bytes: u64, frame_bytes: u64) -> u64 {
        batch_bytes
            .saturating_mul(self.footprint.batches_held)
            .saturating_add(frame_bytes.saturating_mul(self.req.prefetch as u64))
    }

    /// Makes the stream's window cover batches of `batch_bytes` output and `frame_bytes` decoded
    /// frames (each at least the largest seen), reserving the difference and waiting at most the
    /// budget's wait; RESOURCE_EXHAUSTED when it does not fit.
    pub(super) async fn ensure_window(
        &self,
        batch_bytes: u64,
        frame_bytes: u64,
    ) -> Result<(), Error> {
        let enough = |w: &Window| {
            w.bytes()
                >= self.window_need(
                    w.batch_bytes.max(batch_bytes),
                    w.frame_bytes.max(frame_bytes),
                )
        };
        if enough(&self.window.lock()) {
            return Ok(());
        }
        // One growth at a time: batches prepared together must not each reserve the same growth.
        let _growing = self.growing.lock().await;
        let (need, have, b, f) = {
            let w = self.window.lock();
            let (b, f) = (
                w.batch_bytes.max(batch_bytes),
                w.frame_bytes.max(frame_bytes),
            );
            (self.window_need(b, f), w.bytes(), b, f)
        };
        if need > have {
            let who = Who::new(super::window_who(&self.req, b, f)).client(&self.peer);
            let more = self.engine.budget().try_reserve(need - have, who).await?;
            let mut w = self.window.lock();
            match w.reservation.as_mut() {
                Some(r) => r.absorb(more),
                None => w.reservation = Some(more),
            }
            w.batch_bytes = b;
            w.frame_bytes = f;
        }
        Ok(())
    }
}

/// A stream sent everything: its arenas go to the registry, kept until the client releases the slots
/// it may still be reading.
pub(super) fn retire_arenas(ctx: &Context) {
    for a in ctx.arenas.lock().drain(..) {
        ctx.engine.shm().retire(a);
    }
}
