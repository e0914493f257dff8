//! The decode fleet: named OS threads that run a [`Backend`] behind a fair, bounded queue.
//!
//! Input: [`Job`]s (a video, a GOP run, a geometry, the tenant it is for, and what to do with the
//! result). Output: each job's `on_done` is called exactly once, on the decode thread, with the run's
//! frames or an error.
//!
//! Fair share: every tenant (one stream, or one GetClips call) has its own FIFO; a free thread takes the
//! next job of the next tenant in round-robin order, so N tenants with work queued get about 1/N of the
//! threads each, however much each has queued.
//!
//! Decoding never runs on the async runtime. Submitting never blocks: when the queue holds `capacity`
//! jobs, a bounded submission answers [`DecodeError::Overloaded`] at once (streams, whose queued work
//! their prefetch depth already bounds, submit without that check). A job nobody waits for any more is
//! skipped, not decoded. A panic inside a backend fails that job only; the thread gets a fresh backend
//! and keeps serving.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

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

/// A queued GOP run. Clones are the same run: a request that joins a run still queued under another
/// tenant queues a clone under its own, and whichever copy a thread takes first decodes it (the others are
/// dropped when taken), so a joined run waits only as long as its most favoured requester would.
#[derive(Clone)]
pub struct Job {
    /// Who this copy is queued for: the unit of fair share.
    pub tenant: u64,
    pub source: VideoSource,
    /// Shared with the engine's single-flight table, which may extend it until it starts.
    pub run: Arc<parking_lot::Mutex<PendingRun>>,
    pub geometry: Geometry,
    /// Called once with the outcome (taken by the copy that runs).
    pub on_done: Arc<parking_lot::Mutex<Option<OnDone>>>,
    /// False once every requester has gone away; the job is then skipped.
    pub still_wanted: Arc<dyn Fn() -> bool + Send + Sync>,
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

/// The queue: one FIFO per tenant and the round-robin ring of tenants that have jobs.
struct Queues<T> {
    per_tenant: HashMap<u64, VecDeque<T>>,
    ring: VecDeque<u64>,
    len: usize,
    closed: bool,
}

struct Scheduler<T> {
    queues: Mutex<Queues<T>>,
    ready: Condvar,
}

impl<T> Scheduler<T> {
    fn new() -> Self {
        Scheduler {
            queues: Mutex::new(Queues {
                per_tenant: HashMap::new(),
                ring: VecDeque::new(),
                len: 0,
                closed: false,
            }),
            ready: Condvar::new(),
        }
    }

    fn push(&self, tenant: u64, job: T, capacity: Option<usize>) -> Result<(), DecodeError> {
        let mut q = self.queues.lock();
        if q.closed {
            return Err(DecodeError::ShuttingDown);
        }
        if let Some(cap) = capacity {
            if q.len >= cap {
                return Err(DecodeError::Overloaded(cap));
            }
        }
        let fifo = q.per_tenant.entry(tenant).or_default();
        fifo.push_back(job);
        if fifo.len() == 1 {
            q.ring.push_back(tenant);
        }
        q.len += 1;
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// The next job in round-robin order; None once closed and empty.
    fn pop(&self) -> Option<T> {
        let mut q = self.queues.lock();
        loop {
            if let Some(tenant) = q.ring.pop_front() {
                let Some(fifo) = q.per_tenant.get_mut(&tenant) else {
                    continue;
                };
                let job = fifo.pop_front();
                if fifo.is_empty() {
                    q.per_tenant.remove(&tenant);
                } else {
                    q.ring.push_back(tenant);
                }
                if job.is_some() {
                    q.len -= 1;
                    return job;
                }
                continue;
            }
            if q.closed {
                return None;
            }
            self.ready.wait(&mut q);
        }
    }

    fn close(&self) {
        self.queues.lock().closed = true;
        self.ready.notify_all();
    }
}

pub struct Fleet {
    scheduler: Arc<Scheduler<Job>>,
    threads: Vec<JoinHandle<()>>,
    capacity: usize,
    pub counters: Arc<FleetCounters>,
}

/// Makes the backend of decode thread `slot` (0-based; a fleet of CPU and NVDEC threads gives each slot
/// its kind).
pub type BackendFactory = Arc<dyn Fn(usize) -> Box<dyn Backend> + Send + Sync>;

impl Fleet {
    /// Starts `threads` decode threads named `vserve-decode-N` sharing a queue of `capacity` jobs.
    pub fn start(
        threads: usize,
        capacity: usize,
        factory: BackendFactory,
    ) -> std::io::Result<Fleet> {
        let scheduler = Arc::new(Scheduler::new());
        let counters = Arc::new(FleetCounters::default());
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads.max(1) {
            let rx = scheduler.clone();
            let counters = counters.clone();
            let factory = factory.clone();
            let handle = std::thread::Builder::new()
                .name(format!("vserve-decode-{i}"))
                .spawn(move || worker(i, rx, counters, factory))?;
            handles.push(handle);
        }
        Ok(Fleet {
            scheduler,
            threads: handles,
            capacity: capacity.max(1),
            counters,
        })
    }

    /// Queues a job without blocking; a full queue refuses it. A refused job is dropped without calling
    /// its `on_done`.
    pub fn submit(&self, job: Job) -> Result<(), DecodeError> {
        self.push(job, Some(self.capacity))
    }

    /// Queues a job whatever the queue's length: for callers whose queued work is bounded already (a
    /// stream's prefetch).
    pub fn submit_unbounded(&self, job: Job) -> Result<(), DecodeError> {
        self.push(job, None)
    }

    fn push(&self, job: Job, capacity: Option<usize>) -> Result<(), DecodeError> {
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        let pushed = self.scheduler.push(job.tenant, job, capacity);
        if pushed.is_err() {
            self.counters.queued.fetch_sub(1, Ordering::Relaxed);
        }
        pushed
    }

    /// Decode threads started.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    pub fn queue_depth(&self) -> usize {
        self.counters.queued.load(Ordering::Relaxed)
    }

    /// Stops accepting jobs, lets the threads finish what is queued, and joins them.
    pub fn shutdown(&mut self) {
        self.scheduler.close();
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
    slot: usize,
    rx: Arc<Scheduler<Job>>,
    counters: Arc<FleetCounters>,
    factory: BackendFactory,
) {
    let mut backend = factory(slot);
    while let Some(job) = rx.pop() {
        counters.queued.fetch_sub(1, Ordering::Relaxed);
        let Job {
            tenant: _,
            source,
            run,
            geometry,
            on_done,
            still_wanted,
        } = job;
        let run = {
            let mut pending = run.lock();
            if pending.started {
                // Another copy of this run was taken first.
                continue;
            }
            pending.started = true;
            pending.run.clone()
        };
        let Some(on_done) = on_done.lock().take() else {
            continue;
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
                backend = factory(slot);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_take_turns_and_the_bound_applies_to_bounded_pushes() {
        let s = Scheduler::new();
        // Tenant 1 queues six jobs before tenant 2 queues two and tenant 3 one.
        for i in 0..6 {
            s.push(1, (1, i), None).unwrap();
        }
        s.push(2, (2, 0), None).unwrap();
        s.push(2, (2, 1), None).unwrap();
        s.push(3, (3, 0), Some(100)).unwrap();
        assert!(matches!(
            s.push(4, (4, 0), Some(9)),
            Err(DecodeError::Overloaded(9))
        ));
        let order: Vec<(u64, i32)> = std::iter::from_fn(|| {
            let q = s.queues.lock();
            if q.len == 0 {
                return None;
            }
            drop(q);
            s.pop()
        })
        .collect();
        assert_eq!(
            order,
            vec![
                (1, 0),
                (2, 0),
                (3, 0),
                (1, 1),
                (2, 1),
                (1, 2),
                (1, 3),
                (1, 4),
                (1, 5)
            ]
        );
        s.close();
        assert!(s.pop().is_none());
        assert!(matches!(
            s.push(1, (1, 9), None),
            Err(DecodeError::ShuttingDown)
        ));
    }
}
