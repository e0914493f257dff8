//! The watchdog: one thread (`vserve-watchdog`) that ticks at an eighth of the run deadline (10 to
//! 250 ms). Input: the slots' running runs. Output: a run past its deadline has its waiters failed with
//! [`DecodeError::Deadline`] and is asked to stop between packets ([`crate::decode::cancel`]), as is a
//! run nobody waits for any more; a run that has not stopped within the grace period
//! ([`Shared::grace`]: a read blocked in the kernel) has its thread abandoned (its journal slot marked
//! stalled) and, while fewer than `max_stuck` threads are stuck, a replacement started; when no slot
//! has a thread, queued runs fail with [`DecodeError::Stalled`] instead of waiting.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{fail_queued, spawn_worker, Shared};
use crate::decode::DecodeError;

/// Fails runs past their deadline, abandons and replaces their threads, and fails queued runs when no
/// slot can take them. Ticks at an eighth of the deadline (10 to 250 ms).
pub(super) fn watchdog(shared: Arc<Shared>) {
    let deadline = shared.options.deadline;
    let tick = (deadline / 8).clamp(Duration::from_millis(10), Duration::from_millis(250));
    loop {
        {
            let mut stopping = shared.stopping.lock();
            if !*stopping {
                shared.stop.wait_for(&mut stopping, tick);
            }
            if *stopping {
                return;
            }
        }
        let now = Instant::now();
        let grace = shared.grace();
        for slot in 0..shared.slots.len() {
            if ask_to_stop(&shared, slot, now) {
                continue;
            }
            let mut st = shared.slots[slot].lock();
            // Asked to stop and still inside after the grace period: a read blocked in the kernel.
            let stuck = st
                .running
                .as_ref()
                .and_then(|r| r.cancelled_at)
                .is_some_and(|at| now.duration_since(at) >= grace);
            if !stuck {
                continue;
            }
            let Some(running) = st.running.take() else {
                continue;
            };
            st.generation += 1;
            let stuck = shared.counters.stuck.fetch_add(1, Ordering::Relaxed) + 1;
            {
                // The stuck thread owns the slot no more.
                *shared.owners.lock() -= 1;
                shared.owners_done.notify_all();
            }
            if let Some(j) = &running.journal {
                j.mark_stalled();
            }
            // The thread may never return: its client's long run ends here.
            if let Some(l) = &running.long {
                l.release(&shared);
            }
            let replaced = stuck <= shared.options.max_stuck
                && !shared.is_stopping()
                && match spawn_worker(&shared, slot, st.generation) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::error!(slot, error = %e, "cannot start a replacement decode thread");
                        false
                    }
                };
            st.vacant = !replaced;
            // A run parked on the thread waits for no one when nobody takes the slot.
            let parked = st.vacant.then(|| st.parked.take()).flatten();
            drop(st);
            if let Some(task) = parked {
                task.fail(
                    &shared,
                    DecodeError::Stalled(format!(
                        "the decode thread that paused this run is stuck past the {} s deadline, and no thread replaces it",
                        deadline.as_secs_f64()
                    )),
                );
            }
            tracing::error!(
                path = %running.path.display(),
                deadline_s = deadline.as_secs_f64(),
                stuck,
                replaced,
                "decode run did not stop when asked (a read blocked in the kernel?): thread abandoned"
            );
            let f = running.on_done.lock().take();
            if let Some(f) = f {
                f(Err(DecodeError::Deadline {
                    path: running.path,
                    seconds: deadline.as_secs_f64(),
                    decoding: false,
                    decoded: running.decoded,
                }));
            }
        }
        if shared.slots.iter().all(|s| s.lock().vacant) {
            while let Some(job) = shared.scheduler.try_pop() {
                shared.counters.queued.fetch_sub(1, Ordering::Relaxed);
                fail_queued(
                    job,
                    DecodeError::Stalled(format!(
                        "all {} decode threads are stuck past the {} s deadline",
                        shared.slots.len(),
                        deadline.as_secs_f64()
                    )),
                );
            }
        }
    }
}
/// Raises the stop flag of `slot`'s run when it is past its deadline (its waiters are failed with
/// [`DecodeError::Deadline`] at once) or when nobody waits for it any more. True when this tick asked
/// (the grace period starts now).
fn ask_to_stop(shared: &Shared, slot: usize, now: Instant) -> bool {
    let deadline = shared.options.deadline;
    let (overdue, still_wanted) = {
        let st = shared.slots[slot].lock();
        match st.running.as_ref() {
            Some(r) if r.cancelled_at.is_none() => (
                now.duration_since(r.started) >= deadline,
                r.still_wanted.clone(),
            ),
            _ => return false,
        }
    };
    // Outside the slot's lock: the engine's check takes its own locks.
    if !overdue && still_wanted() {
        return false;
    }
    let mut st = shared.slots[slot].lock();
    let Some(running) = st.running.as_mut().filter(|r| r.cancelled_at.is_none()) else {
        return false; // the run ended meanwhile
    };
    running.cancel.store(true, Ordering::Relaxed);
    running.cancelled_at = Some(now);
    let path = running.path.clone();
    let seconds = now.duration_since(running.started).as_secs_f64();
    // A frame decoded in the deadline's last quarter: slow (frames far from their keyframe, a loaded
    // host), not stuck; the file stays served.
    let decoding = now.duration_since(running.progressed) < deadline / 4;
    let decoded = running.decoded;
    let on_done = overdue.then(|| running.on_done.clone());
    drop(st);
    if let Some(on_done) = on_done {
        shared
            .counters
            .deadline_exceeded
            .fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            path = %path.display(),
            deadline_s = deadline.as_secs_f64(),
            decoding,
            decoded,
            "decode run past its deadline: waiters failed, run asked to stop"
        );
        let f = on_done.lock().take();
        if let Some(f) = f {
            f(Err(DecodeError::Deadline {
                path,
                seconds: deadline.as_secs_f64(),
                decoding,
                decoded,
            }));
        }
    } else {
        tracing::info!(path = %path.display(), seconds, "nobody waits for this decode run any more: asked to stop");
    }
    true
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::super::*;

    use crate::decode::fake::FakeBackend;

    /// The fake backend, except that a run of `stuck.mp4` blocks until the gate opens; `device`: what
    /// it says of driving a device.
    struct Stalling {
        gate: Arc<Gate>,
        device: bool,
        fake: FakeBackend,
    }

    impl Backend for Stalling {
        fn decode_run(
            &mut self,
            source: &VideoSource,
            run: &GopRun,
            geometry: Geometry,
            sink: Option<&crate::decode::sink::Sink>,
        ) -> Result<RunOutput, DecodeError> {
            if source.path == std::path::Path::new("stuck.mp4") {
                self.gate.pass();
            }
            if source.path == std::path::Path::new("long.mp4") {
                // A run that decodes for a long time, polling its stop flag between packets.
                while !crate::decode::cancel::requested() {
                    std::thread::sleep(Duration::from_millis(2));
                }
                return Err(DecodeError::Cancelled {
                    path: source.path.clone(),
                });
            }
            if source.path == std::path::Path::new("slow.mp4") {
                // A run that decodes a frame every slice and never reaches the frames wanted.
                if crate::decode::cancel::requested() {
                    return Err(DecodeError::Cancelled {
                        path: source.path.clone(),
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
                return Ok(RunOutput {
                    decoded: 1,
                    yielded: true,
                    ..Default::default()
                });
            }
            self.fake.decode_run(source, run, geometry, sink)
        }

        fn drives_a_device(&self) -> bool {
            self.device
        }
    }

    type Outcome = TestOutcome;

    fn job(name: &str, tx: &mpsc::Sender<Outcome>) -> Job {
        test_job(1, name, 10, vec![2, 3], tx)
    }

    /// Backends that stall on `stuck.mp4` until the returned gate opens.
    fn stalling_factory(device: bool) -> (BackendFactory, Arc<Gate>) {
        let gate = Arc::new(Gate::default());
        let g = gate.clone();
        let factory: BackendFactory = Arc::new(move |_| {
            Box::new(Stalling {
                gate: g.clone(),
                device,
                fake: FakeBackend::default(),
            })
        });
        (factory, gate)
    }

    fn stalling_fleet(deadline_ms: u64, max_stuck: usize) -> (Fleet, Arc<Gate>) {
        let (factory, gate) = stalling_factory(false);
        let options = FleetOptions {
            deadline: Duration::from_millis(deadline_ms),
            max_stuck,
            journal: None,
        };
        (Fleet::start(1, 16, factory, options).unwrap(), gate)
    }

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_stuck_run_fails_at_its_deadline_and_a_replacement_keeps_the_slot_serving() {
        let (fleet, gate) = stalling_fleet(200, 1);
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        fleet.submit(job("stuck.mp4", &tx)).unwrap();
        let (name, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let waited = t0.elapsed();
        assert_eq!(name, "stuck.mp4");
        assert!(
            matches!(&result, Err(DecodeError::Deadline { path, seconds, .. }) if path == std::path::Path::new("stuck.mp4") && *seconds == 0.2),
            "{result:?}"
        );
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        // The fleet's one slot has a new thread: another video decodes.
        fleet.submit(job("good.mp4", &tx)).unwrap();
        let (name, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((name.as_str(), result.unwrap()), ("good.mp4", vec![2, 3]));
        assert_eq!(fleet.counters.stuck.load(Ordering::Relaxed), 1);
        assert_eq!(fleet.health(), Ok(()));

        // A second stuck run: over the cap of one abandoned thread. Not replaced, so the slot is empty:
        // unhealthy, and new work is refused at once instead of waiting forever.
        fleet.submit(job("stuck.mp4", &tx)).unwrap();
        let (_, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(result, Err(DecodeError::Deadline { .. })));
        // Its thread is abandoned once it has not stopped within the grace period.
        wait_for("the second thread to be abandoned", || {
            fleet.counters.stuck.load(Ordering::Relaxed) == 2
        });
        let health = fleet.health().unwrap_err();
        assert!(health.contains("2 decode threads are stuck"), "{health}");
        assert!(matches!(
            fleet.submit(job("good.mp4", &tx)),
            Err(DecodeError::Stalled(_))
        ));
        assert_eq!(fleet.counters.deadline_exceeded.load(Ordering::Relaxed), 2);

        // The reads return: one abandoned thread takes the empty slot back, the other ends.
        gate.open();
        wait_for("the stuck threads to return", || {
            fleet.counters.stuck.load(Ordering::Relaxed) == 0
        });
        assert_eq!(fleet.health(), Ok(()));
        fleet.submit(job("good.mp4", &tx)).unwrap();
        let (name, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((name.as_str(), result.unwrap()), ("good.mp4", vec![2, 3]));
        // Late results of abandoned runs were dropped: nothing else arrived.
        assert!(rx.try_recv().is_err());
    }

    /// A long run that polls its stop flag: at its deadline the waiters get DEADLINE_EXCEEDED and the
    /// run stops; its thread is neither abandoned nor replaced and serves the next run. A run nobody
    /// waits for any more is stopped too (before its deadline), its outcome `Cancelled`.
    #[test]
    fn a_long_run_is_stopped_at_its_deadline_and_its_thread_keeps_serving() {
        let (fleet, _gate) = stalling_fleet(200, 1);
        let (tx, rx) = mpsc::channel();
        let thread_names = || {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| {
                    std::fs::read_to_string(t.ok()?.path().join("comm"))
                        .ok()
                        .map(|n| n.trim().to_owned())
                })
                .filter(|n| n.starts_with("vserve-decode"))
                .collect::<Vec<_>>()
        };
        for round in 0..2 {
            let t0 = Instant::now();
            fleet.submit(job("long.mp4", &tx)).unwrap();
            let (name, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(name, "long.mp4");
            // It decoded no frame: stuck, its file refused for a while.
            assert!(
                matches!(&result, Err(DecodeError::Deadline { seconds, decoding: false, decoded: 0, .. }) if *seconds == 0.2),
                "round {round}: {result:?}"
            );
            assert!(t0.elapsed() >= Duration::from_millis(200));
            fleet.submit(job("good.mp4", &tx)).unwrap();
            let (name, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!((name.as_str(), result.unwrap()), ("good.mp4", vec![2, 3]));
            assert_eq!(fleet.counters.stuck.load(Ordering::Relaxed), 0);
            assert_eq!(fleet.health(), Ok(()));
            assert_eq!(
                fleet.shared.slots[0].lock().generation,
                0,
                "never abandoned"
            );
        }
        assert_eq!(fleet.counters.deadline_exceeded.load(Ordering::Relaxed), 2);
        assert!(
            thread_names().iter().all(|n| !n.contains('.')),
            "no replacement thread was started: {:?}",
            thread_names()
        );

        // Nobody waits any more: stopped well before the deadline, outcome Cancelled.
        let (fleet, _gate) = stalling_fleet(60_000, 1);
        let wanted = Arc::new(AtomicBool::new(true));
        let mut long = job("long.mp4", &tx);
        let w = wanted.clone();
        long.still_wanted = Arc::new(move || w.load(Ordering::Relaxed));
        fleet.submit(long).unwrap();
        wait_for("the run to start", || {
            fleet.shared.slots[0].lock().running.is_some()
        });
        let t0 = Instant::now();
        wanted.store(false, Ordering::Relaxed);
        let (name, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(name, "long.mp4");
        assert!(
            matches!(result, Err(DecodeError::Cancelled { .. })),
            "{result:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        fleet.submit(job("good.mp4", &tx)).unwrap();
        let (_, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(result.unwrap(), vec![2, 3]);
        assert_eq!(fleet.counters.deadline_exceeded.load(Ordering::Relaxed), 0);
    }

    /// A run still decoding frames at its deadline is slow, not stuck: its waiters are told how many
    /// it decoded (and the engine keeps serving its file); its thread stops and serves the next run.
    #[test]
    fn a_run_decoding_frames_at_its_deadline_is_slow_not_stuck() {
        let (fleet, _gate) = stalling_fleet(200, 1);
        let (tx, rx) = mpsc::channel();
        fleet.submit(job("slow.mp4", &tx)).unwrap();
        let (name, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(name, "slow.mp4");
        match &result {
            Err(
                e @ DecodeError::Deadline {
                    decoding: true,
                    decoded,
                    ..
                },
            ) => {
                assert!(*decoded >= 10, "{result:?}");
                assert!(e.to_string().contains("the file is still served"), "{e}");
            }
            _ => panic!("{result:?}"),
        }
        fleet.submit(job("good.mp4", &tx)).unwrap();
        let (_, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(result.unwrap(), vec![2, 3]);
        assert_eq!(fleet.counters.stuck.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn spare_threads_counts_idle_threads_less_queued_runs() {
        let (factory, gate) = stalling_factory(false);
        let fleet = Fleet::start(2, 16, factory, FleetOptions::default()).unwrap();
        let running = |f: &Fleet| {
            f.shared
                .slots
                .iter()
                .filter(|s| s.lock().running.is_some())
                .count()
        };
        assert_eq!(fleet.spare_threads(), 2);
        let (tx, rx) = mpsc::channel();
        fleet.submit(job("stuck.mp4", &tx)).unwrap();
        wait_for("one run to start", || running(&fleet) == 1);
        assert_eq!(fleet.spare_threads(), 1);
        fleet.submit(job("stuck.mp4", &tx)).unwrap();
        wait_for("both runs to start", || running(&fleet) == 2);
        assert_eq!(fleet.spare_threads(), 0);
        fleet.submit(job("good.mp4", &tx)).unwrap();
        assert_eq!(fleet.queue_depth(), 1);
        assert_eq!(fleet.spare_threads(), 0);
        gate.open();
        for _ in 0..3 {
            let (_, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(result.unwrap(), vec![2, 3]);
        }
        wait_for("both threads idle", || fleet.spare_threads() == 2);
    }

    #[test]
    fn shutdown_leaves_a_stuck_thread_behind_and_tells_its_waiters() {
        let (fleet, _gate) = stalling_fleet(60_000, 4);
        let (tx, rx) = mpsc::channel();
        fleet.submit(job("stuck.mp4", &tx)).unwrap();
        wait_for("the run to start", || {
            fleet.shared.slots[0].lock().running.is_some()
        });
        let t0 = Instant::now();
        fleet.shutdown(Instant::now() + Duration::from_millis(300));
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(1), "{took:?}");
        let (_, result) = rx.recv_timeout(Duration::from_secs(1)).unwrap();
        assert!(
            matches!(result, Err(DecodeError::ShuttingDown)),
            "{result:?}"
        );
        // Dropping it now does not wait again.
        let t0 = Instant::now();
        drop(fleet);
        assert!(t0.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn the_journal_waits_for_the_disk_only_for_runs_on_a_device() {
        let dir = tempfile::tempdir().unwrap();
        let state = crate::state::StateDir::open(dir.path()).unwrap();
        let journal = crate::journal::recover(&state).unwrap().0.unwrap();
        // Three files, the second twice in a row: what each fleet's one thread enters.
        let files: Vec<_> = ["a.mp4", "b.mp4", "b.mp4", "c.mp4"]
            .iter()
            .map(|name| {
                let path = dir.path().join(name);
                std::fs::write(&path, name.as_bytes()).unwrap();
                Arc::new(crate::dataset::CheckedFile {
                    file: std::fs::File::open(&path).unwrap(),
                    path,
                    size: 5,
                    mtime_ns: 1,
                    node: Default::default(),
                })
            })
            .collect();
        for (device, want) in [(false, 0), (true, 3)] {
            let (factory, _gate) = stalling_factory(device); // only `stuck.mp4` waits on the gate
            let options = FleetOptions {
                deadline: Duration::from_secs(30),
                max_stuck: 1,
                journal: Some(journal.clone()),
            };
            let fleet = Fleet::start(1, 16, factory, options).unwrap();
            let before = journal.syncs();
            let (tx, rx) = mpsc::channel();
            for f in &files {
                let mut j = job("x.mp4", &tx);
                j.source.file = Some(f.clone());
                fleet.submit(j).unwrap();
                let (_, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
                assert_eq!(result.unwrap(), vec![2, 3]);
            }
            assert_eq!(journal.syncs() - before, want, "device: {device}");
        }
    }

    /// A long job gives its client's long-run count back however it ends: skipped because nobody wants
    /// it any more, skipped because another tenant's copy of its run ran, or abandoned with its thread
    /// (stuck in the kernel). Each once leaked the count, and with two threads (one long run per
    /// client) the client's next long run then never ran.
    #[test]
    fn every_way_a_long_job_ends_gives_its_clients_count_back() {
        let (tx, rx) = mpsc::channel();
        let long = |name: &str| {
            let mut j = job(name, &tx);
            j.long = true;
            j
        };
        let fleet = || {
            let (factory, gate) = stalling_factory(false);
            let options = FleetOptions {
                deadline: Duration::from_millis(200),
                max_stuck: 1,
                journal: None,
            };
            (Fleet::start(2, 16, factory, options).unwrap(), gate)
        };
        let next_long_runs = |fleet: &Fleet, case: &str| {
            fleet.submit(long("good.mp4")).unwrap();
            let (name, result) = rx
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("{case}: the client's next long run never ran"));
            assert_eq!(
                (name.as_str(), result.unwrap()),
                ("good.mp4", vec![2, 3]),
                "{case}"
            );
        };

        let (f, _gate) = fleet();
        for _ in 0..3 {
            let mut unwanted = long("good.mp4");
            unwanted.still_wanted = Arc::new(|| false);
            f.submit(unwanted).unwrap();
            let (_, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert!(
                matches!(result, Err(DecodeError::ShuttingDown)),
                "{result:?}"
            );
        }
        next_long_runs(&f, "unwanted");

        let (f, _gate) = fleet();
        let first = long("good.mp4");
        let mut copy = first.clone();
        copy.tenant = 2;
        f.submit(first).unwrap();
        f.submit(copy).unwrap();
        let (_, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(result.unwrap(), vec![2, 3]);
        wait_for("the copy to be taken", || {
            f.counters.queued.load(Ordering::Relaxed) == 0
        });
        next_long_runs(&f, "a copy");

        let (f, gate) = fleet();
        f.submit(long("stuck.mp4")).unwrap();
        let (_, result) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(
            matches!(result, Err(DecodeError::Deadline { .. })),
            "{result:?}"
        );
        wait_for("the stuck thread to be abandoned", || {
            f.counters.stuck.load(Ordering::Relaxed) == 1
        });
        next_long_runs(&f, "abandoned");
        gate.open();
    }
}
