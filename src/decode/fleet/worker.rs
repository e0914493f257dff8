//! A decode thread: takes jobs in turn and runs them on its backend, in time slices.
//!
//! Input: the scheduler's jobs, and a run its own slot parked. Output: each run's `on_done`, called once
//! with all its frames or an error.
//!
//! Time slices: a run is given [`SLICE`] at a time ([`crate::decode::cancel::Scope::slice`]); a backend
//! that can continue a run where it stopped returns at the first frame boundary past it with the frames
//! it has ([`RunOutput::yielded`]). Then, once the run has decoded for [`PAUSE_AFTER`], when another
//! client's next queued run costs less than what is left of this one ([`cost`]), this run is parked on
//! the slot ([`SlotState::parked`](super::SlotState)), the thread decodes that one run to its end, and
//! the parked run continues where it stopped (its decoder kept open, so without a seek). So one client's
//! runs of hundreds of frames no longer hold every thread while another client's short run waits for a
//! whole one to end (probe R2: 24 concurrent whole-GOP 720p requests of one client raised another's
//! latency from 19 to 191 ms at the median; 28 ms with pauses). Otherwise a run only returns at each
//! slice and goes on at once. The run it yielded to does not pause in turn, so a thread holds at most
//! one parked run; back, a run decodes for as long as it waited before it pauses again, so however many
//! shorter runs others queue it keeps at least half its thread; the deadline counts only the time a run
//! spends decoding.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Job, LongCount, OnDone, Running, Shared, IDLE_SWEEP};
use crate::decode::sink::Sink;
use crate::decode::{Backend, DecodeError, Geometry, GopRun, RunOutput, VideoSource};
use crate::journal::{FileKey, JournalSlot};

/// How long a run decodes before it may be paused for another client's run: a few frames at 1080p,
/// tens at 340x256; about 0.1% of its time goes to stopping and continuing.
pub(super) const SLICE: Duration = Duration::from_millis(10);

/// How long a run decodes before its first pause: runs shorter than this (most runs of most datasets)
/// never pause. Pausing every run of clients alike only interleaves their decoders: a train workload of
/// four ranks over 250-frame GOPs ran at 0.93 of the floor instead of 1.08 (more CPU per clip, no frame
/// decoded twice).
pub(super) const PAUSE_AFTER: Duration = Duration::from_millis(50);

/// A run taken from the queue: what it decodes, and what its earlier slices gave.
pub(super) struct Task {
    client: u64,
    source: VideoSource,
    /// The run's frames still to come (all its wanted frames until a slice yields).
    run: GopRun,
    geometry: Geometry,
    sink: Option<Arc<Sink>>,
    on_done: Arc<Mutex<Option<OnDone>>>,
    still_wanted: Arc<dyn Fn() -> bool + Send + Sync>,
    /// A long run's count against its client ([`LongCount`]), held while it is parked.
    long: Option<Arc<LongCount>>,
    cancel: Arc<AtomicBool>,
    /// What the run's slices so far gave.
    out: RunOutput,
    /// Time spent decoding it (its deadline counts this, not the time it waited parked).
    spent: Duration,
    /// When it was last parked: once back, it decodes for as long as it waited before it pauses again,
    /// so a run keeps at least half its thread however many shorter runs others queue.
    parked_at: Option<Instant>,
}

impl Task {
    /// Gives a long run's count back to its client (once, whoever asks first).
    fn release(&self, shared: &Shared) {
        if let Some(l) = &self.long {
            l.release(shared);
        }
    }

    /// Fails the run's waiters (a parked run whose thread is gone or stopping).
    pub(super) fn fail(self, shared: &Shared, error: DecodeError) {
        self.release(shared);
        let f = self.on_done.lock().take();
        if let Some(f) = f {
            f(Err(error));
        }
    }

    /// What is left to decode ([`cost`]): from where the decoder stands (the run's keyframe, and the
    /// frames its slices went through) to its last wanted frame. Weighed from its first frame still
    /// wanted, a run for the last frame of a long GOP looked one frame long and was never paused: other
    /// tenants waited behind whole GOPs (probe D: 1-37 s behind runs for frame 11,999 of one GOP).
    fn left(&self) -> u64 {
        let span = match (self.run.wanted.first(), self.run.wanted.last()) {
            (Some(&first), Some(&last)) => {
                let through = self.out.decoded + self.out.skipped;
                last + 1 - (self.run.keyframe + through as usize).min(first)
            }
            _ => 0,
        };
        cost(&self.source, span)
    }

    /// Adds a slice's output: its frames leave the run's wanted frames.
    fn absorb(&mut self, slice: RunOutput) {
        let mut given: Vec<usize> = slice.frames.iter().map(|(k, _)| *k).collect();
        given.extend_from_slice(&slice.sunk);
        given.sort_unstable();
        self.run.wanted.retain(|k| given.binary_search(k).is_err());
        let out = &mut self.out;
        out.frames.extend(slice.frames);
        out.sunk.extend(slice.sunk);
        out.decoded += slice.decoded;
        out.skipped += slice.skipped;
        out.decoded_on = slice.decoded_on;
        out.decoders_opened += slice.decoders_opened;
        out.decoders_reused += slice.decoders_reused;
        out.yielded = slice.yielded;
    }
}

/// What decoding `frames` frames of `source` costs, in pixels decoded: how a paused run and the run it
/// pauses for are weighed.
fn cost(source: &VideoSource, frames: usize) -> u64 {
    frames as u64 * u64::from(source.index.width) * u64::from(source.index.height)
}

/// How [`run`] left its thread.
enum Ran {
    /// The run ended, and its waiters were told.
    Done,
    /// The run was parked on the slot for this job of another client.
    Yielded(Job),
    /// The watchdog abandoned this thread during the run (it failed the run's waiters).
    Abandoned,
}

pub(super) fn worker(shared: Arc<Shared>, slot: usize, mut generation: u64) {
    let counters = shared.counters.clone();
    let mut backend = (shared.factory)(slot);
    let journal = shared.options.journal.as_ref().and_then(|j| match j.slot() {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            tracing::warn!(slot, error = %e, "cannot open a crash-journal slot; this thread records nothing");
            None
        }
    });
    // A job of another client that a run yielded this thread to: it runs next, without slices' pauses.
    let mut interloper: Option<Job> = None;
    loop {
        let (task, may_yield) = match interloper.take() {
            Some(job) => match take(&shared, job) {
                Some(task) => (task, false),
                None => continue,
            },
            None => {
                // Taken in a statement of its own: the slot's lock is not held while waiting for a job.
                let parked = shared.slots[slot].lock().parked.take();
                match parked {
                    Some(task) => (task, true),
                    None => {
                        let job = match shared.scheduler.pop_within(IDLE_SWEEP) {
                            Ok(Some(job)) => job,
                            Ok(None) => break,
                            Err(super::scheduler::Idle) => {
                                backend.idle();
                                continue;
                            }
                        };
                        counters.queued.fetch_sub(1, Ordering::Relaxed);
                        match take(&shared, job) {
                            Some(task) => (task, true),
                            None => continue,
                        }
                    }
                }
            }
        };
        let path = task.source.path.clone();
        let spent = task.spent;
        let started = Instant::now();
        match run(
            &shared,
            slot,
            generation,
            &mut backend,
            journal.as_ref(),
            task,
            may_yield,
        ) {
            Ran::Done => {}
            Ran::Yielded(job) => {
                counters.queued.fetch_sub(1, Ordering::Relaxed);
                counters.paused.fetch_add(1, Ordering::Relaxed);
                interloper = Some(job);
            }
            Ran::Abandoned => {
                counters.stuck.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!(
                    path = %path.display(),
                    seconds = (spent + started.elapsed()).as_secs_f64(),
                    "a decode run abandoned past its deadline returned"
                );
                let mut st = shared.slots[slot].lock();
                if st.vacant && !shared.is_stopping() {
                    // Nobody replaced this thread: it serves its slot again.
                    st.vacant = false;
                    generation = st.generation;
                    *shared.owners.lock() += 1;
                    continue;
                }
                return;
            }
        }
    }
    drop(backend);
    drop(journal);
    *shared.owners.lock() -= 1;
    shared.owners_done.notify_all();
}

/// A job as a run to decode, or None when it is not to run: another copy of it was taken first, or
/// nobody waits for it (its waiters are then told).
fn take(shared: &Shared, job: Job) -> Option<Task> {
    let (taken, run) = {
        let mut pending = job.run.lock();
        (
            std::mem::replace(&mut pending.started, true),
            pending.run.clone(),
        )
    };
    let task = Task {
        client: job.client,
        source: job.source,
        run,
        geometry: job.geometry,
        sink: job.sink,
        on_done: job.on_done,
        still_wanted: job.still_wanted,
        // Taken from the queue, a long job counts against its client: released on every way out.
        long: job.long.then(|| {
            Arc::new(LongCount {
                client: job.client,
                counted: AtomicBool::new(true),
            })
        }),
        cancel: Arc::new(AtomicBool::new(false)),
        out: RunOutput::default(),
        spent: Duration::ZERO,
        parked_at: None,
    };
    // Another copy of this run was taken first, or its waiters were told already.
    if taken || task.on_done.lock().is_none() {
        task.release(shared);
        return None;
    }
    if !(task.still_wanted)() {
        shared.counters.skipped.fetch_add(1, Ordering::Relaxed);
        task.fail(shared, DecodeError::ShuttingDown);
        return None;
    }
    Some(task)
}

/// Decodes `task` slice by slice until it ends, is abandoned, or (with `may_yield`) yields its thread
/// to another client's queued job.
fn run(
    shared: &Shared,
    slot: usize,
    generation: u64,
    backend: &mut Box<dyn Backend>,
    journal: Option<&Arc<JournalSlot>>,
    mut task: Task,
    may_yield: bool,
) -> Ran {
    let counters = &shared.counters;
    if let (Some(j), Some(file)) = (journal, &task.source.file) {
        if let Err(e) = j.enter(&FileKey::of(file), backend.drives_a_device()) {
            crate::journal::warn_unrecorded(&task.source.path, &e);
        }
    }
    // The journal's record of this run ends however the run leaves the thread.
    let leave = || {
        if let Some(j) = journal {
            j.leave();
        }
    };
    // The deadline counts the time spent in earlier slices.
    let resumed = Instant::now();
    let started = resumed.checked_sub(task.spent).unwrap_or(resumed);
    let owed = task
        .parked_at
        .take()
        .map_or(Duration::ZERO, |at| resumed - at);
    shared.slots[slot].lock().running = Some(Running {
        path: task.source.path.clone(),
        started,
        on_done: task.on_done.clone(),
        journal: journal.cloned(),
        cancel: task.cancel.clone(),
        cancelled_at: None,
        progressed: resumed,
        decoded: task.out.decoded,
        still_wanted: task.still_wanted.clone(),
        long: task.long.clone(),
    });
    let result = loop {
        let slice_end = (Instant::now() + SLICE).max(started + PAUSE_AFTER);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // A slice that stops has decoded a frame: none decoded yet is the run's first slice.
            let first = task.out.decoded == 0;
            let _scope =
                crate::decode::cancel::Scope::slice(task.cancel.clone(), Some(slice_end), first);
            backend.decode_run(&task.source, &task.run, task.geometry, task.sink.as_deref())
        }));
        let outcome = match outcome {
            Ok(r) => r,
            Err(_) => {
                counters.panics.fetch_add(1, Ordering::Relaxed);
                tracing::error!(path = %task.source.path.display(), "decoder panicked; replacing backend");
                *backend = (shared.factory)(slot);
                Err(DecodeError::Backend {
                    path: task.source.path.clone(),
                    reason: "decoder panicked".into(),
                })
            }
        };
        {
            let mut st = shared.slots[slot].lock();
            if st.generation != generation {
                // The watchdog abandoned this thread and failed the run's waiters; the result is dropped.
                drop(st);
                leave();
                return Ran::Abandoned;
            }
            if let (Ok(slice), Some(running)) = (&outcome, st.running.as_mut()) {
                if slice.decoded > 0 {
                    running.progressed = Instant::now();
                    running.decoded += slice.decoded;
                }
            }
        }
        let slice = match outcome {
            Ok(slice) => slice,
            Err(e) => break Err(e),
        };
        let yielded = slice.yielded;
        task.absorb(slice);
        if task.run.wanted.is_empty() {
            break Ok(std::mem::take(&mut task.out));
        }
        if !yielded {
            break Err(DecodeError::MissingFrames {
                path: task.source.path.clone(),
                frames: task.run.wanted.clone(),
                detail: " (the decoder ended the run without them)".into(),
            });
        }
        // Another client's next run, when it costs less than what is left of this one: pausing for a
        // longer one would only interleave two long runs.
        if !may_yield || started.elapsed() < PAUSE_AFTER || resumed.elapsed() < owed {
            continue;
        }
        let left = task.left();
        let shorter = |job: &Job| cost(&job.source, job.run.lock().run.span()) < left;
        if let Some(job) = shared.scheduler.pop_other(task.client, &shorter) {
            task.spent = started.elapsed();
            task.parked_at = Some(Instant::now());
            leave();
            let mut st = shared.slots[slot].lock();
            st.running = None;
            st.parked = Some(task);
            return Ran::Yielded(job);
        }
    };
    leave();
    task.release(shared);
    shared.slots[slot].lock().running = None;
    let mut result = result;
    if let Ok(out) = &mut result {
        out.yielded = false;
        out.frames.sort_by_key(|(k, _)| *k);
        out.sunk.sort_unstable();
        counters.runs.fetch_add(1, Ordering::Relaxed);
        for (counter, n) in [
            (&counters.frames_decoded, out.decoded),
            (&counters.frames_skipped, out.skipped),
            (&counters.decoders_opened, out.decoders_opened),
            (&counters.decoders_reused, out.decoders_reused),
        ] {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }
    let f = task.on_done.lock().take();
    if let Some(f) = f {
        f(result);
    }
    Ran::Done
}

#[cfg(test)]
mod tests;
