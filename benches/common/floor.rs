//! The floor of DESIGN.md's reference workloads: FFmpeg's own decode time for exactly the GOP runs a
//! workload needs, on N OS threads in this process (shared by `benches/uniform.rs` and `benches/floor.rs`).
//!
//! Per run: seek to the keyframe (`avformat_seek_file` with its pts), decode up to the last wanted frame,
//! convert each wanted frame to RGB24 at the run's output size with swscale (bilinear, the frame's colour
//! matrix and range, as FFmpeg's `scale` filter and vserve do), single-threaded decoders. Two modes
//! ([`FloorMode`]): the floor as specified (every run opens the file, decodes every frame) and the tight
//! floor (open once per video, unwanted non-reference frames skipped, as FFmpeg's `-skip_frame nonref`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{anyhow, bail, Context as _, Result};
use ffmpeg_next as ffmpeg;

/// What the floor needs to know about one video: where it is and its frame table.
pub struct FloorVideo {
    /// Path relative to the root given to [`floor_pass`].
    pub rel: PathBuf,
    pub stream: usize,
    pub time_base: (i32, i32),
    /// Per frame, presentation order.
    pub pts: Vec<i64>,
    /// Output slots of the video's clip(s): `Run::wanted`'s slot numbers are below this.
    pub slots: usize,
}

/// One decode pass: from a keyframe to the last wanted frame before the next keyframe.
pub struct Run {
    pub video: usize,
    pub keyframe: u64,
    /// (slot in the clip, frame index), ascending.
    pub wanted: Vec<(usize, u64)>,
    pub out_size: (u32, u32),
}

/// A fast 64-bit hash of packed pixel rows (FxHash-style), the same on both sides.
pub fn hash_rows<'a>(rows: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for row in rows {
        let mut words = row.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
        for &byte in words.remainder() {
            h = (h.rotate_left(5) ^ u64::from(byte)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    h
}

/// How a floor decodes the runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FloorMode {
    /// Every run opens the file and a fresh decoder, as a stateless worker would. Otherwise one thread
    /// takes all runs of a video: open once, then seek + flush per run.
    pub reopen_per_run: bool,
    /// Unwanted frames that no other frame references are not decoded (`skip_frame = nonref` while
    /// they pass, FFmpeg's `-skip_frame nonref`): the least work that yields the wanted frames.
    pub skip_nonref: bool,
}

impl FloorMode {
    /// The floor as the issue defines it: each run opened, every frame from its keyframe decoded.
    pub const AS_SPECIFIED: FloorMode = FloorMode {
        reopen_per_run: true,
        skip_nonref: false,
    };
    /// The least FFmpeg work: open once per video, non-reference unwanted frames skipped.
    pub const TIGHT: FloorMode = FloorMode {
        reopen_per_run: false,
        skip_nonref: true,
    };
    pub const ALL: [FloorMode; 2] = [FloorMode::AS_SPECIFIED, FloorMode::TIGHT];

    pub fn name(self) -> &'static str {
        match (self.reopen_per_run, self.skip_nonref) {
            (true, false) => "floor (ffmpeg)",
            (false, true) => "floor, skip nonref",
            (true, true) => "floor, reopen+skip",
            (false, false) => "floor, open once",
        }
    }
}

pub struct FloorPass {
    pub mode: FloorMode,
    pub seconds: f64,
    pub frames_decoded: u64,
    /// Per clip, per slot: the hash of the converted frame.
    pub hashes: Vec<Vec<Option<u64>>>,
    /// Runs where the seek did not land on the run's keyframe (or a pts never came out) and decoding
    /// restarted at the file start, finding frames by position.
    pub restarts: usize,
}

struct RunOutcome {
    frames_decoded: u64,
    hashes: Vec<(usize, u64)>,
    restarted: bool,
}

pub fn floor_pass(
    root: &Path,
    videos: &[FloorVideo],
    runs: &[Run],
    threads: usize,
    mode: FloorMode,
) -> Result<FloorPass> {
    // Work units: single runs, or all runs of a video, in plan order.
    let units: Vec<Vec<usize>> = match mode.reopen_per_run {
        true => (0..runs.len()).map(|i| vec![i]).collect(),
        false => {
            let mut units: Vec<Vec<usize>> = Vec::new();
            for (i, run) in runs.iter().enumerate() {
                match units.last_mut() {
                    Some(u) if runs[u[0]].video == run.video => u.push(i),
                    _ => units.push(vec![i]),
                }
            }
            units
        }
    };
    let next = AtomicUsize::new(0);
    let outcomes: Mutex<Vec<Option<Result<RunOutcome>>>> =
        Mutex::new((0..runs.len()).map(|_| None).collect());
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (next, outcomes, units) = (&next, &outcomes, &units);
            let spawned = std::thread::Builder::new()
                .name(format!("floor-{t}"))
                .spawn_scoped(s, move || loop {
                    let u = next.fetch_add(1, Ordering::Relaxed);
                    let Some(unit) = units.get(u) else { break };
                    let video = &videos[runs[unit[0]].video];
                    let path = root.join(&video.rel);
                    let mut open: Option<OpenVideo> = None;
                    for &i in unit {
                        let run = &runs[i];
                        if mode.reopen_per_run {
                            open = None;
                        }
                        let outcome =
                            decode_run(&path, video, run, mode, &mut open).with_context(|| {
                                format!(
                                    "floor: {} run from keyframe {}",
                                    video.rel.display(),
                                    run.keyframe
                                )
                            });
                        if let Ok(mut o) = outcomes.lock() {
                            o[i] = Some(outcome);
                        }
                    }
                });
            if let Err(e) = spawned {
                eprintln!("uniform: cannot start floor thread {t}: {e}");
            }
        }
    });
    let seconds = start.elapsed().as_secs_f64();
    let outcomes = outcomes
        .into_inner()
        .map_err(|_| anyhow!("a floor thread panicked"))?;
    let mut pass = FloorPass {
        mode,
        seconds,
        frames_decoded: 0,
        hashes: videos.iter().map(|v| vec![None; v.slots]).collect(),
        restarts: 0,
    };
    for (run, outcome) in runs.iter().zip(outcomes) {
        let outcome = outcome.ok_or_else(|| anyhow!("a floor run was never done"))??;
        pass.frames_decoded += outcome.frames_decoded;
        pass.restarts += usize::from(outcome.restarted);
        for (slot, h) in outcome.hashes {
            pass.hashes[run.video][slot] = Some(h);
        }
    }
    Ok(pass)
}

/// `pts` (stream time base) in AV_TIME_BASE units, rounded down, for `avformat_seek_file` on stream -1.
fn to_av_time(pts: i64, (num, den): (i32, i32)) -> i64 {
    let us = i128::from(pts) * i128::from(num) * 1_000_000;
    us.div_euclid(i128::from(den)) as i64
}

/// A demuxer and a single-threaded decoder for one video, and the converter last used on it.
struct OpenVideo {
    input: ffmpeg::format::context::Input,
    decoder: ffmpeg::decoder::Video,
    scaler: Option<Scaler>,
    /// False once packets were read: the next run must seek (or reopen) before decoding.
    at_start: bool,
}

impl OpenVideo {
    fn open(path: &Path, stream: usize) -> Result<Self> {
        let input =
            ffmpeg::format::input(path).with_context(|| format!("opening {}", path.display()))?;
        let params = input
            .stream(stream)
            .ok_or_else(|| anyhow!("no stream {stream}"))?
            .parameters();
        let mut ctx = ffmpeg::codec::context::Context::from_parameters(params)?;
        ctx.set_threading(ffmpeg::codec::threading::Config {
            kind: ffmpeg::codec::threading::Type::None,
            count: 1,
            ..Default::default()
        });
        let decoder = ctx.decoder().video()?;
        Ok(OpenVideo {
            input,
            decoder,
            scaler: None,
            at_start: true,
        })
    }
}

/// swscale to RGB24 at the output size with the frame's colour matrix and range, as FFmpeg's `scale`
/// filter (and vserve) convert.
struct Scaler {
    key: (ffmpeg::format::Pixel, u32, u32, i32, i32, u32, u32),
    ctx: ffmpeg::software::scaling::Context,
    out: ffmpeg::frame::Video,
}

impl Scaler {
    fn convert<'a>(
        slot: &'a mut Option<Scaler>,
        frame: &ffmpeg::frame::Video,
        (w, h): (u32, u32),
    ) -> Result<&'a ffmpeg::frame::Video> {
        // SAFETY: `frame` wraps a valid decoded AVFrame; these are plain fields.
        let (cs, range) = unsafe {
            let f = &*frame.as_ptr();
            (f.colorspace as i32, f.color_range as i32)
        };
        let key = (
            frame.format(),
            frame.width(),
            frame.height(),
            cs,
            range,
            w,
            h,
        );
        if slot.as_ref().map(|s| s.key) != Some(key) {
            let mut ctx = ffmpeg::software::scaling::Context::get(
                frame.format(),
                frame.width(),
                frame.height(),
                ffmpeg::format::Pixel::RGB24,
                w,
                h,
                ffmpeg::software::scaling::Flags::BILINEAR,
            )?;
            let src_full = i32::from(range == ffmpeg::ffi::AVColorRange::AVCOL_RANGE_JPEG as i32);
            // SAFETY: `ctx` is a valid SwsContext; sws_getCoefficients returns a static table for any
            // value (unknown colour spaces give the default, BT.601). A refusal leaves the defaults.
            unsafe {
                ffmpeg::ffi::sws_setColorspaceDetails(
                    ctx.as_mut_ptr(),
                    ffmpeg::ffi::sws_getCoefficients(cs),
                    src_full,
                    ffmpeg::ffi::sws_getCoefficients(ffmpeg::ffi::SWS_CS_DEFAULT),
                    1,
                    0,
                    1 << 16,
                    1 << 16,
                );
            }
            *slot = Some(Scaler {
                key,
                ctx,
                out: ffmpeg::frame::Video::new(ffmpeg::format::Pixel::RGB24, w, h),
            });
        }
        let s = slot.as_mut().ok_or_else(|| anyhow!("scaler missing"))?;
        s.ctx.run(frame, &mut s.out)?;
        Ok(&s.out)
    }
}

fn decode_run(
    path: &Path,
    video: &FloorVideo,
    run: &Run,
    mode: FloorMode,
    open: &mut Option<OpenVideo>,
) -> Result<RunOutcome> {
    if let Some(outcome) = decode_run_with(path, video, run, open, true, mode.skip_nonref)? {
        return Ok(outcome);
    }
    // The seek landed after the keyframe, or a wanted pts never came out: decode from the start instead
    // and find frames by position, so the floor still delivers every frame (the report counts these).
    *open = None;
    let outcome = decode_run_with(path, video, run, open, false, false)?
        .ok_or_else(|| anyhow!("frames missing even when decoding from the start"))?;
    *open = None;
    Ok(RunOutcome {
        restarted: true,
        ..outcome
    })
}

/// Decodes one run on `open` (opened if None). `by_pts`: seek to the keyframe and match frames by pts;
/// otherwise decode from the file start and match by position. `skip_nonref` (by pts only): unwanted
/// non-reference frames are not decoded. `None`: the pts path failed.
fn decode_run_with(
    path: &Path,
    video: &FloorVideo,
    run: &Run,
    open: &mut Option<OpenVideo>,
    by_pts: bool,
    skip_nonref: bool,
) -> Result<Option<RunOutcome>> {
    let ov = match open {
        Some(ov) => ov,
        None => open.insert(OpenVideo::open(path, video.stream)?),
    };
    if by_pts && (run.keyframe > 0 || !ov.at_start) {
        let ts = to_av_time(video.pts[run.keyframe as usize], video.time_base);
        // `..ts` is max_ts = ts: the keyframe at or before ts (avformat_seek_file bounds are inclusive).
        ov.input.seek(ts, ..ts)?;
        ov.decoder.flush();
    }
    ov.at_start = false;
    let wanted_pts: Vec<i64> = run
        .wanted
        .iter()
        .map(|&(_, i)| video.pts[i as usize])
        .collect();
    let mut outcome = RunOutcome {
        frames_decoded: 0,
        hashes: Vec::with_capacity(run.wanted.len()),
        restarted: false,
    };
    let mut next = 0;
    let mut decoded = ffmpeg::frame::Video::empty();
    let OpenVideo {
        input,
        decoder,
        scaler,
        ..
    } = ov;

    // Ok(true): the run is complete; Err(None): the pts path failed (seek overshot, no pts).
    let mut take = |frame: &ffmpeg::frame::Video,
                    outcome: &mut RunOutcome,
                    next: &mut usize|
     -> Result<bool, Option<anyhow::Error>> {
        let position = outcome.frames_decoded;
        outcome.frames_decoded += 1;
        let hit = if by_pts {
            // No pts: frames cannot be told apart by pts; find them by position instead.
            let Some(pts) = frame.timestamp().or(frame.pts()) else {
                return Err(None);
            };
            if position == 0 && pts > wanted_pts[0] {
                return Err(None);
            }
            pts == wanted_pts[*next]
        } else {
            position == run.wanted[*next].1
        };
        if !hit {
            return Ok(false);
        }
        let rgb = Scaler::convert(scaler, frame, run.out_size).map_err(Some)?;
        let (stride, data, row) = (rgb.stride(0), rgb.data(0), run.out_size.0 as usize * 3);
        let rows = (0..run.out_size.1 as usize).map(|y| &data[y * stride..y * stride + row]);
        outcome.hashes.push((run.wanted[*next].0, hash_rows(rows)));
        *next += 1;
        Ok(*next == run.wanted.len())
    };

    let mut finished = false;
    let mut packets = input.packets();
    'demux: loop {
        let eof = match packets.next() {
            Some((stream, packet)) => {
                if stream.index() != video.stream {
                    continue;
                }
                if skip_nonref && by_pts {
                    let wanted = packet.pts().is_some_and(|p| wanted_pts.contains(&p));
                    decoder.skip_frame(if wanted {
                        ffmpeg::codec::discard::Discard::Default
                    } else {
                        ffmpeg::codec::discard::Discard::NonReference
                    });
                }
                match decoder.send_packet(&packet) {
                    Ok(()) | Err(ffmpeg::Error::InvalidData) => {}
                    Err(e) => return Err(e.into()),
                }
                false
            }
            None => {
                decoder.send_eof()?;
                true
            }
        };
        while decoder.receive_frame(&mut decoded).is_ok() {
            match take(&decoded, &mut outcome, &mut next) {
                Ok(true) => {
                    finished = true;
                    break 'demux;
                }
                Ok(false) => {}
                Err(None) => return Ok(None),
                Err(Some(e)) => return Err(e),
            }
        }
        if eof {
            break;
        }
    }
    if !finished {
        if by_pts {
            return Ok(None);
        }
        bail!(
            "the decoder ended after {} frames, before frame {}",
            outcome.frames_decoded,
            run.wanted[next].1
        );
    }
    Ok(Some(outcome))
}
