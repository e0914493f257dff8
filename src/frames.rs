//! Frames: the decoded-frame cache in front of the decode fleet, with single flight.
//!
//! Input: one video's identity and source, an output [`Geometry`] and the frame numbers wanted. Output:
//! those frames ([`Frames::fetch`]), from the cache, from another request's pass, or from new GOP runs
//! ([`crate::plan::gop_runs`]) queued on the fleet under the asking tenant (the fleet shares its threads
//! fairly between tenants).
//!
//! Single flight: a GOP run in progress is registered under (video, keyframe, geometry). A request that
//! needs frames from a registered run waits for that pass and takes the frames it needs from its output;
//! whatever it still lacks (frames past the other request's stopping point) it decodes in a second round
//! of its own. Decoded frames enter the cache on the decode thread, whether or not the requester is still
//! there, so cancelled work is never wasted; a run nobody waits for any more is skipped before it starts.
//!
//! Admission: each fetch decides once, from its [`CachePolicy`] and the decoded bytes it wants of the
//! video, whether its runs' frames enter the cache ([`FrameCache::admits`]). A run's frames enter if any
//! request waiting on it admits them (an admitting joiner upgrades a scan's run); otherwise they only
//! reach the requests and are counted as bypassed.
//!
//! In place: a fetch given a [`Sink`] (a GetClips reply in shared memory waiting for the frames) hands
//! it to the runs it starts when it does not admit their frames: the decode thread converts those
//! frames straight into the reply and they come back as places filled, not as frames. Such a run is
//! still shared: a request that joins it marks the sink shared, and frames decoded from then on are
//! also emitted as frames (frames written before the join are decoded again by the joiner's second
//! round).
//!
//! Deadlines: a run past the fleet's deadline fails its leader and every joiner with DEADLINE_EXCEEDED
//! (a joiner does not decode the file again); a run that decoded no frame in the deadline's last
//! quarter is stuck, and its file is reported to the [`FailureHook`] so the catalogue stops offering it
//! for a while (a slow run's file stays served).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::cache::{CachePolicy, FrameCache, FrameKey, VideoId};
use crate::decode::fleet::{BackendFactory, Fleet, FleetOptions, Job, OnDone, PendingRun};
use crate::decode::sink::Sink;
use crate::decode::{DecodeError, DecodedOn, Frame, Geometry, GopRun, RunOutput, VideoSource};
use crate::error::Error;
use crate::metrics::{BackendLabel, EngineMetrics, Timer};
use crate::plan;
use crate::request::RequestStats;

type RunResult = Result<Arc<RunOutput>, DecodeError>;

/// Told of a video whose decode run went past its deadline stuck (the catalogue remembers it as stalled).
pub type FailureHook = Arc<dyn Fn(&VideoId, &DecodeError) + Send + Sync>;
type RunSender = Arc<watch::Sender<Option<RunResult>>>;

/// A run in the single-flight table: its result channel, the run itself while it may still grow, and
/// its queued job (a joiner from another tenant queues a copy under its own tenant).
#[derive(Clone)]
struct InFlight {
    tx: RunSender,
    pending: Arc<Mutex<PendingRun>>,
    job: Job,
    /// Whether the run's frames enter the cache: set by the leader, raised by an admitting joiner.
    admit: Arc<AtomicBool>,
    /// The leader's reply, where the run converts the leader's frames in place.
    sink: Option<Arc<Sink>>,
    /// Every key the pass is registered under (its keyframe first, then the later keyframes it decodes
    /// through, including those a joiner grew it into): all removed when it ends.
    keys: Arc<Mutex<Vec<RunKey>>>,
}

impl InFlight {
    /// Registers this pass also under the `keyframes` it decodes through (video and geometry of `base`)
    /// that no other pass holds, remembering them for [`unregister`].
    fn register_through(
        &self,
        map: &mut HashMap<RunKey, InFlight>,
        base: &RunKey,
        keyframes: impl Iterator<Item = usize>,
    ) {
        let mut keys = self.keys.lock();
        for keyframe in keyframes {
            let k = RunKey {
                keyframe,
                ..base.clone()
            };
            if let std::collections::hash_map::Entry::Vacant(e) = map.entry(k.clone()) {
                e.insert(self.clone());
                keys.push(k);
            }
        }
    }
}

/// Whose decode work a fetch queues: the fleet shares threads fairly between tenants. `bounded` work
/// (GetClips) is refused when the queue is full; a stream's is not, since its prefetch bounds it.
#[derive(Clone, Copy, Debug)]
pub struct Tenant {
    pub id: u64,
    /// The client (process, or address) it belongs to: the fleet's turns go round clients first.
    pub client: u64,
    pub bounded: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RunKey {
    video: Arc<VideoId>,
    keyframe: usize,
    geometry: Geometry,
}

/// Counters since start-up.
#[derive(Default)]
struct Counters {
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    shared_frames: AtomicU64,
    in_place: AtomicU64,
    tenants: AtomicU64,
}

pub struct Frames {
    cache: FrameCache,
    fleet: Fleet,
    /// GOP runs being decoded now, for single flight.
    inflight: Arc<Mutex<HashMap<RunKey, InFlight>>>,
    counters: Counters,
    metrics: EngineMetrics,
    on_failure: FailureHook,
}

/// The frame counters of [`Frames`], for the engine's stats.
#[derive(Clone, Debug, Default)]
pub struct FrameStats {
    pub frames_decoded: u64,
    pub gop_runs: u64,
    pub frames_skipped: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_bytes: u64,
    pub cache_entries: u64,
    pub cache_evictions: u64,
    /// Decoded frames inserted into the cache, and decoded frames served without entering it.
    pub cache_admitted: u64,
    pub cache_bypassed: u64,
    pub shared_frames: u64,
    /// Decoded frames converted straight into the reply that wanted them (see [`Sink`]).
    pub frames_in_place: u64,
    pub decoders_opened: u64,
    pub decoders_reused: u64,
    pub decode_queue_depth: u64,
    /// Runs failed for passing their deadline.
    pub deadline_exceeded: u64,
    /// Decode threads abandoned in a stuck run that have not returned.
    pub stuck_threads: u64,
    /// Runs paused for another client's run (each continued where it stopped).
    pub runs_paused: u64,
}

impl Frames {
    /// Starts a decode fleet of `threads` threads (`factory` gives each its backend; `queue` bounds the
    /// runs waiting; `options` its deadline and journal) behind `cache`. `on_failure` hears of runs past
    /// their deadline.
    pub fn start(
        threads: usize,
        queue: usize,
        factory: BackendFactory,
        options: FleetOptions,
        cache: FrameCache,
        metrics: EngineMetrics,
        on_failure: FailureHook,
    ) -> Result<Frames, String> {
        let fleet = Fleet::start(threads, queue, factory, options)
            .map_err(|e| format!("cannot start decode threads: {e}"))?;
        Ok(Frames {
            cache,
            fleet,
            inflight: Arc::new(Mutex::new(HashMap::new())),
            counters: Counters::default(),
            metrics,
            on_failure,
        })
    }

    /// Whether the decode fleet can make progress (for `/livez`); Err says why not.
    pub fn health(&self) -> Result<(), String> {
        self.fleet.health()
    }

    /// Stops the fleet: queued work finishes until `deadline`, threads stuck past it are left behind.
    pub fn shutdown(&self, deadline: std::time::Instant) {
        self.fleet.shutdown(deadline);
    }

    /// Decode threads in the fleet (CPU threads and NVDEC sessions).
    pub fn threads(&self) -> usize {
        self.fleet.threads()
    }

    /// Decode slots whose stuck thread was abandoned and not replaced.
    pub fn vacant_slots(&self) -> usize {
        self.fleet.vacant_slots()
    }

    pub fn new_tenant(&self, bounded: bool, client: u64) -> Tenant {
        Tenant {
            id: self.counters.tenants.fetch_add(1, Ordering::Relaxed),
            client,
            bounded,
        }
    }

    pub fn stats(&self) -> FrameStats {
        self.cache.sync();
        let (c, f) = (&self.counters, &self.fleet.counters);
        FrameStats {
            frames_decoded: f.frames_decoded.load(Ordering::Relaxed),
            gop_runs: f.runs.load(Ordering::Relaxed),
            frames_skipped: f.frames_skipped.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
            cache_misses: c.cache_misses.load(Ordering::Relaxed),
            cache_bytes: self.cache.weighted_bytes(),
            cache_entries: self.cache.entries(),
            cache_evictions: self.cache.evictions(),
            cache_admitted: self.cache.admitted(),
            cache_bypassed: self.cache.bypassed(),
            shared_frames: c.shared_frames.load(Ordering::Relaxed),
            frames_in_place: c.in_place.load(Ordering::Relaxed),
            decoders_opened: f.decoders_opened.load(Ordering::Relaxed),
            decoders_reused: f.decoders_reused.load(Ordering::Relaxed),
            decode_queue_depth: self.fleet.queue_depth() as u64,
            deadline_exceeded: f.deadline_exceeded.load(Ordering::Relaxed),
            stuck_threads: f.stuck.load(Ordering::Relaxed) as u64,
            runs_paused: f.paused.load(Ordering::Relaxed),
        }
    }

    /// Whether each registered run has started, for tests that wait for a state.
    #[cfg(test)]
    pub(crate) fn inflight_started(&self) -> Vec<bool> {
        self.inflight
            .lock()
            .values()
            .map(|f| f.pending.lock().started)
            .collect()
    }

    /// Returns the wanted frames of one video: from the cache, another request's pass, or new GOP runs.
    /// Frames decoded for it enter the cache if `policy` admits the wanted frames' bytes. When they do
    /// not and `sink` is given, the runs this fetch starts write the wanted frames that have a place in
    /// it there; those frames are absent from the map returned (every other wanted frame is in it).
    #[allow(clippy::too_many_arguments)]
    pub async fn fetch(
        &self,
        id: &Arc<VideoId>,
        source: &VideoSource,
        geometry: Geometry,
        wanted: BTreeSet<usize>,
        tenant: Tenant,
        policy: CachePolicy,
        sink: Option<Arc<Sink>>,
    ) -> Result<(HashMap<usize, Arc<Frame>>, RequestStats), Error> {
        let mut stats = RequestStats::default();
        let frame_bytes = u64::from(geometry.scaled_width) * u64::from(geometry.scaled_height) * 3;
        let admit = self
            .cache
            .admits(policy, (wanted.len() as u64).saturating_mul(frame_bytes));
        let sink = sink.filter(|_| !admit);
        let key_of = |frame: usize| FrameKey {
            video: id.clone(),
            frame,
            geometry,
        };
        let lookup_timer = Timer::start();
        let mut got = HashMap::with_capacity(wanted.len());
        let mut missing = BTreeSet::new();
        for &k in &wanted {
            match self.cache.get(&key_of(k)) {
                Some(f) => {
                    got.insert(k, f);
                }
                None => {
                    missing.insert(k);
                }
            }
        }
        lookup_timer.observe(&self.metrics.cache_lookup);
        let hits = got.len() as u64;
        stats.cache_hits += hits;
        stats.cache_misses += missing.len() as u64;
        self.counters.cache_hits.fetch_add(hits, Ordering::Relaxed);
        self.counters
            .cache_misses
            .fetch_add(missing.len() as u64, Ordering::Relaxed);

        // Round 0 may join passes already in flight; round 1 decodes whatever those did not produce.
        for round in 0..2 {
            if missing.is_empty() {
                break;
            }
            let mut waits = Vec::new();
            // Chains of GOP runs are cut for the threads idle now (a request on an idle daemon uses them
            // all; a busy daemon decodes each chain in as few passes as it can). Frames within one GOP, most
            // training clips, skip the look at the fleet's slots.
            let crosses_a_keyframe = match (missing.first(), missing.last()) {
                (Some(&a), Some(&b)) => {
                    source.index.keyframe_before(b) > source.index.keyframe_before(a)
                }
                _ => false,
            };
            let spread = if crosses_a_keyframe {
                self.fleet.spare_threads().max(1)
            } else {
                1
            };
            let mut runs = plan::gop_runs(&source.index, &missing, spread);
            if round == 0 {
                // Round 1 joins nothing: its runs stay whole.
                runs = runs
                    .into_iter()
                    .flat_map(|r| self.split_at_flights(id, geometry, source, r))
                    .collect();
            }
            for run in runs {
                let key = RunKey {
                    video: id.clone(),
                    keyframe: run.keyframe,
                    geometry,
                };
                // Join a pass of the same run; while it is still queued, add our frames to it so one
                // pass serves both (a started pass gives what it gives; round 1 decodes the rest).
                // Round 0 registers a new pass only if nobody registered one since it looked.
                loop {
                    if round == 0 {
                        if let Some(rx) = self.join(&key, source, &run.wanted, tenant, admit) {
                            waits.push((rx, false));
                            break;
                        }
                    }
                    let exclusive = round == 0;
                    if let Some(rx) = self.start_run(
                        key.clone(),
                        source,
                        run.clone(),
                        geometry,
                        tenant,
                        exclusive,
                        admit,
                        sink.clone(),
                    )? {
                        waits.push((rx, true));
                        break;
                    }
                }
            }
            for (mut rx, leader) in waits {
                let outcome = rx
                    .wait_for(|v| v.is_some())
                    .await
                    .map(|v| v.clone())
                    .ok()
                    .flatten();
                match outcome {
                    Some(Ok(out)) => {
                        if leader {
                            stats.frames_decoded += out.decoded;
                            stats.frames_skipped += out.skipped;
                            stats.gop_runs += 1;
                            // Written into our sink: done, whether or not also emitted as frames.
                            let mut placed = 0;
                            for k in &out.sunk {
                                placed += u64::from(missing.remove(k));
                            }
                            self.counters.in_place.fetch_add(placed, Ordering::Relaxed);
                        }
                        for (k, f) in &out.frames {
                            if missing.remove(k) {
                                if !leader {
                                    stats.shared_frames += 1;
                                    self.counters.shared_frames.fetch_add(1, Ordering::Relaxed);
                                }
                                got.insert(*k, f.clone());
                            }
                        }
                    }
                    Some(Err(e)) if leader => return Err(e.into()),
                    // A pass past its deadline: decoding the file again would only take as long.
                    Some(Err(e @ (DecodeError::Deadline { .. } | DecodeError::Stalled(_)))) => {
                        return Err(e.into())
                    }
                    None if leader => {
                        return Err(Error::Internal("decode job vanished".into()));
                    }
                    // Another request's pass failed or vanished: decode ourselves next round.
                    _ => {}
                }
            }
        }
        if let Some(k) = missing.first() {
            return Err(Error::Internal(format!(
                "frame {k} of {} still missing after decoding",
                source.path.display()
            )));
        }
        Ok((got, stats))
    }

    /// `run` cut at each later keyframe it decodes through where a pass other than the one at its own
    /// keyframe is registered, so that each piece joins the pass already decoding it. (A plan made while
    /// the threads were busy merges GOP runs that an earlier plan, made while they were idle, cut into
    /// passes: whole, the run would join the first pass only, grow it over the others' GOPs and decode them
    /// a second time.)
    fn split_at_flights(
        &self,
        id: &Arc<VideoId>,
        geometry: Geometry,
        source: &VideoSource,
        run: GopRun,
    ) -> Vec<GopRun> {
        let last = run.wanted.last().copied().unwrap_or(run.keyframe);
        let inner: Vec<usize> = keyframes_within(source, run.keyframe, last).collect();
        if inner.is_empty() {
            // Within one GOP (most training clips): nothing to cut, no look at the table.
            return vec![run];
        }
        let key_at = |keyframe| RunKey {
            video: id.clone(),
            keyframe,
            geometry,
        };
        let cuts: Vec<usize> = {
            let map = self.inflight.lock();
            let own = map.get(&key_at(run.keyframe)).map(|f| f.tx.clone());
            inner
                .into_iter()
                .filter(|&k| {
                    map.get(&key_at(k))
                        .is_some_and(|f| !own.as_ref().is_some_and(|o| Arc::ptr_eq(o, &f.tx)))
                })
                .collect()
        };
        plan::cut_at(run, &cuts)
    }

    /// Joins the registered pass of `key`, if any: adds `wanted` to it while it is queued, and, when it
    /// is queued under another tenant, queues a copy under `tenant` too, so the run starts at whichever
    /// turn comes first (fair share holds for joiners). `admit`: this request lets the run's frames enter
    /// the cache. A queued pass that `wanted` grows past its last frame is also registered under the later
    /// keyframes it now decodes through (those no other pass holds).
    fn join(
        &self,
        key: &RunKey,
        source: &VideoSource,
        wanted: &[usize],
        tenant: Tenant,
        admit: bool,
    ) -> Option<watch::Receiver<Option<RunResult>>> {
        let (rx, queued) = {
            let mut map = self.inflight.lock();
            let f = map.get(key)?;
            if admit {
                f.admit.store(true, Ordering::Relaxed);
            }
            if let Some(s) = &f.sink {
                s.mark_shared();
            }
            let (queued, grown) = {
                let mut pending = f.pending.lock();
                let before = pending.run.wanted.last().copied();
                let queued = pending.extend(wanted);
                let after = pending.run.wanted.last().copied();
                (queued, before.zip(after).filter(|(b, a)| a > b))
            };
            let joined = (f.tx.subscribe(), queued.then(|| f.job.clone()));
            if let Some((before, after)) = grown {
                // Cloned only here: registering needs the table mutably.
                let f = f.clone();
                f.register_through(&mut map, key, keyframes_within(source, before, after));
            }
            joined
        };
        if let Some(mut job) = queued.filter(|j| j.tenant != tenant.id) {
            job.tenant = tenant.id;
            job.client = tenant.client;
            let _ = if tenant.bounded {
                self.fleet.submit(job)
            } else {
                self.fleet.submit_unbounded(job)
            };
        }
        Some(rx)
    }

    /// Registers a run for single flight and queues it on the fleet. `exclusive`: if another request
    /// registered the same run meanwhile, registers nothing and returns None (the caller joins it).
    /// `admit`: the run's frames enter the cache (unless only requests that keep them out wait on it).
    #[allow(clippy::too_many_arguments)]
    fn start_run(
        &self,
        key: RunKey,
        source: &VideoSource,
        run: GopRun,
        geometry: Geometry,
        tenant: Tenant,
        exclusive: bool,
        admit: bool,
        sink: Option<Arc<Sink>>,
    ) -> Result<Option<watch::Receiver<Option<RunResult>>>, Error> {
        let admit = Arc::new(AtomicBool::new(admit));
        let admit_done = admit.clone();
        let (tx, rx) = watch::channel(None);
        let tx: RunSender = Arc::new(tx);
        // A pass through several GOPs is also registered under each later keyframe it decodes, so a request
        // whose run starts there joins it instead of decoding that GOP again.
        let last = run.wanted.last().copied().unwrap_or(run.keyframe);
        let through: Vec<usize> = keyframes_within(source, run.keyframe, last).collect();
        // Frames decoded from the last keyframe the run passes to its last wanted frame: what no split of
        // the run could shorten.
        let from = match source.index.seek {
            crate::index::SeekMode::FromStart => run.keyframe,
            _ => through.last().copied().unwrap_or(run.keyframe),
        };
        let long_run =
            last.saturating_sub(from).saturating_add(1) >= crate::decode::fleet::LONG_RUN_FRAMES;
        let all_keys = Arc::new(Mutex::new(vec![key.clone()]));
        let pending = Arc::new(Mutex::new(PendingRun {
            started: false,
            run,
        }));
        let (cache, inflight, done_tx, done_keys) = (
            self.cache.clone(),
            self.inflight.clone(),
            tx.clone(),
            all_keys.clone(),
        );
        let video = key.video.clone();
        let on_failure = self.on_failure.clone();
        let wanted_tx = tx.clone();
        // Stage timings: queued at submit, taken by a decode thread when it asks whether the run is still
        // wanted (just before decoding), done at `on_done`.
        let (metrics, queued_at) = (self.metrics.clone(), std::time::Instant::now());
        let taken_at = Arc::new(std::sync::OnceLock::new());
        let taken = taken_at.clone();
        let job = Job {
            client: tenant.client,
            tenant: tenant.id,
            long: long_run,
            source: source.clone(),
            run: pending,
            geometry,
            sink: sink.clone(),
            on_done: Arc::new(Mutex::new(Some(Box::new(
                move |result: Result<RunOutput, DecodeError>| {
                    let result = result.map(Arc::new);
                    if let Err(
                        e @ DecodeError::Deadline {
                            decoding: false, ..
                        },
                    ) = &result
                    {
                        on_failure(&video, e);
                    }
                    if let Ok(out) = &result {
                        // Frames in place may also be in `frames` (a shared sink): count each once.
                        let placed_only = out
                            .sunk
                            .iter()
                            .filter(|&&k| out.frames.binary_search_by_key(&k, |(f, _)| *f).is_err())
                            .count();
                        let produced = (out.frames.len() + placed_only) as u64;
                        let started = *taken_at.get_or_init(std::time::Instant::now);
                        metrics.observe_run(
                            match out.decoded_on {
                                DecodedOn::Gpu => BackendLabel::CUDA,
                                DecodedOn::Cpu | DecodedOn::CpuFallback => BackendLabel::CPU,
                            },
                            out.decoded_on == DecodedOn::CpuFallback,
                            started.saturating_duration_since(queued_at),
                            started.elapsed(),
                            out.decoded,
                            produced,
                        );
                        if admit_done.load(Ordering::Relaxed) {
                            for (k, f) in &out.frames {
                                cache.insert(
                                    FrameKey {
                                        video: video.clone(),
                                        frame: *k,
                                        geometry,
                                    },
                                    f.clone(),
                                );
                            }
                            cache.bypass(placed_only as u64);
                        } else {
                            cache.bypass(produced);
                        }
                    }
                    {
                        let mut map = inflight.lock();
                        let keys = std::mem::take(&mut *done_keys.lock());
                        unregister(&mut map, &keys, &done_tx);
                    }
                    done_tx.send_replace(Some(result));
                },
            ) as OnDone))),
            still_wanted: Arc::new(move || {
                taken.get_or_init(std::time::Instant::now);
                wanted_tx.receiver_count() > 0
            }),
        };
        {
            let mut map = self.inflight.lock();
            if exclusive && map.contains_key(&key) {
                return Ok(None);
            }
            let flight = InFlight {
                tx: tx.clone(),
                pending: job.run.clone(),
                job: job.clone(),
                admit,
                sink,
                keys: all_keys.clone(),
            };
            map.insert(key.clone(), flight.clone());
            // Later keyframes another pass already holds stay with it.
            flight.register_through(&mut map, &key, through.into_iter());
        }
        let submitted = if tenant.bounded {
            self.fleet.submit(job)
        } else {
            self.fleet.submit_unbounded(job)
        };
        if let Err(e) = submitted {
            let mut map = self.inflight.lock();
            let keys = std::mem::take(&mut *all_keys.lock());
            unregister(&mut map, &keys, &tx);
            return Err(e.into());
        }
        Ok(Some(rx))
    }
}

/// The keyframes after frame `after` up to frame `last` a pass decodes through (none for stored frames,
/// each its own keyframe, whose passes never cross one).
fn keyframes_within(
    source: &VideoSource,
    after: usize,
    last: usize,
) -> impl Iterator<Item = usize> + '_ {
    let index = &source.index;
    let kfs = &index.keyframes;
    let from = if index.method == crate::index::IndexMethod::Stored {
        kfs.len()
    } else {
        kfs.count_at_or_before(after)
    };
    (from..kfs.len())
        .map(|i| kfs.at(i))
        .take_while(move |&k| k <= last)
}

/// Removes the keys that still name the pass whose result goes to `tx`.
fn unregister(map: &mut HashMap<RunKey, InFlight>, keys: &[RunKey], tx: &RunSender) {
    for k in keys {
        if map.get(k).is_some_and(|f| Arc::ptr_eq(&f.tx, tx)) {
            map.remove(k);
        }
    }
}
