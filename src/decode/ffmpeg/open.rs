//! Opening media for FFmpeg: only the file that was checked, only through the file protocol, only as a
//! container real video datasets use.
//!
//! Input: a [`CheckedFile`] (a descriptor of a regular file, opened beneath a dataset root by
//! [`crate::dataset`], or by a trusted path for tools). Output: an FFmpeg `Input` reading that same open
//! file through `/proc/self/fd/N` (the kernel resolves it to the open file, whatever its path names by
//! now), with the options `protocol_whitelist=file` (no network, no nested protocols) and
//! `format_whitelist=`[`DEMUXERS`] (no playlist, concat or image-sequence demuxer that would open other
//! files; no exotic demuxer for a file that only claims to be video).
//!
//! Invariant: every FFmpeg open of a video in the daemon (index builds, decode scans, decode runs and
//! their reopens) goes through [`open_input`].

use std::ptr;

use ffmpeg_next as ff;

use crate::dataset::CheckedFile;
use crate::decode::faults::{self, Stage};
use crate::index::VideoIndex;

/// The demuxers FFmpeg may pick (its names; a match on any name of a multi-name demuxer such as
/// `mov,mp4,m4a,3gp,3g2,mj2` counts): MP4/MOV/3GP, Matroska/WebM, AVI, MPEG program and transport
/// streams, FLV, Ogg, ASF/WMV, NUT, IVF, Y4M, DV, MXF, raw H.264/HEVC/MPEG-4/MPEG-1/2/VC-1/AV1/MJPEG
/// elementary streams, and animated GIF (datasets such as TGIF). None of them opens another file. (A
/// raw MJPEG file FFmpeg probes as `jpeg_pipe`, whose frames did not all come back exact: refused.)
pub const DEMUXERS: &str =
    "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi,mpeg,mpegts,mpegvideo,flv,ogg,\
asf,nut,ivf,yuv4mpegpipe,dv,mxf,h264,hevc,m4v,vc1,obu,mjpeg,gif";

/// The only protocol FFmpeg may use.
pub const PROTOCOLS: &str = "file";

/// Pixels a video frame may have (`--max-side` squared; 8192² = 64 Mpx by default, 8K UHD is 33 Mpx),
/// set once at start-up ([`set_max_side`]). Every decoder context gets it as `max_pixels`, those stream
/// probing opens included, so a file whose headers claim frames of 16000x16000 fails at once instead
/// of decoding 400 MB pictures for minutes; the index build ([`super::scan::build_index_of`]) refuses
/// such a stream before anything is decoded.
static MAX_PIXELS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(8192 * 8192);

/// Bounds the frames every later open decodes at `side` x `side` pixels.
pub fn set_max_side(side: u32) {
    let side = u64::from(side.max(1));
    MAX_PIXELS.store(side * side, std::sync::atomic::Ordering::Relaxed);
}

/// The bound of [`set_max_side`], in pixels.
pub fn max_pixels() -> u64 {
    MAX_PIXELS.load(std::sync::atomic::Ordering::Relaxed)
}

/// `max_pixels` as an AVCodecContext holds it.
pub(super) fn max_pixels_option() -> i64 {
    i64::try_from(max_pixels()).unwrap_or(i64::MAX)
}

/// Streams a file may have. Stream probing opens a decoder for every stream and decodes a few of its
/// frames: a 1.7 MB Matroska file of 1000 tiny video streams took 1.5 GB and 2.3 s per open (8 at once
/// 7.5 GB). Real dataset videos have a video stream or a few, some audio and subtitle tracks.
pub const MAX_STREAMS: usize = 64;

/// Video streams a file may have (each is probed by decoding).
pub const MAX_VIDEO_STREAMS: usize = 8;

/// Why a file could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// FFmpeg's own error (a missing file, a header it cannot read, a format not allowed).
    Ffmpeg(ff::Error),
    /// More streams than [`MAX_STREAMS`], or video streams than [`MAX_VIDEO_STREAMS`]: refused before
    /// stream probing.
    TooManyStreams { streams: usize, video: usize },
    /// An MP4/MOV FFmpeg could not open whose boxes end early or lack the index ([`iso_truncation`]).
    Truncated(String),
    /// A header FFmpeg could not open whose frame size is over [`max_pixels`] ([`y4m_too_large`]).
    TooLarge(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // FFmpeg's own words are errno strings; say what they mean for a file opened as video.
            OpenError::Ffmpeg(e @ ff::Error::Other { errno: libc::EINVAL }) => write!(
                f,
                "not a video container vserve opens ({e}: FFmpeg found another format or none; vserve \
                 reads MP4/MOV, Matroska/WebM, AVI, MPEG-PS/TS, FLV, Ogg, ASF, NUT, IVF, Y4M, DV, MXF, \
                 raw H.264/HEVC/MPEG-4/VC-1/AV1 and GIF)"
            ),
            OpenError::Ffmpeg(ff::Error::Eof) => {
                write!(f, "the file ends inside its header (End of file): truncated")
            }
            // FFmpeg says this of a file of no format it knows as well as of a damaged header.
            OpenError::Ffmpeg(e @ ff::Error::InvalidData) => {
                write!(
                    f,
                    "not a video container vserve opens, or its header is damaged ({e})"
                )
            }
            OpenError::Ffmpeg(e @ ff::Error::Other { errno: libc::EIO }) => {
                write!(f, "its header cannot be read ({e}): truncated or damaged")
            }
            OpenError::Ffmpeg(e) => e.fmt(f),
            OpenError::Truncated(how) => write!(f, "truncated: {how}"),
            OpenError::TooLarge(what) => write!(f, "frames too large: {what}"),
            OpenError::TooManyStreams { streams, video } => write!(
                f,
                "too many streams: {streams} streams, {video} of them video (vserve opens files of at \
                 most {MAX_STREAMS} streams and {MAX_VIDEO_STREAMS} video streams)"
            ),
        }
    }
}

impl std::error::Error for OpenError {}

impl From<ff::Error> for OpenError {
    fn from(e: ff::Error) -> Self {
        OpenError::Ffmpeg(e)
    }
}

/// Streams of an open context, and how many of them are video.
///
/// # Safety
/// `ctx` must be a valid, opened AVFormatContext.
unsafe fn count_streams(ctx: *const ff::ffi::AVFormatContext) -> (usize, usize) {
    let n = (*ctx).nb_streams as usize;
    let video = (0..n)
        .filter(|&i| {
            let st = *(*ctx).streams.add(i);
            !st.is_null()
                && !(*st).codecpar.is_null()
                && (*(*st).codecpar).codec_type == ff::ffi::AVMediaType::AVMEDIA_TYPE_VIDEO
        })
        .count();
    (n, video)
}

/// Opens `file` for demuxing. `find_stream_info` runs FFmpeg's stream probing (which decodes a few
/// frames) after the header is read; without it only the header is read. `stage` names who opens, for
/// the test-only fault hooks ([`faults`]). A file of more than [`MAX_STREAMS`] streams or
/// [`MAX_VIDEO_STREAMS`] video streams is refused after its header, before any probing (demuxers that
/// find streams while probing, such as MPEG-TS, may create no more than [`MAX_STREAMS`]).
pub fn open_input(
    file: &CheckedFile,
    find_stream_info: bool,
    stage: Stage,
) -> Result<ff::format::context::Input, OpenError> {
    faults::at_open(stage, &file.path);
    let url = std::ffi::CString::new(file.proc_path().as_os_str().to_string_lossy().as_bytes())
        .map_err(|_| ff::Error::InvalidData)?;
    let mut options = ff::Dictionary::new();
    options.set("format_whitelist", DEMUXERS);
    options.set("protocol_whitelist", PROTOCOLS);
    let mut ctx: *mut ff::ffi::AVFormatContext = ptr::null_mut();
    // SAFETY: `ctx` is a null out-pointer, `url` a valid C string and `opts` an owned dictionary (or
    // null) that avformat_open_input may replace with the options it did not consume; it is owned
    // again right after. On failure FFmpeg frees the context and leaves `ctx` null.
    let ret = unsafe {
        let mut opts = options.disown();
        let ret = ff::ffi::avformat_open_input(&mut ctx, url.as_ptr(), ptr::null(), &mut opts);
        drop(ff::Dictionary::own(opts));
        ret
    };
    if ret < 0 || ctx.is_null() {
        let e = ff::Error::from(ret.min(-1));
        if let Some(what) = y4m_too_large(file) {
            return Err(OpenError::TooLarge(what));
        }
        if matches!(e, ff::Error::InvalidData | ff::Error::Eof) {
            if let Some(how) = iso_truncation(file) {
                return Err(OpenError::Truncated(how));
            }
        }
        return Err(e.into());
    }
    // SAFETY: `ctx` is a valid, opened AVFormatContext, closed here when refused.
    let refused = unsafe {
        let (streams, video) = count_streams(ctx);
        (streams > MAX_STREAMS || video > MAX_VIDEO_STREAMS).then(|| {
            ff::ffi::avformat_close_input(&mut ctx);
            OpenError::TooManyStreams { streams, video }
        })
    };
    if let Some(e) = refused {
        return Err(e);
    }
    if find_stream_info {
        // Demuxers that add streams while probing stop at the bound.
        // SAFETY: `ctx` is a valid, opened AVFormatContext.
        unsafe { (*ctx).max_streams = MAX_STREAMS as i32 };
        // The probing decoders get the pixel bound too: one dictionary per stream.
        // SAFETY: `ctx` is a valid, opened AVFormatContext.
        let streams = unsafe { (*ctx).nb_streams } as usize;
        let limit = max_pixels_option().to_string();
        let mut per_stream: Vec<*mut ff::ffi::AVDictionary> = (0..streams)
            .map(|_| {
                let mut d = ff::Dictionary::new();
                d.set("max_pixels", &limit);
                // SAFETY: the dictionary is owned again and freed below.
                unsafe { d.disown() }
            })
            .collect();
        // SAFETY: `ctx` is a valid, opened AVFormatContext; `per_stream` holds one dictionary per stream
        // (avformat_find_stream_info's `options`); on failure the context is closed here and not used.
        let ret = unsafe {
            let options = if streams == 0 {
                ptr::null_mut()
            } else {
                per_stream.as_mut_ptr()
            };
            ff::ffi::avformat_find_stream_info(ctx, options)
        };
        for d in per_stream {
            // SAFETY: each entry is a dictionary disowned above (or one FFmpeg put in its place).
            drop(unsafe { ff::Dictionary::own(d) });
        }
        if ret < 0 {
            // SAFETY: `ctx` was opened by avformat_open_input and is owned by nothing else.
            unsafe { ff::ffi::avformat_close_input(&mut ctx) };
            return Err(ff::Error::from(ret).into());
        }
        // SAFETY: as above; probing may have added streams (MPEG-TS), up to MAX_STREAMS.
        let (streams, video) = unsafe { count_streams(ctx) };
        if video > MAX_VIDEO_STREAMS {
            // SAFETY: as above.
            unsafe { ff::ffi::avformat_close_input(&mut ctx) };
            return Err(OpenError::TooManyStreams { streams, video });
        }
    }
    // SAFETY: `ctx` is a valid, opened AVFormatContext that `Input` now owns and closes on drop.
    Ok(unsafe { ff::format::context::Input::wrap(ctx) })
}

/// For a file FFmpeg could not open: the frame size its YUV4MPEG2 header declares, when that is over
/// [`max_pixels`]. FFmpeg refuses such a header with an error that says nothing of size ("Device or
/// resource busy" for 60000x60000: its packet size overflows into an errno).
fn y4m_too_large(file: &CheckedFile) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; 256];
    let got = file.file.read_at(&mut head, 0).ok()?;
    let line = head[..got].strip_prefix(b"YUV4MPEG2 ")?;
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let field = |tag: u8| -> Option<u64> {
        let word = line
            .split(|&b| b == b' ')
            .find(|w| w.first() == Some(&tag))?;
        std::str::from_utf8(&word[1..]).ok()?.parse().ok()
    };
    let (w, h) = (field(b'W')?, field(b'H')?);
    let limit = max_pixels();
    (w.saturating_mul(h) > limit).then(|| {
        format!("its YUV4MPEG2 header says {w}x{h}, over the {limit} pixels this daemon decodes (--max-side squared)")
    })
}

/// The top-level boxes [`iso_truncation`] reads before it gives up (100,000 reads of 16 bytes).
const MAX_TOP_LEVEL_BOXES: usize = 100_000;

/// For a file FFmpeg could not open: how it is cut short, when it is an ISO media file (MP4, MOV, 3GP)
/// whose top-level boxes run past its end or that has no `moov` box. Most MP4s are written with their
/// index (`moov`) last, so a copy cut short, or a recording still being written, has the media data
/// and no index; FFmpeg says only "Invalid data found when processing input". An empty file, of any
/// name, is cut short too (a copy or download that never wrote it). None when the file does not start
/// with one of the top-level boxes such files start with (shorter than a box header: when its name is
/// not an ISO media one), or its boxes are whole and it has a `moov` (then it is damaged some other way).
pub fn iso_truncation(file: &CheckedFile) -> Option<String> {
    use std::os::unix::fs::FileExt;
    const STILL: &str = "cut short, or still being written";
    const NO_INDEX: &str = "no 'moov' box (the index an MP4 needs)";
    const ISO_NAMES: [&str; 9] = ["mp4", "m4v", "mov", "qt", "3gp", "3g2", "mj2", "m4a", "f4v"];
    let len = file.file.metadata().ok()?.len();
    if len == 0 {
        return Some("the file is empty (0 bytes): cut short, or never written".into());
    }
    let (mut at, mut moov) = (0u64, false);
    // A real file has a handful of top-level boxes (a fragmented one a pair a fragment); a file of
    // millions of empty boxes is read no further than this (one read a box).
    for _ in 0..MAX_TOP_LEVEL_BOXES {
        if at >= len {
            break;
        }
        let mut head = [0u8; 16];
        let got = file.file.read_at(&mut head, at).ok()?;
        // A few bytes and nothing else tell nothing by themselves: an MP4 cut there, or a note named so.
        let iso_name = || {
            let ext = file.path.extension().and_then(|e| e.to_str());
            ext.is_some_and(|e| ISO_NAMES.iter().any(|n| e.eq_ignore_ascii_case(n)))
        };
        // Or a short text (`hello` named clip.mp4): no box header starts with text, its size field
        // being zero bytes before a real box's small size.
        let text = || {
            head[..got]
                .iter()
                .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace())
        };
        if got < 8 && at == 0 && (!iso_name() || text()) {
            return None;
        }
        if got < 8 {
            let index = if moov {
                String::new()
            } else {
                format!(" and has {NO_INDEX}")
            };
            return Some(format!(
                "it ends inside a box header ({} bytes at {at}){index}: {STILL}",
                len - at
            ));
        }
        let kind = &head[4..8];
        let first = at == 0;
        if first
            && !matches!(
                kind,
                b"ftyp" | b"moov" | b"mdat" | b"free" | b"wide" | b"skip" | b"pnot"
            )
        {
            return None;
        }
        if !kind.iter().all(|b| b.is_ascii_alphanumeric() || *b == b' ') {
            return None; // not a box: damaged, not cut
        }
        let size = match u32::from_be_bytes([head[0], head[1], head[2], head[3]]) {
            0 => len - at,
            1 if got < 16 => u64::MAX,
            1 => u64::from_be_bytes(head[8..16].try_into().ok()?),
            s => u64::from(s),
        };
        if size < 8 {
            return None;
        }
        moov |= kind == b"moov";
        let name = String::from_utf8_lossy(kind);
        if size > len - at {
            let have = len - at;
            let index = if moov {
                String::new()
            } else {
                format!(", and it has {NO_INDEX}")
            };
            let of = if size == u64::MAX {
                String::new()
            } else {
                format!(" of its {size}")
            };
            return Some(format!(
                "it ends inside its '{name}' box ({have}{of} bytes){index}: {STILL}"
            ));
        }
        at += size;
    }
    (!moov && at >= len && len > 0).then(|| format!("it has {NO_INDEX}: {STILL}"))
}

/// Opens a file the index already describes. For MP4/MOV and Matroska/WebM the container header holds
/// everything decoding needs, so FFmpeg's stream probing (`avformat_find_stream_info`, which decodes
/// frames and costs ~2 ms per open against ~0.2 ms without) is skipped when the header's stream matches the
/// index (codec and size). Other containers, or any mismatch, get the full open.
pub(super) fn open_for_decoding(
    file: &CheckedFile,
    index: &VideoIndex,
) -> Result<ff::format::context::Input, OpenError> {
    let input = open_input(file, false, Stage::Decode)?;
    let container = input.format().name().to_owned();
    let header_is_enough = container.starts_with("mov,mp4") || container.starts_with("matroska");
    let matches = input.stream(index.stream).is_some_and(|st| {
        let params = st.parameters();
        // SAFETY: `params` wraps the stream's valid AVCodecParameters for the life of `input`.
        let (w, h) = unsafe { ((*params.as_ptr()).width, (*params.as_ptr()).height) };
        params.id().name() == index.codec && w as u32 == index.width && h as u32 == index.height
    });
    if header_is_enough && matches {
        Ok(input)
    } else {
        drop(input);
        open_input(file, true, Stage::Decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn media(rel: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/media")
            .join(rel)
    }

    #[test]
    fn every_video_of_the_corpus_opens_and_other_formats_do_not() {
        super::super::init();
        let mut videos = Vec::new();
        let mut stack = vec![media("")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if crate::dataset::is_video(&p) {
                    videos.push(p);
                }
            }
        }
        assert!(videos.len() >= 20, "{videos:?}");
        for v in &videos {
            let f = CheckedFile::open_trusted(v).unwrap();
            let input = open_input(&f, true, Stage::Index)
                .unwrap_or_else(|e| panic!("{} does not open: {e}", v.display()));
            assert!(input.streams().count() > 0, "{}", v.display());
        }
        // A WAV file is media FFmpeg reads, but no video container: refused by the whitelist.
        let dir = tempfile::tempdir().unwrap();
        let wav = dir.path().join("tone.mp4");
        let mut bytes = b"RIFF".to_vec();
        bytes.extend(36u32.to_le_bytes().iter().chain(b"WAVEfmt "));
        bytes.extend(16u32.to_le_bytes());
        bytes.extend([1, 0, 1, 0]);
        bytes.extend(8000u32.to_le_bytes());
        bytes.extend(8000u32.to_le_bytes());
        bytes.extend([1, 0, 8, 0]);
        bytes.extend(b"data");
        bytes.extend(8000u32.to_le_bytes());
        bytes.extend(vec![128u8; 8000]);
        std::fs::write(&wav, &bytes).unwrap();
        let f = CheckedFile::open_trusted(&wav).unwrap();
        // Without the whitelist FFmpeg opens it as WAV.
        assert!(ff::format::input(&wav).is_ok());
        assert!(open_input(&f, true, Stage::Index).is_err());
    }

    /// An MP4 with its index last, cut in its media data, in its index or in a box header: said to be
    /// truncated, with where; whole files and files that are no ISO media are not.
    #[test]
    fn mp4s_cut_short_are_told_apart_from_damaged_ones() {
        super::super::init();
        let whole = std::fs::read(media("moviepy/chaplin.mp4")).unwrap(); // ftyp, free, mdat, moov
        let moov_at = whole.windows(4).rposition(|w| w == b"moov").unwrap() - 4;
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            let f = CheckedFile::open_trusted(&p).unwrap();
            (
                iso_truncation(&f),
                open_input(&f, true, Stage::Index)
                    .err()
                    .map(|e| e.to_string()),
            )
        };
        let (how, err) = open("in-mdat.mp4", &whole[..300_000]);
        let how = how.unwrap();
        assert!(
            how.starts_with("it ends inside its 'mdat' box (299960 of its "),
            "{how}"
        );
        assert!(how.contains("no 'moov' box"), "{how}");
        assert_eq!(err.unwrap(), format!("truncated: {how}"));
        let (how, err) = open("in-moov.mp4", &whole[..moov_at + 100]);
        let how = how.unwrap();
        assert!(
            how.starts_with("it ends inside its 'moov' box (100 of its "),
            "{how}"
        );
        assert!(!how.contains("no 'moov'"), "{how}");
        // FFmpeg opens this one (the index's first 100 bytes declare no track): the index build asks.
        assert!(err.is_none(), "{err:?}");
        let (how, _) = open("in-header.mp4", &whole[..moov_at + 5]);
        assert!(how
            .unwrap()
            .starts_with("it ends inside a box header (5 bytes at "));
        // Whole: nothing to say. Not ISO media: nothing to say. Damaged inside a whole box structure
        // (the index box renamed): no index, though nothing is cut.
        assert_eq!(open("whole.mp4", &whole).0, None);
        assert_eq!(open("text.mp4", b"hello, this is no video at all").0, None);
        // Empty, whatever its name: cut short. Shorter than a box header: cut short when named as ISO
        // media, nothing to say otherwise (the open's own error, not media, stands).
        for name in ["empty.mp4", "empty.mkv"] {
            let (how, err) = open(name, b"");
            let empty = "the file is empty (0 bytes): cut short, or never written";
            assert_eq!(how.as_deref(), Some(empty));
            assert_eq!(err.unwrap(), format!("truncated: {empty}"));
        }
        let (how, err) = open("note.txt", b"x");
        assert_eq!(how, None);
        assert!(!err.unwrap().starts_with("truncated"));
        assert!(open("cut.MOV", b"\0\0\x01")
            .0
            .unwrap()
            .starts_with("it ends inside a box header (3 bytes at 0) and has no 'moov' box"));
        // Six bytes of text named .mp4 are no MP4 cut short (they were DATA_LOSS "truncated": probe D).
        let (how, err) = open("note.mp4", b"hello\n");
        assert_eq!(how, None);
        assert!(err.unwrap().starts_with("not a video container"));
        // Past MAX_TOP_LEVEL_BOXES boxes the walk gives up rather than read one box at a time for ever.
        let mut many = b"\0\0\0\x08ftyp".to_vec();
        many.extend(b"\0\0\0\x08free".repeat(MAX_TOP_LEVEL_BOXES));
        many.extend(b"\0\0\x10\0mdat");
        assert_eq!(open("many.mp4", &many).0, None);
        many.truncate(8 * 1000);
        assert!(open("fewer.mp4", &many)
            .0
            .unwrap()
            .starts_with("it has no 'moov' box"));
        let mut renamed = whole.clone();
        renamed[moov_at + 4..moov_at + 8].copy_from_slice(b"junk");
        let (how, err) = open("no-moov.mp4", &renamed);
        assert_eq!(
            how.as_deref(),
            Some(
                "it has no 'moov' box (the index an MP4 needs): cut short, or still being written"
            )
        );
        assert!(err.unwrap().starts_with("truncated: it has no 'moov' box"));
    }
}
