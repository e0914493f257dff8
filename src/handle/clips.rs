//! GetClips: explicit clips of one dataset → one array.
//!
//! resolve and index every distinct video ([`crate::catalog`]) → positions to frame numbers → geometry
//! and output shape (refused before any decode when too large) → the bytes it will hold (decoded frames
//! until assembly, the output until sent) reserved from the in-flight [`crate::budget`] (refused with
//! RESOURCE_EXHAUSTED when they do not fit) → frames per video ([`crate::frames`]:
//! cache, single flight, fleet) → [`batch`] assembly, into a reply buffer or straight into a
//! shared-memory arena; frames only this request held (they bypassed the cache) go back to the
//! decoders' buffer pool ([`crate::decode::pool`]). A video found damaged mid-request is marked (its
//! next index comes from a decode) and the whole request is resolved once more.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::batch;
use crate::catalog::Resolved;
use crate::decode::sink::Sink;
use crate::decode::Frame;
use crate::engine::Engine;
use crate::error::{blocking, Error};
use crate::metrics::Timer;
use crate::peer::Peer;
use crate::request::{
    check_output_bytes, display_dims, frame_bytes, resolve_positions, ClipMeta, ClipsReply,
    ClipsRequest, RequestStats,
};
use crate::transport::shm::{PendingReply, ShmRef};
use crate::transport::{deliver, publish_reply, Destination};

/// Serves one GetClips request.
pub async fn get_clips(
    engine: &Arc<Engine>,
    req: ClipsRequest,
    peer: &Peer,
) -> Result<ClipsReply, Error> {
    let _inflight = engine.request_started();
    match get_clips_once(engine, &req, peer).await {
        // The damaged video is now indexed by decoding; frame numbers may have changed, so the whole
        // request is resolved again.
        Err(Error::Damaged(_)) => get_clips_once(engine, &req, peer).await,
        other => other,
    }
}

async fn get_clips_once(
    engine: &Arc<Engine>,
    req: &ClipsRequest,
    peer: &Peer,
) -> Result<ClipsReply, Error> {
    let limits = engine.limits();
    req.validate(limits)?;
    let tenant = engine.frames().new_tenant(true);
    engine.catalog().dataset(&req.dataset)?;

    // Index every distinct video once, in parallel on blocking threads. `clip_video[i]` is the
    // position of clip i's video in `distinct`.
    let mut distinct: Vec<(String, Option<u32>)> = Vec::new();
    let mut position: HashMap<(&str, Option<u32>), usize> = HashMap::new();
    let clip_video: Vec<usize> = req
        .clips
        .iter()
        .map(|c| {
            *position.entry((&c.video, c.stream)).or_insert_with(|| {
                distinct.push((c.video.clone(), c.stream));
                distinct.len() - 1
            })
        })
        .collect();
    let videos = engine
        .catalog()
        .resolve_all(&req.dataset, &distinct)
        .await?;

    // Positions → frame numbers.
    let mut clip_frames: Vec<Vec<usize>> = Vec::with_capacity(req.clips.len());
    for (c, &vi) in req.clips.iter().zip(&clip_video) {
        let (_, index, _) = &videos[vi];
        clip_frames.push(resolve_positions(&c.video, index, &c.positions)?);
    }

    // Geometry per video, and the common output size.
    let mut geometries = Vec::with_capacity(videos.len());
    for (i, (_, index, _)) in videos.iter().enumerate() {
        geometries.push(req.transform.geometry(index, &distinct[i].0, limits)?);
    }
    let (w, h) = display_dims(geometries[clip_video[0]]);
    for (c, &vi) in req.clips.iter().zip(&clip_video) {
        let g = geometries[vi];
        // With a crop, frames of other sizes are fine as long as each holds the crop (batch checks).
        if req.transform.batch.crop.is_none() && display_dims(g) != (w, h) {
            let (w2, h2) = display_dims(g);
            return Err(Error::InvalidArgument(format!(
                "clips have different frame sizes ({w}x{h} and {w2}x{h2} for {:?}); request an output size",
                c.video
            )));
        }
    }
    let t = clip_frames[0].len();
    for &vi in &clip_video {
        let (cw, ch) = display_dims(geometries[vi]);
        batch::output_shape(1, t, cw, ch, &req.transform.batch)?;
    }
    let shape = batch::output_shape(req.clips.len(), t, w, h, &req.transform.batch)?;
    let nbytes = check_output_bytes("output", &shape, req.transform.batch.dtype, limits)?;

    // Frames, per video.
    let mut wanted: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); videos.len()];
    for (frames, &vi) in clip_frames.iter().zip(&clip_video) {
        wanted[vi].extend(frames.iter().copied());
    }
    // Every decoded frame is held at its decoded size until assembly (a resize to 4096x4096 then a
    // 1x1 crop holds 48 MiB a frame), and the output until it is sent.
    let held: u64 = wanted
        .iter()
        .zip(&geometries)
        .map(|(set, &g)| (set.len() as u64).saturating_mul(frame_bytes(g)))
        .fold(0, u64::saturating_add);
    let who = format!("GetClips (decoded frames {held} bytes + output {nbytes} bytes)",);
    let mut reservation = engine
        .budget()
        .try_reserve(
            held.saturating_add(nbytes),
            crate::budget::Who::new(who).client(peer),
        )
        .await?;

    // A plain array over shared memory is laid out frame after frame: its arena is taken now and each
    // video's runs that bypass the cache convert their frames straight into it.
    let in_place = match req.shm && plain(&req.transform.batch) {
        true => Some(InPlace::reserve(
            engine,
            req,
            peer,
            nbytes as usize,
            (w, h),
            &clip_frames,
            &clip_video,
            videos.len(),
        )?),
        false => None,
    };

    // Every video's runs are queued before any is awaited, so the fleet decodes them in parallel.
    let mut fetches = Vec::with_capacity(videos.len());
    for (i, ((id, _, source), wanted)) in videos.iter().zip(wanted).enumerate() {
        fetches.push(engine.frames().fetch(
            id,
            source,
            geometries[i],
            wanted,
            tenant,
            req.cache_policy,
            in_place.as_ref().map(|p| p.sinks[i].clone()),
        ));
    }
    let mut stats = RequestStats::default();
    let mut per_video: Vec<HashMap<usize, Arc<Frame>>> = Vec::with_capacity(videos.len());
    let fetched_all = futures::future::join_all(fetches).await;
    for (i, fetched) in fetched_all.iter().enumerate() {
        if let Err(Error::Damaged(detail)) = fetched {
            engine.catalog().mark_damaged(&videos[i].0, detail);
        }
    }
    for fetched in fetched_all {
        let (frames, s) = fetched?;
        stats.add(&s);
        per_video.push(frames);
    }

    if let Some(in_place) = in_place {
        let metas = clip_metas(req, &clip_frames, &clip_video, &videos);
        let (to, frames) = (engine.clone(), per_video);
        let shm = blocking(move || in_place.finish(&to, &clip_frames, &clip_video, frames)).await?;
        reservation.shrink_to(nbytes);
        return Ok(ClipsReply {
            shape: shape.to_vec(),
            data: Vec::new(),
            shm: Some(shm),
            nbytes,
            clips: metas,
            stats,
            reservation: Some(reservation),
        });
    }

    // Assemble.
    let metas = clip_metas(req, &clip_frames, &clip_video, &videos);
    let mut frames_by_clip: Vec<Vec<Arc<Frame>>> = Vec::with_capacity(req.clips.len());
    for ((c, frames), &vi) in req.clips.iter().zip(&clip_frames).zip(&clip_video) {
        let mut list = Vec::with_capacity(frames.len());
        for k in frames {
            let f = per_video[vi].get(k).cloned().ok_or_else(|| {
                Error::Internal(format!("frame {k} of {:?} missing after decode", c.video))
            })?;
            list.push(f);
        }
        frames_by_clip.push(list);
    }
    // The clips hold the only references the request keeps, so frames nobody else holds (those that
    // bypassed the cache) can go back to the buffer pool after assembly.
    drop(per_video);
    let spec = req.transform.batch.clone();
    let assembly_timer = Timer::start();
    let (to_shm, reuse, shared, owner) = (req.shm, req.shm_reuse, engine.clone(), peer.clone());
    let (shape, data, shm) = blocking(move || {
        // The frames are dropped when this closure ends; only the output stays.
        let augs = batch::centre_augs(&frames_by_clip, &spec)?;
        let shape = batch::augmented_shape(&frames_by_clip, &augs, &spec)?;
        let nbytes = batch::shape_bytes(&shape, &spec);
        let to = if to_shm {
            Destination::Reply {
                shm: shared.shm(),
                reusable: reuse,
                owner: &owner,
            }
        } else {
            Destination::Inline
        };
        let (shape, delivered) = deliver(to, nbytes, shared.metrics(), |buf| {
            Ok::<_, Error>(batch::assemble_augmented_into(
                &frames_by_clip,
                &augs,
                &spec,
                buf,
            )?)
        })?;
        crate::decode::pool::recycle(frames_by_clip.into_iter().flatten());
        let (data, shm) = delivered.into_parts();
        Ok((shape, data, shm))
    })
    .await?;
    assembly_timer.observe(&engine.metrics().batch_assembly);
    reservation.shrink_to(nbytes);
    Ok(ClipsReply {
        shape,
        data,
        shm,
        nbytes,
        clips: metas,
        stats,
        reservation: Some(reservation),
    })
}
/// Per clip, its frames' numbers and times.
fn clip_metas(
    req: &ClipsRequest,
    clip_frames: &[Vec<usize>],
    clip_video: &[usize],
    videos: &[Resolved],
) -> Vec<ClipMeta> {
    req.clips
        .iter()
        .zip(clip_frames)
        .zip(clip_video)
        .map(|((c, frames), &vi)| {
            let index = &videos[vi].1;
            ClipMeta {
                video: c.video.clone(),
                frames: frames.iter().map(|&k| k as u64).collect(),
                pts: frames.iter().map(|&k| index.frames.at(k).pts).collect(),
                pts_seconds: frames
                    .iter()
                    .map(|&k| index.seconds(index.frames.at(k).pts))
                    .collect(),
                duration_seconds: frames
                    .iter()
                    .map(|&k| index.seconds(index.frames.at(k).stated_duration))
                    .collect(),
            }
        })
        .collect()
}

/// Whether the batch is the frames themselves, one after another (uint8 THWC, no crop, no flip): what
/// a decoder can write in place.
fn plain(spec: &batch::BatchSpec) -> bool {
    spec.dtype == batch::DType::U8
        && spec.layout == batch::Layout::Thwc
        && spec.crop.is_none()
        && !spec.hflip
}

/// A plain reply assembled in place: its shared-memory arena, taken before decoding, and per video a
/// sink giving each wanted frame the place of its first position in the array.
struct InPlace {
    reply: Arc<PendingReply>,
    reusable: bool,
    frame_bytes: usize,
    /// Per video, per frame: the offset of its first position.
    first: Vec<HashMap<usize, usize>>,
    sinks: Vec<Arc<Sink>>,
}

impl InPlace {
    #[allow(clippy::too_many_arguments)]
    fn reserve(
        engine: &Arc<Engine>,
        req: &ClipsRequest,
        peer: &Peer,
        nbytes: usize,
        (w, h): (u32, u32),
        clip_frames: &[Vec<usize>],
        clip_video: &[usize],
        videos: usize,
    ) -> Result<InPlace, Error> {
        let frame_bytes = w as usize * h as usize * 3;
        let reply = Arc::new(engine.shm().reserve_reply(nbytes, req.shm_reuse, peer)?);
        let mut first: Vec<HashMap<usize, usize>> = vec![HashMap::new(); videos];
        let mut at = 0;
        for (frames, &vi) in clip_frames.iter().zip(clip_video) {
            for &k in frames {
                first[vi].entry(k).or_insert(at);
                at += frame_bytes;
            }
        }
        if at != nbytes {
            return Err(Error::Internal(format!(
                "a plain batch of {nbytes} bytes holds {at} bytes of frames"
            )));
        }
        let sinks = first
            .iter()
            .map(|places| {
                reply
                    .sink(frame_bytes, places.iter().map(|(&k, &o)| (k, o)))
                    .map(Arc::new)
                    .map_err(Error::Internal)
            })
            .collect::<Result<_, _>>()?;
        Ok(InPlace {
            reply,
            reusable: req.shm_reuse,
            frame_bytes,
            first,
            sinks,
        })
    }

    /// Fills every position the decoders did not (frames from the cache or other requests' runs, and
    /// frames listed twice), publishes the reply and gives frames nobody else holds back to the pool.
    /// Called once every fetch given a sink has returned.
    fn finish(
        self,
        engine: &Engine,
        clip_frames: &[Vec<usize>],
        clip_video: &[usize],
        per_video: Vec<HashMap<usize, Arc<Frame>>>,
    ) -> Result<ShmRef, Error> {
        let fb = self.frame_bytes;
        let timer = Timer::start();
        // SAFETY: every fetch given one of this reply's sinks has returned, so every run that wrote into
        // it has; the sinks still held by finished jobs write nothing more.
        unsafe {
            self.reply.with_bytes(|buf| -> Result<(), Error> {
                let mut at = 0;
                for (frames, &vi) in clip_frames.iter().zip(clip_video) {
                    for &k in frames {
                        match per_video[vi].get(&k) {
                            Some(f) if f.data.len() == fb => {
                                buf[at..at + fb].copy_from_slice(&f.data)
                            }
                            Some(f) => {
                                return Err(Error::Internal(format!(
                                    "frame {k} is {}x{}, not the batch's size",
                                    f.width, f.height
                                )))
                            }
                            // Written in place at its first position.
                            None => match self.first[vi].get(&k) {
                                Some(&from) if from != at => buf.copy_within(from..from + fb, at),
                                Some(_) => {}
                                None => {
                                    return Err(Error::Internal(format!(
                                        "frame {k} missing after decode"
                                    )))
                                }
                            },
                        }
                        at += fb;
                    }
                }
                Ok(())
            })?;
        }
        timer.observe(&engine.metrics().batch_assembly);
        crate::decode::pool::recycle(per_video.into_iter().flat_map(|m| m.into_values()));
        let delivered = publish_reply(engine.shm(), &self.reply, self.reusable, engine.metrics());
        match delivered.into_parts() {
            (_, Some(shm)) => Ok(shm),
            (_, None) => Err(Error::Internal("a published reply has no slot".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CachePolicy;
    use crate::config::{CacheConfig, DatasetConfig, DecodeConfig};
    use crate::config::{Config, Limits};
    use crate::decode::fake::{fake_value, FakeBackend};
    use crate::decode::fleet::BackendFactory;
    use crate::decode::Geometry;
    use crate::request::{ClipRequest, Positions, Resize, Transform};

    /// An engine over the committed demo clips whose decoding is the fake backend: the index is real
    /// (nasa_13013.mp4, keyframes 0 and 240 of 390), frame k is a solid image of value fake_value(k).
    fn engine(delay_ms: u64) -> Arc<Engine> {
        engine_with(delay_ms, 2)
    }

    fn engine_with(delay_ms: u64, threads: usize) -> Arc<Engine> {
        engine_limited(delay_ms, threads, Limits::default())
    }

    fn engine_limited(delay_ms: u64, threads: usize, limits: Limits) -> Arc<Engine> {
        let config = Config {
            listen: vec![],
            datasets: vec![DatasetConfig {
                name: "demo".into(),
                root: concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/demo").into(),
                manifest: None,
            }],
            cache: CacheConfig {
                bytes: 64 << 20,
                index_bytes: 1 << 20,
                store_bytes: 1 << 20,
                admit_ppm: crate::config::DEFAULT_ADMIT_PPM,
            },
            decode: DecodeConfig {
                threads,
                threads_explicit: true,
                queue: 16,
                threads_per_decoder: 1,
                gpus: crate::config::GpuSpec::None,
                nvdec_sessions: 1,
                deadline: std::time::Duration::from_secs(60),
                index_deadline: std::time::Duration::from_secs(600),
            },
            limits,
            shutdown_grace: std::time::Duration::from_secs(1),
            shm_dir: {
                // A directory of the tests' own (the registry sweeps what it is given).
                let d = std::env::temp_dir().join(format!("vserve-unit-{}", std::process::id()));
                std::fs::create_dir_all(&d).unwrap();
                d
            },
            state_dir: None,
            rescan_interval: std::time::Duration::ZERO,
            tenancy: Default::default(),
            ops: Default::default(),
        };
        let factory: BackendFactory = Arc::new(move |_slot| {
            Box::new(FakeBackend {
                delay: std::time::Duration::from_millis(delay_ms),
            })
        });
        Engine::new(&config, factory).unwrap()
    }

    fn request(frames: &[u64]) -> ClipsRequest {
        ClipsRequest {
            shm: false,
            shm_reuse: false,
            cache_policy: CachePolicy::Auto,
            dataset: "demo".into(),
            clips: vec![ClipRequest {
                video: "nasa_13013.mp4".into(),
                stream: None,
                positions: Positions::Frames(frames.to_vec()),
            }],
            transform: Transform {
                resize: Resize::Exact {
                    width: 8,
                    height: 4,
                },
                ..Transform::default()
            },
        }
    }

    /// A request that joins a run still queued behind another tenant's backlog is served at its own
    /// turn, not at the end of that backlog.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn joined_runs_start_at_the_joiners_turn() {
        let e = engine_with(30, 1);
        let (id, _, source) = e
            .catalog()
            .resolve("demo", "nasa_13013.mp4", None)
            .await
            .unwrap();
        let a = e.frames().new_tenant(false);
        let b = e.frames().new_tenant(false);
        let geometry = |w: u32| Geometry {
            scaled_width: w,
            scaled_height: 4,
            rotation: 0,
        };
        // Tenant a queues ten runs (one per geometry); the last is the one b will want.
        let mut backlog = Vec::new();
        for w in 1..=10 {
            let (e, id, source) = (e.clone(), id.clone(), source.clone());
            backlog.push(tokio::spawn(async move {
                e.frames()
                    .fetch(
                        &id,
                        &source,
                        geometry(w),
                        BTreeSet::from([5]),
                        a,
                        CachePolicy::Auto,
                        None,
                    )
                    .await
                    .map(|_| ())
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let (got, stats) = e
            .frames()
            .fetch(
                &id,
                &source,
                geometry(10),
                BTreeSet::from([5]),
                b,
                CachePolicy::Auto,
                None,
            )
            .await
            .unwrap();
        assert_eq!(got[&5].data[0], fake_value(5));
        assert_eq!(stats.shared_frames, 1, "b joined a's queued run");
        let runs_done = e.frames().stats().gop_runs;
        assert!(
            runs_done <= 4,
            "b waited for {runs_done} runs of a's backlog"
        );
        for h in backlog {
            h.await.unwrap().unwrap();
        }
        assert_eq!(e.frames().stats().gop_runs, 10);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn decodes_gop_runs_once_then_serves_from_cache() {
        let e = engine(0);
        let first = get_clips(&e, request(&[250, 5, 7]), &Peer::local())
            .await
            .unwrap();
        // Runs: keyframe 0 → 7 (8 frames) and keyframe 240 → 250 (11 frames).
        assert_eq!(first.stats.frames_decoded, 8 + 11);
        assert_eq!(first.stats.gop_runs, 2);
        assert_eq!(first.shape, vec![1, 3, 4, 8, 3]);
        let per = 4 * 8 * 3;
        for (i, k) in [250usize, 5, 7].iter().enumerate() {
            assert!(first.data[i * per..(i + 1) * per]
                .iter()
                .all(|&v| v == fake_value(*k)));
        }
        let second = get_clips(&e, request(&[250, 5, 7]), &Peer::local())
            .await
            .unwrap();
        assert_eq!(second.stats.frames_decoded, 0);
        assert_eq!(second.stats.cache_hits, 3);
        assert_eq!(second.data, first.data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_requests_share_one_pass() {
        let e = engine(300);
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let e = e.clone();
            tasks.push(tokio::spawn(async move {
                get_clips(&e, request(&[3, 9]), &Peer::local()).await
            }));
        }
        let mut decoded = 0;
        let mut shared = 0;
        let mut datas = Vec::new();
        for t in tasks {
            let r = t.await.unwrap().unwrap();
            decoded += r.stats.frames_decoded;
            shared += r.stats.shared_frames;
            datas.push(r.data);
        }
        assert_eq!(decoded, 10, "one pass of keyframe 0 → frame 9");
        assert_eq!(
            shared, 6,
            "three requests took both frames from the one pass"
        );
        assert!(datas.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(e.stats().gop_runs, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_queued_run_grows_to_serve_a_later_request() {
        // One decode thread, busy with GOP 240 while both requests for GOP 0 arrive.
        let e = engine_with(500, 1);
        let blocker = {
            let e = e.clone();
            tokio::spawn(async move { get_clips(&e, request(&[250]), &Peer::local()).await })
        };
        // Wait (not sleep) for each state, so a loaded machine cannot reorder the steps.
        let until = |cond: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !cond() {
                assert!(std::time::Instant::now() < deadline, "state not reached");
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        };
        // The blocker's run has started (left the queue).
        until(&|| e.frames().inflight_started() == [true]);
        let first = {
            let e = e.clone();
            tokio::spawn(async move { get_clips(&e, request(&[3]), &Peer::local()).await })
        };
        // The first request's run is registered and queued behind the blocker.
        until(&|| {
            let started = e.frames().inflight_started();
            started.len() == 2 && started.iter().filter(|s| !**s).count() == 1
        });
        let second = get_clips(&e, request(&[9]), &Peer::local()).await.unwrap();
        let first = first.await.unwrap().unwrap();
        blocker.await.unwrap().unwrap();
        // The queued run 0 → 3 grew to 0 → 9 before it started: one pass served both.
        assert_eq!(first.stats.frames_decoded, 10);
        assert_eq!(second.stats.frames_decoded, 0);
        assert_eq!(second.stats.shared_frames, 1);
        assert!(second.data.iter().all(|&v| v == fake_value(9)));
        assert!(first.data.iter().all(|&v| v == fake_value(3)));
        assert_eq!(e.stats().gop_runs, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refuses_bad_requests_before_work() {
        let e = engine(0);
        let many = vec![0u64; 1_000_000];
        assert!(matches!(
            get_clips(&e, request(&many), &Peer::local()).await,
            Err(Error::InvalidArgument(_))
        ));
        let mut huge = request(&[0]);
        huge.transform.resize = Resize::Exact {
            width: 100_000,
            height: 100_000,
        };
        assert!(matches!(
            get_clips(&e, huge, &Peer::local()).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            get_clips(&e, request(&[390]), &Peer::local()).await,
            Err(Error::OutOfRange(_))
        ));
        let mut outside = request(&[0]);
        outside.clips[0].video = "../demo/nasa_13013.mp4".into();
        assert!(matches!(
            get_clips(&e, outside, &Peer::local()).await,
            Err(Error::PermissionDenied(_))
        ));
        assert_eq!(e.stats().frames_decoded, 0);
        assert!(get_clips(&e, request(&[1]), &Peer::local()).await.is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn decoded_frames_are_admitted_before_decoding() {
        // Issue 13's shape, smaller: 10 frames resized to 4096x4096 (48 MiB each) to keep a 1x1 crop.
        let e = engine_limited(
            0,
            2,
            Limits {
                max_inflight_bytes: 64 << 20,
                ..Limits::default()
            },
        );
        let mut req = request(&(0..10).collect::<Vec<u64>>());
        req.transform.resize = Resize::Exact {
            width: 4096,
            height: 4096,
        };
        req.transform.batch.crop = Some((1, 1));
        let t = std::time::Instant::now();
        match get_clips(&e, req, &Peer::local()).await {
            Err(Error::Overloaded(m)) => assert_eq!(
                m,
                "GetClips (decoded frames 503316480 bytes + output 30 bytes) needs 503316510 bytes (480.0 MiB), more than the whole budget, 0 of 67108864 in use (max-inflight-bytes)"
            ),
            other => panic!("expected RESOURCE_EXHAUSTED, got {:?}", other.map(|r| r.shape)),
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(e.stats().frames_decoded, 0);
        assert_eq!(e.budget().in_use(), 0);
    }

    /// The bytes of a shared-memory reply, as a client maps them.
    fn shm_bytes(reply: &ClipsReply) -> Vec<u8> {
        let r = reply.shm.as_ref().expect("a shared-memory reply");
        let file = std::fs::read(&r.path).unwrap();
        file[r.offset as usize..r.offset as usize + reply.nbytes as usize].to_vec()
    }

    fn expected(frames: &[u64]) -> Vec<u8> {
        frames
            .iter()
            .flat_map(|&k| vec![fake_value(k as usize); 4 * 8 * 3])
            .collect()
    }

    /// A plain shared-memory reply whose frames bypass the cache is decoded straight into its arena:
    /// frames listed twice, frames of two clips of one video, and frames from the cache land where they
    /// belong, and nothing is decoded into the cache.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_pass_shm_replies_are_decoded_in_place() {
        let e = engine(0);
        // Frame 3 enters the cache first (an ordinary request).
        get_clips(&e, request(&[3]), &Peer::local()).await.unwrap();
        let mut req = request(&[250, 3, 5, 5]);
        req.clips.push(req.clips[0].clone());
        req.clips[1].positions = Positions::Frames(vec![7, 250, 1, 5]);
        req.shm = true;
        req.cache_policy = CachePolicy::OnePass;
        let before = e.stats();
        let reply = get_clips(&e, req.clone(), &Peer::local()).await.unwrap();
        assert_eq!(reply.shape, vec![2, 4, 4, 8, 3]);
        assert_eq!(
            shm_bytes(&reply),
            expected(&[250, 3, 5, 5, 7, 250, 1, 5]),
            "every position holds its frame"
        );
        let after = e.stats();
        // Distinct decoded frames 250, 5, 7, 1 went in place; 3 came from the cache.
        assert_eq!(after.frames_in_place - before.frames_in_place, 4);
        assert_eq!(reply.stats.cache_hits, 1);
        assert_eq!(after.cache_admitted, before.cache_admitted);
        assert_eq!(after.cache_bypassed - before.cache_bypassed, 4);
        // The same request inline, or with a crop (not plain), is assembled from frames: same bytes.
        let mut inline = req.clone();
        inline.shm = false;
        let inline = get_clips(&e, inline, &Peer::local()).await.unwrap();
        assert_eq!(inline.data, shm_bytes(&reply));
        let mut cropped = req.clone();
        cropped.transform.batch.crop = Some((8, 4));
        let cropped = get_clips(&e, cropped, &Peer::local()).await.unwrap();
        assert_eq!(shm_bytes(&cropped), shm_bytes(&reply));
        assert_eq!(e.stats().frames_in_place, after.frames_in_place);
        // Admitted (the default policy for a request this small): frames enter the cache, none in place.
        let mut kept = req.clone();
        kept.cache_policy = CachePolicy::Keep;
        let kept = get_clips(&e, kept, &Peer::local()).await.unwrap();
        assert_eq!(shm_bytes(&kept), shm_bytes(&reply));
        assert_eq!(e.stats().frames_in_place, after.frames_in_place);
        assert!(e.stats().cache_admitted > after.cache_admitted);
    }

    /// A request that joins a run writing in place for another request still gets its frames, and the
    /// first request's reply is intact.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_run_writing_in_place_is_shared_with_a_joiner() {
        let e = engine(300);
        let mut first = request(&[2, 4, 6]);
        first.shm = true;
        first.cache_policy = CachePolicy::OnePass;
        let a = {
            let e = e.clone();
            tokio::spawn(async move { get_clips(&e, first, &Peer::local()).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let second = get_clips(&e, request(&[4, 6]), &Peer::local())
            .await
            .unwrap();
        let a = a.await.unwrap().unwrap();
        assert_eq!(shm_bytes(&a), expected(&[2, 4, 6]));
        assert_eq!(second.data, expected(&[4, 6]));
        assert_eq!(second.stats.shared_frames, 2, "the joiner decoded nothing");
        assert_eq!(e.stats().frames_in_place, 3);
    }

    /// A cancelled in-place request leaves no arena behind once its run returns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_in_place_request_frees_its_arena() {
        let e = engine(200);
        let mut req = request(&[2, 4, 6]);
        req.shm = true;
        req.cache_policy = CachePolicy::OnePass;
        let files = |e: &Engine| {
            std::fs::read_dir(e.shm().dir())
                .unwrap()
                .filter(|f| {
                    !f.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with('.')
                })
                .count()
        };
        let task = {
            let e = e.clone();
            tokio::spawn(async move { get_clips(&e, req, &Peer::local()).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(files(&e), 1, "the reply's arena is taken before decoding");
        task.abort();
        let _ = task.await;
        // The run was queued or decoding: its sink keeps the arena until it returns, then it goes.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while files(&e) != 0 {
            assert!(std::time::Instant::now() < deadline, "the arena stayed");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(e.stats().shm_arenas, 0);
        // The daemon serves on.
        assert!(get_clips(&e, request(&[1]), &Peer::local()).await.is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reply_holds_its_bytes_until_it_is_dropped() {
        let e = engine(0);
        let reply = get_clips(&e, request(&[3, 9]), &Peer::local())
            .await
            .unwrap();
        assert_eq!(reply.nbytes, 2 * 4 * 8 * 3);
        // The decoded frames were given back after assembly; the output is held with the reply.
        assert_eq!(e.budget().in_use(), reply.nbytes);
        drop(reply);
        assert_eq!(e.budget().in_use(), 0);
    }
}
