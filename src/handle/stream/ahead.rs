//! Index builds ahead of a stream's fill: the epoch plan (the shard's sample order) is known when the
//! stream starts, so the frame tables of the next [`AHEAD_SAMPLES`] samples past the fill position are
//! built before the fill asks for them, and a cold dataset's first epoch does not wait on one index build
//! per sample in turn.
//!
//! Input: the stream's [`Context`] and, as the schedule hands out batches, the furthest shard position
//! they reach. Output: nothing but warm catalogue entries (tables in the index cache and the store).
//!
//! Invariants: the builds run on process-wide threads at a low scheduling priority (nice 10), not on
//! the blocking pool nor under the catalogue's index permits, so a fill's own build never queues behind
//! one; a job holds only a weak reference to its stream and is dropped once the stream ends; the queue
//! is bounded ([`QUEUE`]): when it is full, positions are enqueued at a later batch. A build ahead goes
//! through the catalogue like any other (single flight per video, failures remembered, the crash
//! journal), so the fill reuses its result or joins it.
//!
//! One thread builds ahead; a build ahead has no request of its own to fail at `--index-deadline`, and
//! a read the kernel will not interrupt (a hung network mount) keeps its thread for ever. So when every
//! thread has been on its build longer than the deadline, the next batch handed out starts another
//! ([`MAX_THREADS`] at most, stuck ones included): one stuck file no longer ends every stream's builds
//! ahead for the life of the process. (Requests that wait for the stuck build fail at the deadline and
//! mark the file stalled, `catalog::builds`.)

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::Context;

/// Samples past the fill position whose tables are built ahead.
pub(super) const AHEAD_SAMPLES: usize = 16;
/// Threads building tables ahead (for every stream of the process), stuck ones included.
const MAX_THREADS: usize = 4;
/// Builds waiting for those threads.
const QUEUE: usize = 256;

struct Job {
    ctx: Weak<Context>,
    video: String,
}

/// The process's builds ahead: their queue, and when each thread's current build began (None while it
/// waits for a job).
struct Pool {
    tx: SyncSender<Job>,
    rx: Arc<Mutex<Receiver<Job>>>,
    busy: Arc<Mutex<Vec<Option<Instant>>>>,
}

impl Pool {
    /// A pool with its first thread; None if no thread could be started.
    fn new() -> Option<Pool> {
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let pool = Pool {
            tx,
            rx: Arc::new(Mutex::new(rx)),
            busy: Arc::default(),
        };
        pool.start().then_some(pool)
    }

    /// Starts a thread; false if it could not be started.
    fn start(&self) -> bool {
        let mut busy = self.busy.lock();
        let i = busy.len();
        let (rx, slots) = (self.rx.clone(), self.busy.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("vserve-index-ahead-{i}"))
            .spawn(move || {
                crate::handle::lower_priority("an index-ahead thread");
                loop {
                    let job = rx.lock().recv();
                    let Ok(job) = job else { return };
                    slots.lock()[i] = Some(Instant::now());
                    run(job);
                    slots.lock()[i] = None;
                }
            });
        match spawned {
            Ok(_) => {
                busy.push(None);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start an index-ahead thread");
                false
            }
        }
    }

    /// Starts another thread when every one has been on its build for `deadline` or longer.
    fn replace_stuck(&self, deadline: Duration) {
        let stuck = {
            let busy = self.busy.lock();
            busy.len() < MAX_THREADS
                && busy
                    .iter()
                    .all(|b| b.is_some_and(|since| since.elapsed() >= deadline))
        };
        if stuck && self.start() {
            tracing::warn!(
                deadline_s = deadline.as_secs_f64(),
                "every index-ahead thread has been on one build past --index-deadline (a hung read?); \
                 another started"
            );
        }
    }
}

/// The process's pool of builds ahead (started on first use).
fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<Pool>> = OnceLock::new();
    POOL.get_or_init(Pool::new).as_ref()
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
        let (Some(ctx), Some(pool)) = (self.ctx.upgrade(), pool()) else {
            return;
        };
        pool.replace_stuck(ctx.engine.catalog().index_deadline());
        let end = pos.saturating_add(1 + AHEAD_SAMPLES).min(ctx.shard.len());
        self.next = self.next.max(pos + 1);
        while self.next < end {
            let video = ctx.samples.video(ctx.sample_at(self.next)).to_owned();
            match pool.tx.try_send(Job {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Another thread starts only when every thread has been on its build past the deadline, and no
    /// more than [`MAX_THREADS`] in all.
    #[test]
    fn a_thread_is_added_only_when_every_one_is_stuck_past_the_deadline() {
        let pool = Pool::new().expect("a thread");
        let deadline = Duration::from_secs(60);
        let long_ago = Instant::now() - Duration::from_secs(61);
        let threads = |pool: &Pool| pool.busy.lock().len();
        pool.replace_stuck(deadline);
        assert_eq!(threads(&pool), 1, "an idle thread");
        pool.busy.lock()[0] = Some(Instant::now());
        pool.replace_stuck(deadline);
        assert_eq!(threads(&pool), 1, "a build within the deadline");
        pool.busy.lock()[0] = Some(long_ago);
        pool.replace_stuck(deadline);
        assert_eq!(threads(&pool), 2, "the only thread stuck");
        pool.replace_stuck(deadline);
        assert_eq!(threads(&pool), 2, "the new thread is idle");
        for n in 2..=MAX_THREADS {
            pool.busy
                .lock()
                .iter_mut()
                .for_each(|b| *b = Some(long_ago));
            pool.replace_stuck(deadline);
            assert_eq!(threads(&pool), (n + 1).min(MAX_THREADS));
        }
        pool.replace_stuck(deadline);
        assert_eq!(threads(&pool), MAX_THREADS, "at most");
    }
}
