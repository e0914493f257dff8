//! The fleet's time slices: a run pauses for another client's run and continues where it stopped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use parking_lot::Mutex;

use super::super::*;
use crate::decode::{cancel, Frame};

/// What the paced backends decoded, in order: (video, frame).
type Log = Arc<Mutex<Vec<(PathBuf, usize)>>>;

/// A backend that decodes one frame a millisecond from the run's keyframe, or from where its last run
/// of the video stopped when that is not past the run's first wanted frame (as FFmpeg's continues
/// without a seek), and stops at the end of its time slice as FFmpeg's does. `stuck.mp4` blocks until
/// the gate opens (a read from a hung mount).
struct Paced {
    next: HashMap<PathBuf, usize>,
    log: Log,
    gate: Arc<Gate>,
}

impl Backend for Paced {
    fn decode_run(
        &mut self,
        source: &VideoSource,
        run: &GopRun,
        _geometry: Geometry,
        _sink: Option<&crate::decode::sink::Sink>,
    ) -> Result<RunOutput, DecodeError> {
        if source.path == Path::new("stuck.mp4") {
            self.gate.pass();
        }
        let (first, last) = (run.wanted[0], *run.wanted.last().unwrap());
        let mut k = match self.next.get(&source.path) {
            Some(&n) if run.keyframe <= n && n <= first => n,
            _ => run.keyframe,
        };
        let mut out = RunOutput::default();
        loop {
            std::thread::sleep(Duration::from_millis(1));
            self.log.lock().push((source.path.clone(), k));
            out.decoded += 1;
            self.next.insert(source.path.clone(), k + 1);
            if run.wanted.binary_search(&k).is_ok() {
                let frame = Frame {
                    width: 1,
                    height: 1,
                    data: vec![k as u8; 3],
                };
                out.frames.push((k, Arc::new(frame)));
            }
            if k >= last {
                return Ok(out);
            }
            if cancel::yield_due() {
                out.yielded = true;
                return Ok(out);
            }
            k += 1;
        }
    }
}

type Outcome = TestOutcome;

/// A job of `client` for every frame of a `frames`-frame video.
fn job(client: u64, name: &str, frames: usize, tx: &mpsc::Sender<Outcome>) -> Job {
    test_job(client, name, frames, (0..frames).collect(), tx)
}

fn paced_fleet(deadline: Duration) -> (Fleet, Log, Arc<Gate>) {
    let log: Log = Arc::default();
    let gate = Arc::new(Gate::default());
    let (l, g) = (log.clone(), gate.clone());
    let factory: BackendFactory = Arc::new(move |_| {
        Box::new(Paced {
            next: HashMap::new(),
            log: l.clone(),
            gate: g.clone(),
        })
    });
    let options = FleetOptions {
        deadline,
        max_stuck: 4,
        journal: None,
    };
    (Fleet::start(1, 16, factory, options).unwrap(), log, gate)
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn decoded(log: &Log, name: &str) -> Vec<usize> {
    let log = log.lock();
    log.iter()
        .filter(|(p, _)| p == Path::new(name))
        .map(|(_, k)| *k)
        .collect()
}

/// Submits client 1's run of every frame of `long.mp4` (`frames` frames) and waits until it has decoded
/// `at` of them.
fn long_run_under_way(
    fleet: &Fleet,
    log: &Log,
    frames: usize,
    at: usize,
    tx: &mpsc::Sender<Outcome>,
) {
    fleet.submit(job(1, "long.mp4", frames, tx)).unwrap();
    wait_for("the long run to start", || {
        decoded(log, "long.mp4").len() >= at
    });
}

/// On one thread, client 1's run of 300 frames (0.3 s) pauses for client 2's run of 3 queued after it
/// started, and neither for client 1's own next run nor for client 3's run of 400 (longer than what is
/// left of it); it then continues where it stopped: every frame decoded once, every wanted frame given
/// once, in order.
#[test]
fn a_run_pauses_for_another_clients_run_and_continues_where_it_stopped() {
    let (fleet, log, _gate) = paced_fleet(Duration::from_secs(30));
    let (tx, rx) = mpsc::channel();
    long_run_under_way(&fleet, &log, 300, 20, &tx);
    fleet.submit(job(1, "own.mp4", 3, &tx)).unwrap();
    fleet.submit(job(3, "big.mp4", 400, &tx)).unwrap();
    fleet.submit(job(2, "other.mp4", 3, &tx)).unwrap();
    let order: Vec<Outcome> = (0..4)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["other.mp4", "long.mp4", "own.mp4", "big.mp4"]);
    let long = order[1].1.as_ref().unwrap();
    assert_eq!(*long, (0..300).collect::<Vec<_>>());
    assert_eq!(decoded(&log, "long.mp4"), (0..300).collect::<Vec<_>>());
    // The other client's run was decoded inside the long one: after its frame 20, before its last.
    let at = |name: &str, k: usize| {
        let log = log.lock();
        log.iter()
            .position(|(p, f)| p == Path::new(name) && *f == k)
            .unwrap()
    };
    assert!(at("long.mp4", 20) < at("other.mp4", 0));
    assert!(at("other.mp4", 2) < at("long.mp4", 299));
    assert!(at("long.mp4", 299) < at("big.mp4", 0));
    assert_eq!(fleet.counters.runs.load(Ordering::Relaxed), 4);
    assert_eq!(fleet.counters.frames_decoded.load(Ordering::Relaxed), 706);
    assert!(fleet.counters.paused.load(Ordering::Relaxed) >= 1);
}

/// A run that wants only the last frame of a long GOP has the whole GOP to decode: it pauses for another
/// client's short run queued after it started (what was left of it was weighed from its first wanted
/// frame, one frame, so it never paused: probe D, another tenant waited 1-37 s behind such runs).
#[test]
fn a_run_for_the_end_of_a_long_gop_pauses_for_a_shorter_run() {
    let (fleet, log, _gate) = paced_fleet(Duration::from_secs(30));
    let (tx, rx) = mpsc::channel();
    fleet
        .submit(test_job(1, "long.mp4", 300, vec![299], &tx))
        .unwrap();
    wait_for("the long run to pass its first pause", || {
        decoded(&log, "long.mp4").len() >= 60
    });
    fleet.submit(job(2, "other.mp4", 3, &tx)).unwrap();
    let order: Vec<Outcome> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["other.mp4", "long.mp4"]);
    assert_eq!(*order[1].1.as_ref().unwrap(), [299]);
    assert_eq!(decoded(&log, "long.mp4"), (0..300).collect::<Vec<_>>());
    assert!(fleet.counters.paused.load(Ordering::Relaxed) >= 1);
}

/// A run paused again and again keeps about half its thread: back from a pause, it decodes for as long
/// as it waited before it pauses again, however many shorter runs another client queues.
#[test]
fn a_paused_run_decodes_as_long_as_it_waited_before_it_pauses_again() {
    let (fleet, log, _gate) = paced_fleet(Duration::from_secs(30));
    let (tx, rx) = mpsc::channel();
    long_run_under_way(&fleet, &log, 400, 5, &tx);
    for i in 0..12 {
        fleet
            .submit(job(2, &format!("short{i}.mp4"), 30, &tx))
            .unwrap();
    }
    for _ in 0..13 {
        let (name, result) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(result.is_ok(), "{name}: {result:?}");
    }
    // The log as runs of one video: (the long one, frames).
    let mut segments: Vec<(bool, usize)> = Vec::new();
    for (path, _) in log.lock().iter() {
        let long = path == Path::new("long.mp4");
        match segments.last_mut() {
            Some((l, n)) if *l == long => *n += 1,
            _ => segments.push((long, 1)),
        }
    }
    let between: Vec<(usize, usize)> = segments
        .windows(3)
        .filter_map(|w| match w {
            [(false, waited), (true, decoded), (false, _)] => Some((*waited, *decoded)),
            _ => None,
        })
        .collect();
    assert!(
        !between.is_empty(),
        "the long run paused twice: {segments:?}"
    );
    for (waited, decoded) in between {
        assert!(
            decoded * 2 >= waited,
            "back after waiting for {waited} frames, the run decoded {decoded} before it paused again: {segments:?}"
        );
    }
}

/// A run paused for another client's run whose read never returns is not lost with that thread: the
/// thread that replaces it continues the paused run (from its keyframe, on a fresh backend), and the
/// stuck run alone fails at its deadline.
#[test]
fn a_paused_run_is_continued_by_the_thread_that_replaces_a_stuck_one() {
    let (fleet, log, gate) = paced_fleet(Duration::from_millis(800));
    let (tx, rx) = mpsc::channel();
    long_run_under_way(&fleet, &log, 200, 20, &tx);
    fleet.submit(job(2, "stuck.mp4", 3, &tx)).unwrap();
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(first.0, "stuck.mp4");
    assert!(
        matches!(first.1, Err(DecodeError::Deadline { .. })),
        "{first:?}"
    );
    let second = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(second.0, "long.mp4");
    assert_eq!(second.1.unwrap(), (0..200).collect::<Vec<_>>());
    let long = decoded(&log, "long.mp4");
    assert!(
        long.len() > 200,
        "the replacement decoded again from the keyframe"
    );
    assert_eq!(long[long.len() - 200..], (0..200).collect::<Vec<_>>()[..]);
    // The stuck thread returns, finds its slot taken, and leaves; the fleet keeps serving.
    gate.open();
    wait_for("the stuck thread to leave", || {
        fleet.counters.stuck.load(Ordering::Relaxed) == 0
    });
    fleet.submit(job(2, "after.mp4", 2, &tx)).unwrap();
    let after = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(after.0, "after.mp4");
    assert_eq!(after.1.unwrap(), vec![0, 1]);
}
