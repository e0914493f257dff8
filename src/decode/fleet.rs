//! The decode fleet: named OS threads that run a [`Backend`] behind one bounded queue.
//!
//! Input: [`Job`]s (a video, a GOP run, a geometry, and what to do with the result). Output: each job's
//! `on_done` is called exactly once, on the decode thread, with the run's frames or an error.
//!
//! Decoding never runs on the async runtime. Submitting never blocks: a full queue answers
//! [`DecodeError::Overloaded`] at once. A job nobody waits for any more is skipped, not decoded. A panic
//! inside a backend fails that job only; the thread gets a fresh backend and keeps serving.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{Backend, DecodeError, Geometry, GopRun, RunOutput, VideoSource};

pub type OnDone = Box<dyn FnOnce(Result<RunOutput, DecodeError>) + Send>;

/// A run as queued: until a decode thread takes it (`started`), other requests may add frames to it.
#[derive(Debug)]
pub struct PendingRun {
    pub started: bool,
    pub run: GopRun,
}

impl PendingRun {
    /// Adds `frames` (at or after the run's keyframe) if the run has not started; false once it has.
    pub fn extend(&mut self, frames: &[usize]) -> bool {
        if self.started {
            return false;
        }
        let wanted = &mut self.run.wanted;
        wanted.extend(frames.iter().copied().filter(|&k| k >= self.run.keyframe));
        wanted.sort_unstable();
        wanted.dedup();
        true
    }
}

pub struct Job {
    pub source: VideoSource,
    /// Shared with the engine's single-flight table, which may extend it until it starts.
    pub run: Arc<parking_lot::Mutex<PendingRun>>,
    pub geometry: Geometry,
    /// Called once with the outcome.
    pub on_done: OnDone,
    /// False once every requester has gone away; the job is then skipped.
    pub still_wanted: Box<dyn Fn() -> bool + Send>,
}

/// Counters the fleet keeps (read by the engine for stats).
#[derive(Default, Debug)]
pub struct FleetCounters {
    pub queued: AtomicUsize,
    pub runs: AtomicU64,
    pub frames_decoded: AtomicU64,
    pub frames_skipped: AtomicU64,
    pub skipped: AtomicU64,
    pub panics: AtomicU64,
}

pub struct Fleet {
    tx: Option<crossbeam_channel::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    capacity: usize,
    pub counters: Arc<FleetCounters>,
}

pub type BackendFactory = Arc<dyn Fn() -> Box<dyn Backend> + Send + Sync>;

impl Fleet {
    /// Starts `threads` decode threads named `vserve-decode-N` sharing a queue of `capacity` jobs.
    pub fn start(
        threads: usize,
        capacity: usize,
        factory: BackendFactory,
    ) -> std::io::Result<Fleet> {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(capacity.max(1));
        let counters = Arc::new(FleetCounters::default());
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let counters = counters.clone();
            let factory = factory.clone();
            let handle = std::thread::Builder::new()
                .name(format!("vserve-decode-{i}"))
                .spawn(move || worker(rx, counters, factory))?;
            handles.push(handle);
        }
        Ok(Fleet {
            tx: Some(tx),
            threads: handles,
            capacity,
            counters,
        })
    }

    /// Queues a job without blocking. A refused job is dropped without calling its `on_done`.
    pub fn submit(&self, job: Job) -> Result<(), DecodeError> {
        let Some(tx) = &self.tx else {
            return Err(DecodeError::ShuttingDown);
        };
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.counters.queued.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    crossbeam_channel::TrySendError::Full(_) => {
                        DecodeError::Overloaded(self.capacity)
                    }
                    crossbeam_channel::TrySendError::Disconnected(_) => DecodeError::ShuttingDown,
                })
            }
        }
    }

    pub fn queue_depth(&self) -> usize {
        self.counters.queued.load(Ordering::Relaxed)
    }

    /// Stops accepting jobs, lets the threads finish what is queued, and joins them.
    pub fn shutdown(&mut self) {
        self.tx.take();
        for handle in self.threads.drain(..) {
            if handle.join().is_err() {
                tracing::error!("decode thread panicked outside a job");
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn worker(
    rx: crossbeam_channel::Receiver<Job>,
    counters: Arc<FleetCounters>,
    factory: BackendFactory,
) {
    let mut backend = factory();
    while let Ok(job) = rx.recv() {
        counters.queued.fetch_sub(1, Ordering::Relaxed);
        let Job {
            source,
            run,
            geometry,
            on_done,
            still_wanted,
        } = job;
        let run = {
            let mut pending = run.lock();
            pending.started = true;
            pending.run.clone()
        };
        if !still_wanted() {
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            on_done(Err(DecodeError::ShuttingDown));
            continue;
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            backend.decode_run(&source, &run, geometry)
        }));
        let result = match outcome {
            Ok(r) => r,
            Err(_) => {
                counters.panics.fetch_add(1, Ordering::Relaxed);
                tracing::error!(path = %source.path.display(), "decoder panicked; replacing backend");
                backend = factory();
                Err(DecodeError::Backend {
                    path: source.path.clone(),
                    reason: "decoder panicked".into(),
                })
            }
        };
        if let Ok(out) = &result {
            counters.runs.fetch_add(1, Ordering::Relaxed);
            counters
                .frames_decoded
                .fetch_add(out.decoded, Ordering::Relaxed);
            counters
                .frames_skipped
                .fetch_add(out.skipped, Ordering::Relaxed);
        }
        on_done(result);
    }
}
