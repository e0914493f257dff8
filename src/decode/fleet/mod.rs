//! The decode fleet: named OS threads that run a [`Backend`] behind a fair, bounded queue.
//!
//! Input: [`Job`]s (a video, a GOP run, a geometry, the tenant it is for, and what to do with the
//! result). Output: each job's `on_done` is called exactly once, on the decode thread, with the run's
//! frames or an error.
//!
//! Fair share: every tenant (one stream, or one GetClips call) has its own FIFO; a free thread takes the
//! next job of the next client (process, or address on TCP) in round-robin order, and of that client's
//! next tenant in its own round ([`scheduler`]), so N clients with work queued get about 1/N of the
//! threads each, however many calls each has open and however much each has queued.
//!
//! Decoding never runs on the async runtime. Submitting never blocks: when the queue holds `capacity`
//! jobs, a bounded submission answers [`DecodeError::Overloaded`] at once (streams, whose queued work
//! their prefetch depth already bounds, submit without that check). A job nobody waits for any more is
//! skipped, not decoded. A panic inside a backend fails that job only; the thread gets a fresh backend
//! and keeps serving.
//!
//! Nothing waits forever: every run has a deadline ([`FleetOptions::deadline`]). A watchdog thread
//! (`vserve-watchdog`) fails a run past it with [`DecodeError::Deadline`] (its waiters get
//! DEADLINE_EXCEEDED), abandons its thread (a read stuck in the kernel cannot be interrupted; the thread is
//! left to return on its own, and its late result is dropped) and starts a replacement so the fleet keeps
//! its capacity, up to [`FleetOptions::max_stuck`] abandoned threads at once; beyond that slots stay
//! empty and [`Fleet::health`] says the fleet is unhealthy (`/livez` answers 503), as it does when every
//! slot is stuck. An abandoned thread that returns takes its slot back if nobody holds it. When no slot
//! can take work, queued runs fail with [`DecodeError::Stalled`] instead of waiting.
//!
//! Crash journal: before each run a thread records the file it is about to open in its
//! [`JournalSlot`] (durable when the file changes and the backend drives a device) and marks it clean after, so a file that kills the
//! process inside the decoder is quarantined at the next start ([`crate::journal`]).
//!
//! Shutdown ([`Fleet::shutdown`]) stops the queue, waits until a deadline for the threads to finish, and
//! leaves the ones still stuck behind (they are detached; the process exits without them).

mod scheduler;
mod watchdog;
mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::sink::Sink;
use super::{Backend, DecodeError, Geometry, GopRun, RunOutput, VideoSource};
use crate::journal::{Journal, JournalSlot};
use scheduler::Scheduler;
use watchdog::watchdog;
use worker::{worker, Task};

pub type OnDone = Box<dyn FnOnce(Result<RunOutput, DecodeError>) + Send>;

/// Frames from its keyframe to its last wanted frame from which a run is long ([`Job::long`]): at
/// 1080p about 10-20 s of one core, at 340x256 1-2 s. Real datasets' GOPs are tens to hundreds of
/// frames; a file of one keyframe and 60,000 frames held every decode thread with four requests of one
/// client, and everyone else waited for the runs' deadline.
pub const LONG_RUN_FRAMES: usize = 4096;

/// How long a decode thread waits for a run before it lets go of deleted files it keeps open
/// ([`Backend::idle`]), and again each time as long.
const IDLE_SWEEP: Duration = Duration::from_secs(10);

/// The least time [`Fleet::shutdown`] gives its threads to exit once told to stop (idle ones take
/// microseconds; this bounds the shutdown of a daemon with a thread stuck in a read past its grace).
const IDLE_EXIT: Duration = Duration::from_millis(500);

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
    /// The client (process, or address on TCP) this copy is queued for: the first unit of fair share.
    pub client: u64,
    /// Who this copy is queued for (a stream, a GetClips call): the client's turns go round them.
    pub tenant: u64,
    /// The run decodes [`LONG_RUN_FRAMES`] or more frames from one keyframe (a GOP of thousands of
    /// frames, which nothing can split): a client runs at most all threads but one of these at once.
    pub long: bool,
    pub source: VideoSource,
    /// Shared with the engine's single-flight table, which may extend it until it starts.
    pub run: Arc<parking_lot::Mutex<PendingRun>>,
    pub geometry: Geometry,
    /// Where wanted frames that have a place go instead of into frames (see [`Backend`]).
    pub sink: Option<Arc<Sink>>,
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
    pub decoders_opened: AtomicU64,
    pub decoders_reused: AtomicU64,
    pub skipped: AtomicU64,
    pub panics: AtomicU64,
    /// Runs failed by the watchdog for passing their deadline (each abandoned its thread).
    pub deadline_exceeded: AtomicU64,
    /// Abandoned threads still stuck.
    pub stuck: AtomicUsize,
    /// Runs paused at the end of a time slice for another client's run ([`worker`]).
    pub paused: AtomicU64,
}

/// How the fleet guards against runs that never return, and what it records before each.
#[derive(Clone)]
pub struct FleetOptions {
    /// How long one GOP run may take before its waiters fail and its thread is abandoned.
    pub deadline: Duration,
    /// Abandoned threads (still stuck) the fleet replaces; one more and the fleet stops replacing them
    /// and reports itself unhealthy.
    pub max_stuck: usize,
    /// The crash journal each thread records its file in before a run (None: nothing recorded).
    pub journal: Option<Arc<Journal>>,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            deadline: Duration::from_secs(60),
            max_stuck: 4,
            journal: None,
        }
    }
}

/// One decode slot: the thread that owns it now (by generation) and the run it is in.
#[derive(Default)]
struct SlotState {
    /// The generation of the thread owning the slot; bumped when the watchdog abandons that thread.
    generation: u64,
    /// No thread owns the slot (its thread was abandoned and not replaced).
    vacant: bool,
    running: Option<Running>,
    /// A run of this slot's thread paused for another client's run ([`worker`]): the thread (or its
    /// replacement) continues it next.
    parked: Option<Task>,
}

/// The run a slot's thread is inside.
struct Running {
    path: PathBuf,
    started: Instant,
    on_done: Arc<Mutex<Option<OnDone>>>,
    journal: Option<Arc<JournalSlot>>,
    /// Raised to stop the run between packets ([`crate::decode::cancel`]).
    cancel: Arc<AtomicBool>,
    /// When the watchdog raised `cancel` (None: not yet).
    cancelled_at: Option<Instant>,
    /// When the run last decoded a frame (at the end of a slice; its start or resumption before), and
    /// how many it has decoded: a run past its deadline that decoded a frame in the deadline's last
    /// quarter is slow, not stuck ([`watchdog`]).
    progressed: Instant,
    decoded: u64,
    still_wanted: Arc<dyn Fn() -> bool + Send + Sync>,
    /// A long run's count against its client ([`LongCount`]): released by the thread when the run
    /// returns, or by the watchdog when it abandons the thread, whichever comes first.
    long: Option<Arc<LongCount>>,
}

/// A long job taken from the queue counts against its client's cap of long runs until released, once:
/// by its thread when the job is skipped or its run returns, or by the watchdog when it abandons the
/// thread (a thread stuck in the kernel for good kept its client's count, and with it the client's
/// long runs, forever; so did a skipped job: a copy of a run another tenant's copy ran, or a run
/// nobody wanted any more).
struct LongCount {
    client: u64,
    counted: AtomicBool,
}

impl LongCount {
    fn release(&self, shared: &Shared) {
        if self.counted.swap(false, Ordering::AcqRel) {
            shared.scheduler.long_done(self.client);
        }
    }
}

/// What the decode threads and the watchdog share.
struct Shared {
    scheduler: Scheduler<Job>,
    counters: Arc<FleetCounters>,
    factory: BackendFactory,
    slots: Vec<Mutex<SlotState>>,
    options: FleetOptions,
    /// Threads owning a slot (alive, not abandoned): shutdown waits for them.
    owners: Mutex<usize>,
    owners_done: Condvar,
    /// Set at shutdown: the watchdog stops and nothing is replaced or taken back.
    stopping: Mutex<bool>,
    stop: Condvar,
}

impl Shared {
    fn is_stopping(&self) -> bool {
        *self.stopping.lock()
    }

    /// How long a run asked to stop has to return before its thread counts as stuck and is abandoned:
    /// a quarter of the deadline, 50 ms to 2 s (a run polls between packets; only a read blocked in the
    /// kernel or a decoder inside one enormous packet takes longer).
    fn grace(&self) -> Duration {
        (self.options.deadline / 4).clamp(Duration::from_millis(50), Duration::from_secs(2))
    }

    /// Slots with no thread able to take work: vacant, or inside a run past its deadline that has not
    /// stopped within [`Shared::grace`] of being asked to.
    fn blocked_slots(&self, now: Instant) -> usize {
        let limit = self.options.deadline + self.grace();
        self.slots
            .iter()
            .filter(|s| {
                let st = s.lock();
                st.vacant
                    || st
                        .running
                        .as_ref()
                        .is_some_and(|r| now.duration_since(r.started) >= limit)
            })
            .count()
    }
}

pub struct Fleet {
    shared: Arc<Shared>,
    watchdog: Mutex<Option<JoinHandle<()>>>,
    capacity: usize,
    shut_down: AtomicBool,
    pub counters: Arc<FleetCounters>,
}

/// Makes the backend of decode thread `slot` (0-based; a fleet of CPU and NVDEC threads gives each slot
/// its kind).
pub type BackendFactory = Arc<dyn Fn(usize) -> Box<dyn Backend> + Send + Sync>;

/// How long dropping a fleet that was not shut down waits for its threads.
const DROP_WAIT: Duration = Duration::from_secs(5);

impl Fleet {
    /// Starts `threads` decode threads named `vserve-decode-N` sharing a queue of `capacity` jobs, and
    /// the watchdog.
    pub fn start(
        threads: usize,
        capacity: usize,
        factory: BackendFactory,
        options: FleetOptions,
    ) -> std::io::Result<Fleet> {
        let counters = Arc::new(FleetCounters::default());
        let shared = Arc::new(Shared {
            // One thread always left to other clients' short runs (none with a single thread).
            scheduler: Scheduler::new(threads.saturating_sub(1).max(1)),
            counters: counters.clone(),
            factory,
            slots: (0..threads.max(1))
                .map(|_| Mutex::new(SlotState::default()))
                .collect(),
            options,
            owners: Mutex::new(0),
            owners_done: Condvar::new(),
            stopping: Mutex::new(false),
            stop: Condvar::new(),
        });
        let fleet = Fleet {
            shared: shared.clone(),
            watchdog: Mutex::new(None),
            capacity: capacity.max(1),
            shut_down: AtomicBool::new(false),
            counters,
        };
        for slot in 0..shared.slots.len() {
            spawn_worker(&shared, slot, 0)?;
        }
        let handle = std::thread::Builder::new()
            .name("vserve-watchdog".into())
            .spawn(move || watchdog(shared))?;
        *fleet.watchdog.lock() = Some(handle);
        Ok(fleet)
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
        if self.shared.slots.iter().all(|s| s.lock().vacant) {
            return Err(DecodeError::Stalled(self.stuck_summary()));
        }
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        let pushed = self
            .shared
            .scheduler
            .push(job.client, job.tenant, job.long, job, capacity);
        if pushed.is_err() {
            self.counters.queued.fetch_sub(1, Ordering::Relaxed);
        }
        pushed
    }

    /// Decode slots (each served by one thread at a time).
    pub fn threads(&self) -> usize {
        self.shared.slots.len()
    }

    pub fn queue_depth(&self) -> usize {
        self.counters.queued.load(Ordering::Relaxed)
    }

    /// Decode threads idle with nothing queued for them: how many more runs would start at once now.
    pub fn spare_threads(&self) -> usize {
        let idle = self
            .shared
            .slots
            .iter()
            .filter(|s| {
                let st = s.lock();
                !st.vacant && st.running.is_none()
            })
            .count();
        idle.saturating_sub(self.queue_depth())
    }

    /// Decode slots without a thread: their thread, stuck in a read, was abandoned and not replaced
    /// (beyond `max_stuck`).
    pub fn vacant_slots(&self) -> usize {
        self.shared.slots.iter().filter(|s| s.lock().vacant).count()
    }

    fn stuck_summary(&self) -> String {
        format!(
            "{} decode threads stuck past the {} s deadline (--decode-deadline), {} of {} slots without a thread",
            self.counters.stuck.load(Ordering::Relaxed),
            self.shared.options.deadline.as_secs_f64(),
            self.vacant_slots(),
            self.shared.slots.len()
        )
    }

    /// Whether the fleet can make progress: Err (saying why) when more threads are stuck than it
    /// replaces, or when every slot is stuck.
    pub fn health(&self) -> Result<(), String> {
        let stuck = self.counters.stuck.load(Ordering::Relaxed);
        let max = self.shared.options.max_stuck;
        if stuck > max {
            return Err(format!(
                "{stuck} decode threads are stuck past their deadline, more than the {max} the daemon replaces"
            ));
        }
        let blocked = self.shared.blocked_slots(Instant::now());
        if blocked == self.shared.slots.len() {
            return Err(format!(
                "all {blocked} decode threads are stuck past the {} s deadline",
                self.shared.options.deadline.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// Stops accepting jobs, lets the threads finish what is queued until `deadline`, then leaves the
    /// threads still busy (stuck reads) behind. Queued runs no thread took fail with ShuttingDown. Idle
    /// threads get [`IDLE_EXIT`] to see the stop and exit, however close the deadline: a daemon whose
    /// grace period a client's unread reply used up warned of stuck reads with every thread idle.
    pub fn shutdown(&self, deadline: Instant) {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
        let deadline = deadline.max(Instant::now() + IDLE_EXIT);
        *self.shared.stopping.lock() = true;
        self.shared.stop.notify_all();
        self.shared.scheduler.close();
        let mut owners = self.shared.owners.lock();
        while *owners > 0 {
            if self
                .shared
                .owners_done
                .wait_until(&mut owners, deadline)
                .timed_out()
            {
                break;
            }
        }
        let left = *owners;
        drop(owners);
        if left > 0 {
            tracing::warn!(
                threads = left,
                "decode threads still busy at shutdown (stuck reads cannot be interrupted); leaving them"
            );
        }
        while let Some(job) = self.shared.scheduler.try_pop() {
            self.counters.queued.fetch_sub(1, Ordering::Relaxed);
            fail_queued(job, DecodeError::ShuttingDown);
        }
        // Runs still inside a stuck read, and those parked on its thread: their waiters are told now,
        // not never.
        for slot in &self.shared.slots {
            let (on_done, parked) = {
                let mut st = slot.lock();
                let on_done = st.running.as_ref().and_then(|r| r.on_done.lock().take());
                (on_done, st.parked.take())
            };
            if let Some(f) = on_done {
                f(Err(DecodeError::ShuttingDown));
            }
            if let Some(task) = parked {
                task.fail(&self.shared, DecodeError::ShuttingDown);
            }
        }
        if let Some(handle) = self.watchdog.lock().take() {
            if handle.join().is_err() {
                tracing::error!("decode watchdog panicked");
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.shutdown(Instant::now() + DROP_WAIT);
    }
}

/// Starts the thread of `slot` at `generation`, counted as an owner.
fn spawn_worker(shared: &Arc<Shared>, slot: usize, generation: u64) -> std::io::Result<()> {
    *shared.owners.lock() += 1;
    let name = if generation == 0 {
        format!("vserve-decode-{slot}")
    } else {
        format!("vserve-decode-{slot}.{generation}")
    };
    let s = shared.clone();
    match std::thread::Builder::new()
        .name(name)
        .spawn(move || worker(s, slot, generation))
    {
        // Detached: shutdown waits on the owner count, never on a join that a stuck read would block.
        Ok(_) => Ok(()),
        Err(e) => {
            *shared.owners.lock() -= 1;
            shared.owners_done.notify_all();
            Err(e)
        }
    }
}

/// Fails a queued job no thread will take.
fn fail_queued(job: Job, error: DecodeError) {
    {
        let mut pending = job.run.lock();
        if pending.started {
            return;
        }
        pending.started = true;
    }
    let on_done = job.on_done.lock().take();
    if let Some(f) = on_done {
        f(Err(error));
    }
}

/// A video of `frames` frames from one keyframe, 2x2, for the fleet's tests (its path is never opened).
#[cfg(test)]
fn test_source(name: &str, frames: usize) -> VideoSource {
    VideoSource {
        path: PathBuf::from(name),
        index: Arc::new(crate::index::uniform(frames, &[0], 25)),
        gulp: None,
        file: None,
    }
}

/// What a test job's `on_done` sends: its video's name, and the frames it got or the error.
#[cfg(test)]
type TestOutcome = (String, Result<Vec<usize>, DecodeError>);

/// A job of `client` (its own tenant) for `wanted` of a `frames`-frame test video named `name`
/// ([`test_source`]), at 2x2; its outcome goes to `tx`.
#[cfg(test)]
fn test_job(
    client: u64,
    name: &str,
    frames: usize,
    wanted: Vec<usize>,
    tx: &std::sync::mpsc::Sender<TestOutcome>,
) -> Job {
    let (tx, what) = (tx.clone(), name.to_owned());
    Job {
        client,
        tenant: client,
        long: false,
        source: test_source(name, frames),
        run: Arc::new(Mutex::new(PendingRun {
            started: false,
            run: GopRun {
                keyframe: 0,
                wanted,
            },
        })),
        geometry: Geometry {
            scaled_width: 2,
            scaled_height: 2,
            rotation: 0,
            mirror: false,
            resized: false,
        },
        sink: None,
        on_done: Arc::new(Mutex::new(Some(
            Box::new(move |r: Result<RunOutput, DecodeError>| {
                let _ = tx.send((what, r.map(|o| o.frames.iter().map(|f| f.0).collect())));
            }) as OnDone,
        ))),
        still_wanted: Arc::new(|| true),
    }
}

/// Closed until a test opens it: the test backends' runs of `stuck.mp4` wait on it, as a read from a
/// hung mount.
#[cfg(test)]
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

#[cfg(test)]
impl Gate {
    fn open(&self) {
        *self.open.lock() = true;
        self.cv.notify_all();
    }

    /// Waits until the gate is open.
    fn pass(&self) {
        let mut open = self.open.lock();
        while !*open {
            self.cv.wait(&mut open);
        }
    }
}
