//! Index builds ahead of a stream's fill: the epoch plan (the shard's sample order) is known when the
//! stream starts, so the frame tables of the next [`AHEAD_SAMPLES`] samples past the fill position are
//! built before the fill asks for them, and a cold dataset's first epoch does not wait on one index build
//! per sample in turn.
//!
//! Input: the stream's [`Context`] and, as the schedule hands out batches, the furthest shard position
//! they reach. Output: nothing but warm catalogue entries (tables in the index cache and the store).
//!
//! Invariants: the builds run on [`THREADS`] process-wide threads at a low scheduling priority (nice
//! 10), not on the blocking pool nor under the catalogue's index permits, so a fill's own build never
//! queues behind one; a job holds only a weak reference to its stream and is dropped once the stream
//! ends; the queue is bounded ([`QUEUE`]): when it is full, positions are enqueued at a later batch.
//! A build ahead goes through the catalogue like any other (single flight per video, failures
//! remembered, the crash journal), so the fill reuses its result or joins it.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock, Weak};

use super::Context;

/// Samples past the fill position whose tables are built ahead.
pub(super) const AHEAD_SAMPLES: usize = 16;
/// Low-priority threads building tables ahead (for every stream of the process).
const THREADS: usize = 1;
/// Builds waiting for those threads.
const QUEUE: usize = 256;

struct Job {
    ctx: Weak<Context>,
    video: String,
}

/// The process's queue of builds ahead (started on first use).
fn queue() -> Option<&'static SyncSender<Job>> {
    static QUEUE_TX: OnceLock<Option<SyncSender<Job>>> = OnceLock::new();
    QUEUE_TX
        .get_or_init(|| {
            let (tx, rx) = sync_channel::<Job>(QUEUE);
            let rx = Arc::new(parking_lot::Mutex::new(rx));
            let mut started = 0;
            for i in 0..THREADS {
                let rx = rx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("vserve-index-ahead-{i}"))
                    .spawn(move || {
                        crate::handle::lower_priority("an index-ahead thread");
                        loop {
                            let job = rx.lock().recv();
                            let Ok(job) = job else { return };
                            run(job);
                        }
                    });
                match spawned {
                    Ok(_) => started += 1,
                    Err(e) => tracing::warn!(error = %e, "cannot start an index-ahead thread"),
                }
            }
            (started > 0).then_some(tx)
        })
        .as_ref()
}

fn run(job: Job) {
    // The stream ended: nothing to build for. Otherwise only what the build needs is kept: holding the
    // stream's context through a build (minutes for a long file indexed by decoding, for ever on a hung
    // mount) kept a stream its client had left alive, with its budget, arenas and call.
    let Some((engine, dataset)) = job
        .ctx
        .upgrade()
        .map(|ctx| (ctx.engine.clone(), ctx.req.dataset.clone()))
    else {
        return;
    };
    if let Err(e) = engine.catalog().index_ahead(&dataset, &job.video) {
        // The fill meets the same error (remembered by the catalogue) and reports it with its sample.
        tracing::debug!(dataset = %dataset, video = %job.video, error = %e, "index build ahead failed");
    }
}

/// One stream's builds ahead: how far they have been enqueued.
pub(super) struct Ahead {
    ctx: Weak<Context>,
    /// The next shard position to enqueue.
    next: usize,
}

impl Ahead {
    pub(super) fn new(ctx: &Arc<Context>) -> Ahead {
        Ahead {
            ctx: Arc::downgrade(ctx),
            next: 0,
        }
    }

    /// The schedule reached shard position `pos`: enqueue builds for the positions after it, up to
    /// [`AHEAD_SAMPLES`] past it.
    pub(super) fn advance(&mut self, pos: usize) {
        let (Some(ctx), Some(tx)) = (self.ctx.upgrade(), queue()) else {
            return;
        };
        let end = pos.saturating_add(1 + AHEAD_SAMPLES).min(ctx.shard.len());
        self.next = self.next.max(pos + 1);
        while self.next < end {
            let video = ctx.samples.video(ctx.shard[self.next]).to_owned();
            match tx.try_send(Job {
                ctx: self.ctx.clone(),
                video,
            }) {
                Ok(()) => self.next += 1,
                Err(TrySendError::Full(_)) => return,
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }
}
