//! CPU decoding through libavcodec (FFmpeg), and the conversion to RGB24 through libswscale.
//!
//! Inputs: a [`VideoSource`], a [`GopRun`], a [`Geometry`]. Outputs: the run's wanted frames as packed
//! RGB24. Frame k is found as the index defines it: by pts after a seek to the run's keyframe
//! ([`SeekMode::ByPts`]), or by counting from the start of the file ([`SeekMode::FromStart`]). After a
//! seek, packets are dropped until the keyframe's own packet arrives; a seek that lands past it (demuxers
//! that seek by dts, MPEG-PS and -TS) is aimed earlier, and at last the file is read from the start. Only
//! the video's stream is read, as the CLI reads it.
//!
//! Colour: swscale is given the frame's colour matrix and range (`sws_setColorspaceDetails`, destination
//! full range), as FFmpeg's scale filter does, so native-size output equals `ffmpeg -pix_fmt rgb24` bit
//! for bit. Resizing happens in the same swscale call with the BILINEAR filter (FFmpeg's `scale` filter
//! with `flags=bilinear`; its support widens with the scale factor, so downscaling is antialiased).
//!
//! A [`FfmpegBackend`] lives on one decode thread and keeps a few videos open, so consecutive runs of one
//! video skip reopening, and a run that starts where the previous one stopped skips the seek.
//!
//! Hardware decoding (NVDEC) is the same backend with a [`HwDevice`]: FFmpeg's CUDA hwaccel decodes into
//! GPU surfaces (`get_format` picks `AV_PIX_FMT_CUDA`, else the open fails), and only the wanted frames are
//! copied to host memory (`av_hwframe_transfer_data`, NV12 or P010/P016) before the same swscale
//! conversion, so seeking, frame numbering and skipping are one code path for CPU and GPU.

pub mod check;
mod convert;
pub mod h264;
mod hw;
pub mod info;
mod keep;
pub mod open;
mod palette;
mod reuse;
pub mod scan;
mod seek;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use ffmpeg_next as ff;

use super::sink::Sink;
use super::{Backend, DecodeError, Frame, Geometry, GopRun, RunOutput, VideoSource};
use crate::dataset::CheckedFile;
use crate::index::{IndexMethod, SeekMode, VideoIndex};
pub use check::{check_video, VideoCheck};
use convert::convert_frame;
use convert::Converter;
pub use hw::HwDevice;
use hw::{download, is_hw_frame};
pub use info::{
    cuda_decoder, decoders_of, hwaccel_types, init, library_versions, pick_stream,
    read_only_stream, release, stream_facts, DecoderInfo, StreamFacts,
};
use keep::{open_bytes, to_close, CONVERTER_BYTES};
use open::open_for_decoding;
use reuse::{announce_extradata, DecoderKey, Spares};
pub use scan::{build_index, build_index_of, scan_by_decoding, DecodeScan};
use scan::{frame_damaged, read_packet};
use seek::{reposition, Sync};

/// Videos a backend keeps open between runs.
const OPEN_VIDEOS: usize = 4;

pub(super) fn open_decoder(
    input: &ff::format::context::Input,
    index: usize,
    threads: usize,
    hw: Option<&HwDevice>,
) -> Result<ff::decoder::Video, String> {
    let st = input
        .stream(index)
        .ok_or_else(|| format!("stream {index} does not exist"))?;
    let mut ctx =
        ff::codec::context::Context::from_parameters(st.parameters()).map_err(|e| e.to_string())?;
    let tb = st.time_base();
    // SAFETY: `ctx` owns a valid AVCodecContext not yet opened; pkt_timebase is a plain field that
    // avcodec_open2 reads.
    unsafe {
        (*ctx.as_mut_ptr()).pkt_timebase = tb.into();
        (*ctx.as_mut_ptr()).max_pixels = open::max_pixels_option();
    }
    match hw {
        None => ctx.set_threading(ff::codec::threading::Config::count(threads)),
        Some(device) => {
            let id = st.parameters().id();
            let Some(codec) = cuda_decoder(id) else {
                return Err(format!("FFmpeg has no CUDA hwaccel for {}", id.name()));
            };
            // One thread: NVDEC does the work; frame threads would only add latency and surfaces.
            ctx.set_threading(ff::codec::threading::Config::count(1));
            device.attach(&mut ctx)?;
            return ctx
                .decoder()
                .open_as(codec)
                .and_then(|o| o.video())
                .map_err(|e| format!("cannot open {} on NVDEC: {e}", id.name()));
        }
    }
    ctx.decoder()
        .video()
        .map_err(|e| format!("no decoder for {}: {e}", st.parameters().id().name()))
}

/// One open video: demuxer, decoder, and where the decoder stands.
struct OpenVideo {
    path: PathBuf,
    /// The checked file this context reads (kept open for reopens: they read the same file).
    file: Arc<CheckedFile>,
    /// The index this context was opened for.
    index: Arc<VideoIndex>,
    stream: usize,
    input: ff::format::context::Input,
    decoder: ff::decoder::Video,
    /// Index of the frame the decoder will output next, when it is positioned mid-stream.
    next_frame: Option<usize>,
    /// After a seek: packets are dropped until the run's keyframe packet arrives.
    sync: Option<Sync>,
    converter: Option<Converter>,
    /// What a spare decoder must match to decode this video ([`reuse`]); None: never reused.
    key: Option<DecoderKey>,
    /// The decoder was another video's: the first packet sent carries this video's parameter sets.
    announce: bool,
    /// How this backend opens a decoder (threads, device): a read from the start of the file gets a
    /// fresh one, as the CLI's.
    threads: usize,
    hw: Option<HwDevice>,
    /// A paletted stream's first palette, and whether the next packet sent must carry it ([`palette`]).
    palette: Option<Vec<u8>>,
    palette_due: bool,
}

/// Where a run's decoder came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opened {
    /// The video was open on this backend already.
    Kept,
    /// A new decoder.
    New,
    /// A spare decoder of another video with the same key ([`reuse`]).
    Reused,
}

/// The FFmpeg backend: CPU decoding, or NVDEC when given a [`HwDevice`]. One per decode thread.
pub struct FfmpegBackend {
    /// libavcodec threads per decoder context (1 = the fleet's threads are the parallelism).
    threads_per_decoder: usize,
    /// The GPU this backend decodes on (FFmpeg's CUDA hwaccel), or None for the CPU.
    hw: Option<HwDevice>,
    open: VecDeque<OpenVideo>,
    /// Decoders of videos no longer open, for the next video of the same parameters.
    spares: Spares,
}

impl FfmpegBackend {
    pub fn new(threads_per_decoder: usize) -> Self {
        init();
        FfmpegBackend {
            threads_per_decoder,
            hw: None,
            open: VecDeque::new(),
            spares: Spares::default(),
        }
    }

    /// A backend that decodes on the GPU of `device` through FFmpeg's CUDA hwaccel. Videos whose codec
    /// has no CUDA hwaccel, or whose stream NVDEC refuses, fail with [`DecodeError::Unsupported`] or
    /// [`DecodeError::Backend`]; the caller decides whether to retry on the CPU.
    pub fn on_gpu(device: HwDevice) -> Self {
        init();
        FfmpegBackend {
            threads_per_decoder: 1,
            hw: Some(device),
            open: VecDeque::new(),
            spares: Spares::default(),
        }
    }

    /// An open context for this video, reused only for the same index (a changed file, or one re-indexed
    /// after damage, gets a new index and so a fresh demuxer and decoder).
    fn open_video(&mut self, source: &VideoSource) -> Result<(OpenVideo, Opened), DecodeError> {
        let (path, index) = (source.path.as_path(), &source.index);
        let stream = index.stream;
        if let Some(pos) = self
            .open
            .iter()
            .position(|v| v.path == path && Arc::ptr_eq(&v.index, index))
        {
            if let Some(v) = self.open.remove(pos) {
                return Ok((v, Opened::Kept));
            }
        }
        // The descriptor the catalogue checked; tools and tests that build sources by hand give none, and
        // their (trusted) path is opened here.
        let file = match &source.file {
            Some(f) => f.clone(),
            None => Arc::new(
                CheckedFile::open_trusted(path).map_err(|e| DecodeError::Open {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?,
            ),
        };
        let mut input = open_for_decoding(&file, index).map_err(|e| DecodeError::Open {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        read_only_stream(&mut input, stream);
        let key = match self.hw {
            None => DecoderKey::of(&input, stream, index),
            Some(_) => None,
        };
        let spare = key.as_ref().and_then(|k| self.spares.take(k));
        let announce = spare.is_some();
        let decoder = match spare {
            Some(decoder) => decoder,
            None => open_decoder(&input, stream, self.threads_per_decoder, self.hw.as_ref())
                .map_err(|reason| DecodeError::Unsupported {
                    path: path.to_owned(),
                    reason,
                })?,
        };
        let opened = if announce {
            Opened::Reused
        } else {
            Opened::New
        };
        let palette = (index.pixel_format == "pal8")
            .then(|| palette::first_palette(&file, stream))
            .flatten();
        let video = OpenVideo {
            path: path.to_owned(),
            file,
            index: index.clone(),
            stream,
            input,
            decoder,
            next_frame: None,
            sync: None,
            converter: None,
            key,
            announce,
            palette,
            palette_due: true,
            threads: self.threads_per_decoder,
            hw: match &self.hw {
                Some(h) => Some(h.new_ref().map_err(|reason| DecodeError::Backend {
                    path: path.to_owned(),
                    reason,
                })?),
                None => None,
            },
        };
        Ok((video, opened))
    }

    /// Keeps `video` open as the most recent; the least recent beyond [`OPEN_VIDEOS`] closes, its decoder
    /// kept as a spare when it may be reused. A run that `yielded` at a slice's end continues from where
    /// its decoder stopped, so its video stays open whatever its size: closed, each slice of an 8K run
    /// decoded again from the keyframe (n frames of a GOP cost n(n+1)/2 decodes: probe D).
    fn keep(&mut self, mut video: OpenVideo, yielded: bool) {
        if !yielded
            && video
                .converter
                .as_ref()
                .is_some_and(|c| c.bytes() > CONVERTER_BYTES)
        {
            video.converter = None;
        }
        self.open.push_front(video);
        let mut estimates: Vec<usize> = self.open.iter().map(open_bytes).collect();
        if yielded {
            estimates[0] = 0;
        }
        for _ in 0..to_close(&estimates) {
            let Some(old) = self.open.pop_back() else {
                break;
            };
            if let Some(key) = old.key {
                self.spares.keep(key, old.decoder); // within the spares' own byte bounds
            }
        }
    }
}

impl FfmpegBackend {
    /// Videos kept open.
    #[cfg(test)]
    fn open_count(&self) -> usize {
        self.open.len()
    }

    /// `run` decoded in a time slice that is already over: the backend stops at its first frame
    /// boundary where it may (`first`: the run's first slice, which must give a frame).
    #[cfg(test)]
    fn decode_one_slice(
        &mut self,
        source: &VideoSource,
        run: &GopRun,
        geometry: Geometry,
        first: bool,
    ) -> Result<RunOutput, DecodeError> {
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let _slice =
            crate::decode::cancel::Scope::slice(flag, Some(std::time::Instant::now()), first);
        self.decode_run(source, run, geometry, None)
    }
}

impl Backend for FfmpegBackend {
    fn idle(&mut self) {
        use std::os::unix::fs::MetadataExt;
        // An idle daemon kept the last videos its threads read open, deleted ones included, until the
        // threads opened others (probe R2: 6-8 descriptors of "(deleted)" files).
        self.open
            .retain(|v| v.file.file.metadata().map_or(true, |m| m.nlink() > 0));
    }

    fn decode_run(
        &mut self,
        source: &VideoSource,
        run: &GopRun,
        geometry: Geometry,
        sink: Option<&Sink>,
    ) -> Result<RunOutput, DecodeError> {
        let index = &source.index;
        let (mut video, opened) = self.open_video(source)?;
        let mut result = decode_in(&mut video, index, run, geometry, sink);
        if let Ok(out) = &mut result {
            out.decoders_opened = (opened != Opened::Kept) as u64;
            out.decoders_reused = (opened == Opened::Reused) as u64;
        }
        match &result {
            // A video that failed mid-run is reopened next time rather than trusted.
            Ok(out) => self.keep(video, out.yielded),
            Err(_) => drop(video),
        }
        result
    }
}

fn decode_in(
    video: &mut OpenVideo,
    index: &VideoIndex,
    run: &GopRun,
    geometry: Geometry,
    sink: Option<&Sink>,
) -> Result<RunOutput, DecodeError> {
    let (Some(&first), Some(&last)) = (run.wanted.first(), run.wanted.last()) else {
        return Ok(RunOutput::default());
    };
    let path = video.path.clone();
    let backend_err = |reason: String| DecodeError::Backend {
        path: path.clone(),
        reason,
    };
    let continue_here = video
        .next_frame
        .is_some_and(|n| run.keyframe <= n && n <= first);
    if !continue_here {
        reposition(video, index, run.keyframe, 0).map_err(backend_err)?;
    }
    // The index's size is the video's native output size: frames of another size (the stream changed
    // size) are scaled as the CLI scales them.
    let native = (index.width, index.height);
    let mut out = RunOutput::default();
    let mut emitted = vec![false; run.wanted.len()];
    let mut given = 0;
    let mut frame = ff::frame::Video::empty();
    let mut packet = ff::Packet::empty();
    let mut eof = false;
    let mut done = false;
    let last_pts = index.frames.at(last).pts;
    // Only a clean packet-scan table can be wrong about damage; decode-scan tables already account for it.
    let watch_damage = index.method == IndexMethod::PacketScan;
    // On a clean file the decoder gives frames in the table's order: the last one it gave (from the
    // keyframe on), and those of this run's packets it has been sent and not given yet.
    let mut previous: Option<usize> = None;
    let mut sent = std::collections::BTreeSet::new();
    let watch_order = watch_damage && index.seek == SeekMode::ByPts;
    // The keyframe the decoder started from (earlier than the run's after a retry, below).
    let mut from = run.keyframe;
    loop {
        while !done {
            while video.decoder.receive_frame(&mut frame).is_ok() {
                out.decoded += 1;
                let k = match index.seek {
                    SeekMode::ByPts => {
                        let pts = frame.pts().or(frame.timestamp());
                        if let Some(sync) = video.sync {
                            // Synced by decoded frames: the first keyframe the decoder gives must be the
                            // run's or an earlier one; what comes before it lacks its references.
                            match pts {
                                Some(p) if frame.is_key() && p <= sync.target => video.sync = None,
                                Some(p) if frame.is_key() => {
                                    tracing::trace!(path = %video.path.display(), pts = p, target = sync.target, "seek overshot the keyframe");
                                    reposition(video, index, from, sync.attempt + 1)
                                        .map_err(backend_err)?;
                                    break;
                                }
                                _ => continue,
                            }
                        }
                        match pts.and_then(|p| index.frame_of_pts(p)) {
                            Some(k) => k,
                            None => {
                                // Not in the table (a leading frame of an open GOP, or unknown pts). Past the last
                                // wanted pts means the wanted frames are not coming.
                                if pts.is_some_and(|p| p > last_pts) {
                                    done = true;
                                    break;
                                }
                                continue;
                            }
                        }
                    }
                    SeekMode::FromStart => video.next_frame.unwrap_or(0),
                };
                // Damage counts from the run's keyframe on: frames before it (leading frames of an open GOP
                // after a seek) lack their references and are flagged corrupt in any clean file.
                if watch_damage && k >= run.keyframe && frame_damaged(&frame) {
                    video.next_frame = None;
                    return Err(DecodeError::Damaged {
                        path: path.clone(),
                        frame: k,
                    });
                }
                if watch_order && k >= run.keyframe {
                    // A frame out of the table's order (given after a later one, or before an earlier one
                    // it was sent): the container's timestamps disagree with the order the decoder shows the
                    // pictures in (damaged composition offsets). Which pixels a frame number names would
                    // then depend on which frames a request decodes; a decode table is the decoder's order.
                    sent.remove(&k);
                    if previous.is_some_and(|p| k <= p)
                        || sent.range(run.keyframe..k).next().is_some()
                    {
                        video.next_frame = None;
                        return Err(DecodeError::Damaged {
                            path: path.clone(),
                            frame: k,
                        });
                    }
                    previous = Some(k);
                }
                video.next_frame = Some(k + 1);
                if let Ok(slot) = run.wanted.binary_search(&k) {
                    if !emitted[slot] {
                        emitted[slot] = true;
                        given += 1;
                        let mut place = sink.and_then(|s| s.take(k));
                        let converted = if is_hw_frame(&frame) {
                            let host = download(&frame).map_err(backend_err)?;
                            convert_frame(
                                &mut video.converter,
                                &host,
                                geometry,
                                native,
                                place.as_deref_mut(),
                            )
                        } else {
                            convert_frame(
                                &mut video.converter,
                                &frame,
                                geometry,
                                native,
                                place.as_deref_mut(),
                            )
                        }
                        .map_err(backend_err)?;
                        match (converted, place) {
                            (Some(f), _) => out.frames.push((k, Arc::new(f))),
                            (None, Some(p)) => {
                                out.sunk.push(k);
                                // Another request waits on this run too: it gets the frame as a frame.
                                if sink.is_some_and(Sink::shared) {
                                    let mut data = crate::decode::pool::take(p.len());
                                    data.extend_from_slice(&p);
                                    let (width, height) = geometry.display_dims();
                                    out.frames.push((
                                        k,
                                        Arc::new(Frame {
                                            width,
                                            height,
                                            data,
                                        }),
                                    ));
                                }
                            }
                            (None, None) => {
                                return Err(backend_err("converter wrote no frame".into()))
                            }
                        }
                    }
                }
                if k >= last {
                    done = true;
                    break;
                }
                // Past the end of its time slice, the run stops at this frame: the decoder stands at
                // k + 1, where a run of the frames still wanted continues without a seek. Not while
                // draining the decoder at the end of the file or decoding the GOP before (neither can go
                // on), and a continuation that had to seek back only once it gave a wanted frame
                // ([`crate::decode::cancel::first_slice`]): each stop is progress.
                if !eof
                    && from == run.keyframe
                    && k >= run.keyframe
                    && (given > 0 || continue_here || crate::decode::cancel::first_slice())
                    && crate::decode::cancel::yield_due()
                {
                    out.yielded = true;
                    done = true;
                    break;
                }
            }
            if done || eof {
                break;
            }
            // Asked to stop (past the deadline, or nobody waits): between packets, the decoder dropped.
            if crate::decode::cancel::requested() {
                return Err(DecodeError::Cancelled { path });
            }
            match read_packet(&mut packet, &mut video.input) {
                Ok(()) => {
                    if packet.stream() != video.stream {
                        continue;
                    }
                    if let Some(sync) = video.sync.filter(|s| !s.by_frame) {
                        match packet.pts() {
                            Some(p) if p == sync.target => video.sync = None,
                            Some(p) if p > sync.target => {
                                // Every packet before a keyframe in decode order is shown before it: this
                                // seek landed past the keyframe. Aim earlier.
                                tracing::trace!(path = %video.path.display(), pts = p, target = sync.target, "seek overshot the keyframe");
                                reposition(video, index, from, sync.attempt + 1)
                                    .map_err(backend_err)?;
                                continue;
                            }
                            // Before the keyframe: not part of the run.
                            _ => continue,
                        }
                    }
                    // Only inside the run: packets past its last frame (read ahead in decode order) go to the
                    // decoder, so the next run of this video can continue from here without a seek and find
                    // every frame it wants.
                    if disposable_unwanted(&packet, index, &run.wanted).is_some_and(|k| k <= last) {
                        out.skipped += 1;
                        continue;
                    }
                    if video.announce {
                        video.announce = false;
                        if let Some(key) = &video.key {
                            if !announce_extradata(&mut packet, key.extradata()) {
                                return Err(backend_err("cannot attach parameter sets".into()));
                            }
                        }
                    }
                    if video.palette_due {
                        video.palette_due = false;
                        if let Some(p) = &video.palette {
                            if !palette::attach(&mut packet, p) {
                                return Err(backend_err("cannot attach the palette".into()));
                            }
                        }
                    }
                    if watch_order {
                        if let Some(k) = packet.pts().and_then(|p| index.frame_of_pts(p)) {
                            sent.insert(k);
                        }
                    }
                    let logged = info::decoder_errors();
                    let sent_packet = video.decoder.send_packet(&packet);
                    if watch_damage && info::decoder_errors() > logged {
                        // Damage the decoder concealed and only logged (HEVC): the picture holds
                        // bytes it never wrote. Indexed by decoding from now on, like flagged damage.
                        video.next_frame = None;
                        return Err(DecodeError::Damaged {
                            path: path.clone(),
                            frame: run.keyframe,
                        });
                    }
                    if let Err(e) = sent_packet {
                        tracing::trace!(path = %video.path.display(), error = %e, "decoder rejected packet");
                        if watch_damage && matches!(e, ff::Error::InvalidData) {
                            video.next_frame = None;
                            return Err(DecodeError::Damaged {
                                path: path.clone(),
                                frame: run.keyframe,
                            });
                        }
                    }
                }
                Err(e) => {
                    if let Some(sync) = video.sync {
                        // The keyframe never came: aim earlier.
                        reposition(video, index, from, sync.attempt + 1).map_err(backend_err)?;
                        continue;
                    }
                    if !matches!(e, ff::Error::Eof) {
                        tracing::debug!(path = %video.path.display(), error = %e, "read stopped early");
                    }
                    let _ = video.decoder.send_eof();
                    eof = true;
                }
            }
        }
        if eof {
            // The decoder is drained; the next run must flush and seek.
            video.next_frame = None;
        }
        // FFmpeg 5.1's H.264 decoder, drained at the end of the file, drops a picture it decoded after a
        // seek to an open-GOP I frame and before it output that I frame (not yet marked "recovered"): the
        // last frames of such a file never come from that keyframe. Decoding again from the keyframe before
        // gives them, as the CLI, which decodes the whole file, does; frames already given are not given
        // again. Once per run.
        if !(eof
            && from == run.keyframe
            && run.keyframe > 0
            && index.seek == SeekMode::ByPts
            && emitted.contains(&false))
        {
            break;
        }
        from = index.keyframe_before(run.keyframe - 1);
        tracing::debug!(path = %path.display(), keyframe = run.keyframe, from, "frames missing at the end of the file; decoding again from the keyframe before");
        reposition(video, index, from, 0).map_err(backend_err)?;
        previous = None;
        sent.clear();
        eof = false;
        done = false;
    }
    out.frames.sort_by_key(|(k, _)| *k);
    if out.yielded {
        return Ok(out);
    }
    let missing: Vec<usize> = run
        .wanted
        .iter()
        .zip(&emitted)
        .filter(|(_, e)| !**e)
        .map(|(k, _)| *k)
        .collect();
    if !missing.is_empty() {
        video.next_frame = None;
        if watch_damage {
            // The packet scan counted a frame the decoder does not give (a picture dropped for damage
            // inside its coded data, or timestamps that name another picture): the table is wrong from
            // here on, so the file is indexed again by decoding and the request resolved against that.
            return Err(DecodeError::Damaged {
                path: path.clone(),
                frame: missing[0],
            });
        }
        return Err(DecodeError::MissingFrames {
            path: video.path.clone(),
            frames: missing,
            detail: format!(
                " (decoded {} frames from keyframe {} without producing them)",
                out.decoded, run.keyframe
            ),
        });
    }
    Ok(out)
}

/// A packet whose frame is not wanted and that no other frame references: decoding it would change
/// nothing the run returns, so it is never sent to the decoder. Only for H.264 (nal_ref_idc is explicit)
/// and cleanly packet-scanned videos. Returns that frame's index.
fn disposable_unwanted(packet: &ff::Packet, index: &VideoIndex, wanted: &[usize]) -> Option<usize> {
    // Only files whose packet scan was clean: there each packet's pts names exactly one frame, and no
    // decode error makes concealment depend on which frames were decoded.
    let (Some(n), SeekMode::ByPts, IndexMethod::PacketScan) =
        (index.h264_nal_length, index.seek, index.method)
    else {
        return None;
    };
    let k = packet.pts().and_then(|p| index.frame_of_pts(p))?;
    if wanted.binary_search(&k).is_ok() {
        return None;
    }
    packet
        .data()
        .is_some_and(|d| h264::h264_disposable(d, n))
        .then_some(k)
}
