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
//!   holds only that. Memory is admitted before it is used: a batch's bytes against
//!   `--max-output-bytes`, and the stream's window in the in-flight budget ([`crate::budget`]):
//!   `prefetch + 3` batch outputs and `prefetch` batches' decoded frames, reserved at the start when the
//!   request fixes the batch size and grown (never shrunk) at a batch that needs more; when the producer
//!   ends, three batch outputs of it stay reserved until the reply has written them ([`start_kept`]). What does not fit
//!   ends the request or the stream with RESOURCE_EXHAUSTED (the numbers in the message), never an
//!   allocation failure; a stream once admitted is not starved by later ones.
//! - A panic in the producer ends the stream with INTERNAL, never a clean-looking end. When the reader goes away the channel closes, the producer stops, and queued
//!   decode runs nobody waits for are skipped.
//!
//! Here: the entry ([`start`], validation), the producer and the [`Schedule`] (which clip slots each
//! batch holds). [`slots`]: filling a batch's slots with readable samples (replacements, skip reports)
//! and their frames, and the shared-memory arenas batches go to. [`fill`]: assembling one batch from
//! the decoded frames, inline or into an arena slot.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::budget::{Keep, Who};
use crate::config::Limits;
use crate::engine::Engine;
use crate::error::{blocking, Error};
use crate::frames::Tenant;
use crate::manifest::Samples;
use crate::peer::Peer;
use crate::request::{check_output_bytes, ClipMeta, RequestStats, Resize, Transform};
use crate::sample::{self, AugmentSpec, CropBox, Remainder, SamplerSpec};
use crate::transport::shm::{Arena, ShmRef, SlotHold};
use crate::transport::Transport;

use schedule::Schedule;
use slots::{Failure, Window};

mod ahead;
mod fill;
mod schedule;
mod slots;

/// Batch outputs a finished stream's reply may still hold: two in the channel, one on the wire.
const KEPT_BATCHES: u64 = 3;
#[cfg(test)]
mod tests;

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
    /// Whether the decoded frames may enter the cache.
    pub cache_policy: crate::cache::CachePolicy,
    /// Plan over the sample list with this fingerprint (the current one or one it replaced), not the
    /// current list: every worker and rank of an epoch then plans over the same samples.
    pub samples_fingerprint: Option<u64>,
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
    /// Transport SHM: the slot, given back if the batch is dropped before it is handed to the client
    /// ([`SlotHold::handed`], when the reply is built).
    pub slot: Option<SlotHold>,
    /// The fingerprint of the sample list the epoch is planned over.
    pub samples_fingerprint: u64,
}

/// What a stream keeps between batches.
struct Context {
    engine: Arc<Engine>,
    /// The client the stream's arenas belong to.
    peer: Peer,
    req: StreamRequest,
    samples: Arc<Samples>,
    /// Set when the stream's first shared-memory arena could never fit the budgets: every batch of the
    /// stream then goes inline (a client reads a stream's batches one way: [`Context::arena_for`]).
    inline: std::sync::atomic::AtomicBool,
    /// The rank's samples in reading order ([`Context::sample_at`]), charged to the budget (`order`,
    /// given back when the stream ends: builds ahead may hold the context longer).
    shard: Vec<u32>,
    order: Mutex<Option<crate::budget::Reservation>>,
    tenant: Tenant,
    /// Samples that fail whatever is asked of them (cannot be indexed, too short): not tried again.
    bad: Mutex<HashMap<usize, Failure>>,
    /// The latest large clip plans, placed once for the batches that use them.
    placed: slots::Placed,
    /// Transport SHM: the stream's arenas, the current last (a batch larger than its slots, frames of
    /// another size at native size, moves the stream to a new one). Dropped with the stream when the
    /// client goes away; handed to the registry at a normal end, for the client to release.
    arenas: Mutex<Vec<Arc<Arena>>>,
    footprint: StreamFootprint,
    /// The reply's hold on budget until its bytes are written (the RPC layer's; None in-process).
    keep: Mutex<Option<Keep>>,
    /// The stream's reservation against the in-flight budget: its batch outputs (reserved at the start
    /// when the batch size is known) and decoded frames, grown at a batch that needs more.
    window: Mutex<Window>,
    /// Held while the window grows (across the budget's wait).
    growing: tokio::sync::Mutex<()>,
}

impl Context {
    /// The sample at shard position `pos`.
    fn sample_at(&self, pos: usize) -> usize {
        self.shard[pos] as usize
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

/// What a valid stream request will hold, as far as the request alone says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamFootprint {
    /// Bytes of one full batch, when the output size does not depend on the videos (an exact size, a
    /// crop or a random crop); otherwise known at the first batch.
    pub batch_bytes: Option<u64>,
    /// Batches whose outputs may exist at once: `prefetch` in preparation, one in the channel, one
    /// waiting to enter it, one on the wire (a shared-memory stream's arena has as many slots).
    pub batches_held: u64,
}

impl StreamFootprint {
    /// Output bytes the stream holds at most (its window), when known from the request.
    pub fn window_bytes(&self) -> Option<u64> {
        self.batch_bytes
            .map(|b| b.saturating_mul(self.batches_held))
    }
}

/// Starts a stream: validates the request, admits its window of batches against the in-flight budget,
/// lists the samples and spawns the producer. Errors in the request come back here; errors while
/// streaming come through the channel.
pub async fn start(
    engine: &Arc<Engine>,
    req: StreamRequest,
    peer: Peer,
) -> Result<mpsc::Receiver<Result<StreamBatch, Error>>, Error> {
    start_kept(engine, req, peer, None).await
}

/// [`start`] for a reply that can keep budget until its bytes are written (`keep`, from the RPC
/// layer): when the producer ends, the last batches (in the channel and the transport) stay reserved
/// until written.
pub async fn start_kept(
    engine: &Arc<Engine>,
    req: StreamRequest,
    peer: Peer,
    keep: Option<Keep>,
) -> Result<mpsc::Receiver<Result<StreamBatch, Error>>, Error> {
    engine.catalog().dataset(&req.dataset)?;
    let footprint = validate_request(&req, engine.limits())?;
    // Admitted before any work when the batch size is known; otherwise at the first batch.
    let window = match footprint.window_bytes() {
        Some(bytes) => Some(
            engine
                .budget()
                .try_reserve(
                    bytes,
                    Who::new(window_who(&req, footprint.batch_bytes.unwrap_or(0), 0)).client(&peer),
                )
                .await?,
        ),
        None => None,
    };
    let samples = engine
        .catalog()
        .samples_pinned(&req.dataset, req.samples_fingerprint)
        .await?;
    // The order and the shard are as long as the dataset (4 bytes a sample, the shard held as long as the
    // stream: charged to the budget): made on a blocking thread.
    let n = u32::try_from(samples.len()).map_err(|_| {
        Error::InvalidArgument(format!(
            "dataset {:?} has {} samples: a stream reads at most {}",
            req.dataset,
            samples.len(),
            u32::MAX
        ))
    })?;
    let mut order_bytes = engine
        .budget()
        .try_reserve(
            4 * u64::from(n),
            Who::new(format!(
                "StreamBatches sample order of dataset {:?} ({n} samples)",
                req.dataset
            ))
            .client(&peer),
        )
        .await?;
    let r = req.clone();
    let shard = blocking(move || {
        let order = sample::epoch_order(n, r.seed, r.epoch, r.shuffle);
        let left = usize::try_from(r.start_sample).map_or(order.len(), |s| s.min(order.len()));
        Ok(sample::shard(
            &order[left..],
            r.rank,
            r.world_size,
            r.remainder,
        ))
    })
    .await?;
    order_bytes.shrink_to(4 * shard.len() as u64);
    let prefetch = req.prefetch;
    let tenant = engine.frames().new_tenant(false, peer.key.client_id());
    let ctx = Arc::new(Context {
        engine: engine.clone(),
        peer,
        tenant,
        req,
        samples,
        inline: Default::default(),
        shard,
        order: Mutex::new(Some(order_bytes)),
        bad: Mutex::new(HashMap::new()),
        placed: slots::Placed::default(),
        arenas: Mutex::new(Vec::new()),
        footprint,
        keep: Mutex::new(keep),
        window: Mutex::new(Window {
            reservation: window,
            batch_bytes: footprint.batch_bytes.unwrap_or(0),
            frame_bytes: 0,
        }),
        growing: tokio::sync::Mutex::new(()),
    });
    // Two places, one kept free for the end: a batch goes in only when both are free, so an error can
    // always follow the batch a client has not taken yet (see `produce`).
    let (tx, rx) = mpsc::channel(2);
    engine.streams().active.fetch_add(1, Ordering::Relaxed);
    let guard = ActiveGuard(engine.clone());
    let dataset = ctx.req.dataset.clone();
    tokio::spawn(async move {
        let _guard = guard;
        let closed = tx.clone();
        let work = produce(ctx, tx.clone(), prefetch);
        tokio::select! {
            _ = guarded(work, tx, &dataset) => {}
            // The reader went away: dropping `produce` drops its batches in preparation, and with
            // them every wait on a decode run, so runs nobody else wants are skipped.
            _ = closed.closed() => {}
        }
    });
    Ok(rx)
}

/// What a stream's window reservation is for, in refusals.
fn window_who(req: &StreamRequest, batch_bytes: u64, frame_bytes: u64) -> String {
    let frames = if frame_bytes > 0 {
        format!(
            ", and {} batches' decoded frames of {frame_bytes} bytes",
            req.prefetch
        )
    } else {
        String::new()
    };
    format!(
        "StreamBatches of {:?} ({} batches of {batch_bytes} bytes: prefetch {} + 3{frames})",
        req.dataset,
        req.prefetch as u64 + 3,
        req.prefetch
    )
}

/// `fut`, or `None` when it takes longer than `limit` (zero: no limit).
pub(super) async fn within<T>(
    limit: std::time::Duration,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    if limit.is_zero() {
        return Some(fut.await);
    }
    tokio::time::timeout(limit, fut).await.ok()
}

/// Why an idle stream was ended.
pub(super) fn idle_error(idle: std::time::Duration, what: &str) -> Error {
    Error::DeadlineExceeded(format!(
        "the client {what} for {} s (stream-idle-timeout); the stream is ended",
        idle.as_secs_f64()
    ))
}

/// Runs a stream's producer; a panic in it ends the stream with INTERNAL (and an error log line)
/// instead of looking like a clean end of stream.
async fn guarded(
    work: impl std::future::Future<Output = ()>,
    tx: mpsc::Sender<Result<StreamBatch, Error>>,
    dataset: &str,
) {
    if let Err(panic) = std::panic::AssertUnwindSafe(work).catch_unwind().await {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-text panic".into());
        tracing::error!(dataset, panic = %what, "stream producer panicked; ending the stream with INTERNAL");
        let _ = tx
            .send(Err(Error::Internal(format!(
                "the stream's producer failed ({what}); the stream cannot go on"
            ))))
            .await;
    }
}

/// Checks everything a stream request says by itself, before any work: sampler, batch, ranks and
/// workers, crops, transform, and the batch's bytes when its size is known. Pure (no engine), so it is
/// fuzzed on its own.
pub fn validate_request(req: &StreamRequest, limits: &Limits) -> Result<StreamFootprint, Error> {
    fn invalid<T>(m: String) -> Result<T, Error> {
        Err(Error::InvalidArgument(m))
    }
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
    if req.worker >= req.workers.max(1) {
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
    let batch_bytes = match static_output_size(req) {
        Some((w, h)) => {
            let shape = [
                req.batch_size as u64,
                req.sampler.frames_per_clip as u64,
                h as u64,
                w as u64,
                3,
            ];
            Some(check_output_bytes(
                "a batch",
                &shape,
                req.transform.batch.dtype,
                limits,
            )?)
        }
        None => None,
    };
    Ok(StreamFootprint {
        batch_bytes,
        batches_held: req.prefetch as u64 + 3,
    })
}

/// The clips' output size (width, height) when the request fixes it: a random crop's or random
/// resized crop's size, else the centre crop's, else an exact resize.
fn static_output_size(req: &StreamRequest) -> Option<(u32, u32)> {
    match req.augment.crop {
        Some(sample::CropSpec::Random { width, height })
        | Some(sample::CropSpec::RandomResized { width, height, .. }) => Some((width, height)),
        None => req.transform.batch.crop.or(match req.transform.resize {
            Resize::Exact { width, height } => Some((width, height)),
            Resize::Native | Resize::ShortSide(_) => None,
        }),
    }
}

async fn produce(ctx: Arc<Context>, tx: mpsc::Sender<Result<StreamBatch, Error>>, prefetch: usize) {
    let schedule = match Schedule::new(&ctx).await {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(Err(e)).await;
            return;
        }
    };
    let total = schedule.total_batches();
    let fingerprint = ctx.samples.fingerprint();
    let mut ahead = ahead::Ahead::new(&ctx);
    // The fill starts at position 0: the builds after it start now.
    ahead.advance(0);
    let batches =
        futures::stream::unfold((schedule, ahead), |(mut schedule, mut ahead)| async move {
            let next = schedule.next_batch().await;
            if let Some(Ok((_, slots, _))) = &next {
                if let Some(furthest) = slots.iter().map(|s| s.0).max() {
                    ahead.advance(furthest);
                }
            }
            next.map(|b| (b, (schedule, ahead)))
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
                batch.samples_fingerprint = fingerprint;
                Ok(batch)
            }
        })
        .buffered(prefetch);
    futures::pin_mut!(prepared);
    loop {
        // A batch not ready when the drain begins is not waited for: over shared memory it may wait for
        // a slot the client can no longer release (its ReleaseSlots are refused), which held the stream,
        // and the daemon's exit, for the whole grace period (probe G).
        let item = tokio::select! {
            biased;
            item = prepared.next() => item,
            () = ctx.engine.drained() => {
                let _ = tx.send(Err(Error::ShuttingDown)).await;
                break;
            }
        };
        let Some(item) = item else { break };
        let failed = item.is_err();
        if let Ok(b) = &item {
            let c = ctx.engine.streams();
            c.batches.fetch_add(1, Ordering::Relaxed);
            c.skipped
                .fetch_add(b.skipped.len() as u64, Ordering::Relaxed);
        }
        // The client takes nothing for --stream-idle-timeout: the stream ends, and says why after the
        // batch still waiting for it.
        let idle = ctx.engine.stream_idle();
        let permits = match within(idle, tx.reserve_many(2)).await {
            Some(Ok(p)) => p,
            // The call is gone (its client may still read what it received).
            Some(Err(_)) => break,
            None => {
                tracing::info!(dataset = %ctx.req.dataset, client = %ctx.peer.describe(), idle_s = idle.as_secs_f64(), "stream ended: its client took no batch");
                let _ = tx.try_send(Err(idle_error(idle, "took no batch")));
                break;
            }
        };
        if let Some(permit) = permits.into_iter().next() {
            permit.send(item);
        }
        if failed {
            break;
        }
        if ctx.engine.is_draining() {
            let _ = tx.send(Err(Error::ShuttingDown)).await;
            break;
        }
    }
    // The last batches may still be in the channel or the transport: the reply keeps their bytes
    // (the channel's two places and one on the wire) reserved until it has written them.
    // Taken out, so that a context that outlives the reply (builds ahead) does not hold it longer.
    ctx.order.lock().take();
    let keep = ctx.keep.lock().take();
    if let Some(keep) = keep {
        let mut w = ctx.window.lock();
        if let Some(mut r) = w.reservation.take() {
            r.shrink_to(r.bytes().min(KEPT_BATCHES.saturating_mul(w.batch_bytes)));
            keep.hold(r);
        }
    }
    // However the stream ended (every batch sent, an error, an idle client, a cancelled call), the
    // client may still be reading the slots it was sent: the arenas stay until it releases them or
    // their time to live ends, instead of going (file and all) with the stream.
    slots::retire_arenas(&ctx);
}

/// Fills every slot of a batch (replacing unreadable samples), decodes, augments and assembles it.
async fn prepare(ctx: &Arc<Context>, b: u64, slots: &Slots) -> Result<StreamBatch, Error> {
    let filled = slots::fill_slots(ctx, slots).await?;
    fill::assemble(ctx, b, slots, filled).await
}
