//! What FFmpeg knows about a file and about itself: stream choice, stream facts (size, rotation, time base,
//! NAL framing), library versions, decoders and hwaccels (for `vserve doctor`).

use std::sync::Once;

use ffmpeg_next as ff;

static INIT: Once = Once::new();

/// Initialises FFmpeg once per process and quiets its own logging (errors are reported by vserve; set
/// `VSERVE_FFMPEG_LOG=error|warning|info|debug` to see FFmpeg's messages).
pub fn init() {
    INIT.call_once(|| {
        if let Err(e) = ff::init() {
            tracing::warn!(error = %e, "ffmpeg init failed");
        }
        let level = match std::env::var("VSERVE_FFMPEG_LOG").as_deref() {
            Ok("error") => ff::ffi::AV_LOG_ERROR,
            Ok("warning") => ff::ffi::AV_LOG_WARNING,
            Ok("info") => ff::ffi::AV_LOG_INFO,
            Ok("debug") => ff::ffi::AV_LOG_DEBUG,
            _ => ff::ffi::AV_LOG_QUIET,
        };
        // SAFETY: sets a process-global integer; FFmpeg reads it without other requirements.
        unsafe { ff::ffi::av_log_set_level(level) };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `log_callback` has the signature FFmpeg calls and forwards to its default callback.
        unsafe {
            ff::ffi::av_log_set_callback(Some(log_callback))
        };
    });
}

thread_local! {
    /// Error-level messages an HEVC decoder logged on this thread (see [`decoder_errors`]).
    static DECODER_ERRORS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Error-level messages HEVC decoders have logged on this thread so far. libavcodec's HEVC decoder
/// conceals some slice errors (`cu_qp_delta ... outside the valid range`) without flagging the frame or
/// failing the packet: the picture comes out with a region it never wrote, whose bytes depend on what
/// the decoder's buffers held before, so the same request gave different pixels. A run or a decode scan
/// compares this count before and after each packet (decoders run one thread each, on the caller's
/// thread) and treats an increase as damage, as it treats a flagged frame. Only HEVC: H.264 logs errors
/// for the leading frames of an open GOP after a seek in clean files.
pub fn decoder_errors() -> u64 {
    DECODER_ERRORS.with(|c| c.get())
}

/// A line FFmpeg is writing in pieces on this thread (see [`log_callback`]).
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
struct PendingLine {
    text: String,
    level: std::ffi::c_int,
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    static LOG_LINE: std::cell::RefCell<PendingLine> = std::cell::RefCell::default();
}

/// FFmpeg's log callback: counts HEVC decoders' error messages on this thread, then logs what
/// `VSERVE_FFMPEG_LOG` asks for through the daemon's log (target `ffmpeg`).
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn log_callback(
    avcl: *mut std::ffi::c_void,
    level: std::ffi::c_int,
    fmt: *const std::ffi::c_char,
    vl: *mut ff::ffi::__va_list_tag,
) {
    if level <= ff::ffi::AV_LOG_ERROR && !avcl.is_null() {
        // SAFETY: FFmpeg's log contexts start with a pointer to their AVClass; an AVCodecContext's
        // class is named "AVCodecContext", and only then is `avcl` read as one.
        let hevc = unsafe {
            let class = *(avcl as *const *const ff::ffi::AVClass);
            !class.is_null()
                && !(*class).class_name.is_null()
                && std::ffi::CStr::from_ptr((*class).class_name).to_bytes() == b"AVCodecContext"
                && (*(avcl as *const ff::ffi::AVCodecContext)).codec_id
                    == ff::ffi::AVCodecID::AV_CODEC_ID_HEVC
        };
        if hevc {
            DECODER_ERRORS.with(|c| c.set(c.get() + 1));
        }
    }
    // SAFETY: a plain read of FFmpeg's process-global level.
    if level > unsafe { ff::ffi::av_log_get_level() } {
        return;
    }
    // Shown (VSERVE_FFMPEG_LOG): through the daemon's own log, so that `--log-format json` stays one
    // JSON object a line (FFmpeg's default callback wrote raw text to stderr: probe C). FFmpeg may write
    // one line in several calls ("Packet corrupt (...)" then "."): pieces gather on this thread until a
    // newline, and the line takes the most severe level of its pieces.
    let mut line = [0 as std::ffi::c_char; 1024];
    let mut prefix = LOG_LINE.with(|l| l.borrow().text.is_empty()) as std::ffi::c_int;
    // SAFETY: the arguments FFmpeg passed, formatted once into a buffer of the size given.
    let n = unsafe {
        ff::ffi::av_log_format_line2(
            avcl,
            level,
            fmt,
            vl,
            line.as_mut_ptr(),
            line.len() as std::ffi::c_int,
            &mut prefix,
        )
    };
    if n < 0 {
        return;
    }
    // SAFETY: av_log_format_line2 NUL-terminates what it writes within the buffer.
    let piece = unsafe { std::ffi::CStr::from_ptr(line.as_ptr()) }.to_string_lossy();
    let Some((text, level)) = LOG_LINE.with(|l| {
        let mut l = l.borrow_mut();
        l.text.push_str(&piece);
        l.level = if l.text.len() == piece.len() {
            level
        } else {
            l.level.min(level)
        };
        // A line that never ends is cut at the buffer's size rather than held for ever.
        (l.text.ends_with('\n') || l.text.len() >= line.len()).then(|| {
            let text = std::mem::take(&mut l.text);
            (text.trim_end().to_owned(), l.level)
        })
    }) else {
        return;
    };
    if text.is_empty() {
        return;
    }
    match level {
        l if l <= ff::ffi::AV_LOG_ERROR => tracing::error!(target: "ffmpeg", "{text}"),
        l if l <= ff::ffi::AV_LOG_WARNING => tracing::warn!(target: "ffmpeg", "{text}"),
        l if l <= ff::ffi::AV_LOG_INFO => tracing::info!(target: "ffmpeg", "{text}"),
        _ => tracing::debug!(target: "ffmpeg", "{text}"),
    }
}

/// The video stream to use: `wanted` when given (it must be a video stream), else FFmpeg's best video
/// stream by `av_find_best_stream` (TorchCodec's default; `ffmpeg -i F` ranks by resolution instead and
/// differs on a few files: README "Semantics").
pub fn pick_stream(
    input: &ff::format::context::Input,
    wanted: Option<usize>,
) -> Result<usize, String> {
    match wanted {
        Some(i) => {
            // What the file does have, so that the message reads true (it said "has no video stream:
            // stream 1 is not a video stream" of a file with two: probe F).
            let videos: Vec<String> = input
                .streams()
                .filter(|s| s.parameters().medium() == ff::media::Type::Video)
                .map(|s| s.index().to_string())
                .collect();
            let has = match videos.len() {
                0 => "it has none".to_owned(),
                _ => format!("its video streams: {}", videos.join(", ")),
            };
            let Some(st) = input.stream(i) else {
                return Err(format!(
                    " numbered {i}: it has {} streams ({has})",
                    input.nb_streams()
                ));
            };
            let medium = st.parameters().medium();
            if medium != ff::media::Type::Video {
                let kind = format!("{medium:?}").to_lowercase();
                return Err(format!(" numbered {i}: stream {i} is {kind} ({has})"));
            }
            Ok(i)
        }
        None => input
            .streams()
            .best(ff::media::Type::Video)
            .map(|s| s.index())
            .ok_or_else(String::new),
    }
}

/// Makes the demuxer read only stream `keep`, as the FFmpeg CLI does with the streams it does not map
/// (`AVDISCARD_ALL`). Besides saving work, it decides where reading ends in a truncated file: an audio
/// packet past the end would otherwise stop the read before the video's own data runs out, and the
/// CLI, which never reads that audio, decodes more frames.
pub fn read_only_stream(input: &mut ff::format::context::Input, keep: usize) {
    // SAFETY: `input` wraps an open AVFormatContext whose `streams` array holds `nb_streams` valid
    // streams; `discard` is a plain field the demuxer reads on each packet.
    unsafe {
        let ctx = input.as_mut_ptr();
        for i in 0..(*ctx).nb_streams as usize {
            let st = *(*ctx).streams.add(i);
            (*st).discard = if i == keep {
                ff::ffi::AVDiscard::AVDISCARD_DEFAULT
            } else {
                ff::ffi::AVDiscard::AVDISCARD_ALL
            };
        }
    }
}

/// What the index records about a stream, read from the container.
pub struct StreamFacts {
    pub codec: String,
    pub pixel_format: String,
    pub width: u32,
    pub height: u32,
    pub rotation: u32,
    /// After the rotation, flipped left-right: the display matrix mirrors (see [`display_orientation`]).
    pub mirror: bool,
    pub time_base: (i32, i32),
    pub avg_fps: f64,
    pub nb_frames: i64,
    /// Bytes of each NAL unit's length prefix for AVCC/HVCC-framed H.264/HEVC, None otherwise.
    pub nal_length_size: Option<usize>,
}

pub fn stream_facts(
    input: &ff::format::context::Input,
    index: usize,
) -> Result<StreamFacts, String> {
    let st = input
        .stream(index)
        .ok_or_else(|| format!("stream {index} does not exist"))?;
    let params = st.parameters();
    let id = params.id();
    // SAFETY: `params` wraps the stream's valid AVCodecParameters for the life of `input`.
    let (width, height, format, extradata) = unsafe {
        let p = &*params.as_ptr();
        let extra = if p.extradata.is_null() || p.extradata_size <= 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(p.extradata, p.extradata_size as usize)
        };
        (p.width, p.height, p.format, extra.to_vec())
    };
    if width <= 0 || height <= 0 {
        return Err(format!(
            "stream {index} has no frame size ({width}x{height})"
        ));
    }

    let in_range = (0..ff::ffi::AVPixelFormat::AV_PIX_FMT_NB as i32).contains(&format);
    let pixel_format = if !in_range {
        "unknown".to_owned()
    } else {
        // SAFETY: `format` is checked to lie in 0..AV_PIX_FMT_NB, the enum's contiguous range of
        // discriminants (the bindings come from the headers this build links); av_get_pix_fmt_name returns
        // a static string or null.
        unsafe {
            let name = ff::ffi::av_get_pix_fmt_name(std::mem::transmute::<
                i32,
                ff::ffi::AVPixelFormat,
            >(format));
            if name.is_null() {
                "unknown".to_owned()
            } else {
                std::ffi::CStr::from_ptr(name)
                    .to_string_lossy()
                    .into_owned()
            }
        }
    };
    let nal_length_size = match id {
        ff::codec::Id::H264 if extradata.len() >= 7 && extradata[0] == 1 => {
            Some((extradata[4] & 3) as usize + 1)
        }
        ff::codec::Id::HEVC if extradata.len() >= 23 && extradata[0] == 1 => {
            Some((extradata[21] & 3) as usize + 1)
        }
        _ => None,
    };
    let tb = st.time_base();
    let rate = st.avg_frame_rate();
    let avg_fps = if rate.denominator() != 0 && rate.numerator() > 0 {
        rate.numerator() as f64 / rate.denominator() as f64
    } else {
        let r = st.rate();
        if r.denominator() != 0 {
            r.numerator() as f64 / r.denominator() as f64
        } else {
            0.0
        }
    };
    let (rotation, mirror) = display_orientation(input, index);
    Ok(StreamFacts {
        codec: id.name().to_owned(),
        pixel_format,
        width: width as u32,
        height: height as u32,
        rotation,
        mirror,
        time_base: (tb.numerator(), tb.denominator()),
        avg_fps,
        nb_frames: st.frames(),
        nal_length_size,
    })
}

/// The display orientation the stream's display matrix asks for, as the FFmpeg CLI's autorotation applies
/// it: a clockwise rotation (0, 90, 180 or 270) and whether the picture is then flipped left-right.
///
/// The CLI (5.1) takes `theta = -av_display_rotation_get(matrix)`, and chooses its filters by theta and
/// the matrix's signs: at 90° `transpose=clock`, or `cclock_flip` when m[3] > 0 (a mirrored matrix); at
/// 270° `cclock`, or `clock_flip` when m[3] < 0; at 180° `hflip` when m[0] < 0 and `vflip` when m[4] < 0
/// (both: a rotation); at 0° `vflip` when m[4] < 0. Each of those is a rotation followed by an optional
/// left-right flip. Other angles (the CLI's `rotate` filter) are not applied.
fn display_orientation(input: &ff::format::context::Input, index: usize) -> (u32, bool) {
    // SAFETY: `input` is a valid, open AVFormatContext and `index` < nb_streams (checked by the caller).
    // av_stream_get_side_data returns a pointer into the stream's own side data or null; 9 i32s are read
    // only when it holds at least that many bytes.
    let matrix: [i32; 9] = unsafe {
        let st = *(*input.as_ptr()).streams.add(index);
        let mut size: usize = 0;
        let data = ff::ffi::av_stream_get_side_data(
            st,
            ff::ffi::AVPacketSideDataType::AV_PKT_DATA_DISPLAYMATRIX,
            &mut size,
        );
        if data.is_null() || size < 9 * 4 {
            return (0, false);
        }
        std::ptr::read_unaligned(data as *const [i32; 9])
    };
    // SAFETY: reads the 9 values of a local matrix.
    let theta = -unsafe { ff::ffi::av_display_rotation_get(matrix.as_ptr()) };
    orientation_of(&matrix, theta)
}

/// [`display_orientation`]'s choice for a matrix and its CLI angle (degrees, counter-clockwise negated).
fn orientation_of(m: &[i32; 9], theta: f64) -> (u32, bool) {
    if !theta.is_finite() {
        return (0, false);
    }
    let theta = theta.round();
    let theta = theta - 360.0 * (theta / 360.0 + 0.9 / 360.0).floor();
    let near = |deg: f64| (theta - deg).abs() < 1.0;
    if near(90.0) {
        (90, m[3] > 0)
    } else if near(180.0) {
        match (m[0] < 0, m[4] < 0) {
            (true, true) => (180, false),
            (true, false) => (0, true),
            (false, true) => (180, true),
            (false, false) => (0, false),
        }
    } else if near(270.0) {
        (270, m[3] < 0)
    } else if theta.abs() < 1.0 {
        // vflip is a half turn flipped left-right.
        if m[4] < 0 {
            (180, true)
        } else {
            (0, false)
        }
    } else {
        (0, false)
    }
}

/// The FFmpeg libraries this process runs with: (name, version), e.g. ("libavcodec", "59.37.100").
pub fn library_versions() -> Vec<(&'static str, String)> {
    let v = |n: u32| format!("{}.{}.{}", n >> 16, (n >> 8) & 0xff, n & 0xff);
    // SAFETY: the *_version functions return a constant.
    unsafe {
        vec![
            ("libavcodec", v(ff::ffi::avcodec_version())),
            ("libavformat", v(ff::ffi::avformat_version())),
            ("libavutil", v(ff::ffi::avutil_version())),
            ("libswscale", v(ff::ffi::swscale_version())),
        ]
    }
}

/// FFmpeg's release string (`av_version_info`), e.g. "5.1.6-0+deb12u1".
pub fn release() -> String {
    // SAFETY: av_version_info returns a static C string.
    unsafe { std::ffi::CStr::from_ptr(ff::ffi::av_version_info()) }
        .to_string_lossy()
        .into_owned()
}

/// A decoder FFmpeg has for a codec, and whether it decodes through the CUDA hwaccel.
#[derive(Clone, Debug)]
pub struct DecoderInfo {
    pub name: String,
    pub cuda_hwaccel: bool,
}

/// The decoders FFmpeg has for a codec named as FFmpeg names it (`h264`, `hevc`, `vp9`, `av1`), in
/// FFmpeg's order (the first is the default), including the `*_cuvid` ones.
pub fn decoders_of(codec_name: &str) -> Vec<DecoderInfo> {
    init();
    let mut out = Vec::new();
    let mut opaque: *mut std::ffi::c_void = std::ptr::null_mut();
    loop {
        // SAFETY: as in cuda_decoder: static codecs and configs, walked through `opaque`; names are static
        // C strings.
        unsafe {
            let codec = ff::ffi::av_codec_iterate(&mut opaque);
            let Some(c) = codec.as_ref() else {
                return out;
            };
            if ff::ffi::av_codec_is_decoder(codec) == 0 {
                continue;
            }
            let id_name =
                std::ffi::CStr::from_ptr(ff::ffi::avcodec_get_name(c.id)).to_string_lossy();
            if id_name != codec_name {
                continue;
            }
            let mut cuda = false;
            let mut i = 0;
            while let Some(cfg) = ff::ffi::avcodec_get_hw_config(codec, i).as_ref() {
                cuda |= cfg.device_type == ff::ffi::AVHWDeviceType::AV_HWDEVICE_TYPE_CUDA;
                i += 1;
            }
            out.push(DecoderInfo {
                name: std::ffi::CStr::from_ptr(c.name)
                    .to_string_lossy()
                    .into_owned(),
                cuda_hwaccel: cuda,
            });
        }
    }
}

/// The hardware device types this FFmpeg was built with (`cuda`, `vaapi`, …).
pub fn hwaccel_types() -> Vec<String> {
    init();
    let mut out = Vec::new();
    let mut t = ff::ffi::AVHWDeviceType::AV_HWDEVICE_TYPE_NONE;
    loop {
        // SAFETY: av_hwdevice_iterate_types returns the next type or NONE; the name is a static string or
        // null.
        unsafe {
            t = ff::ffi::av_hwdevice_iterate_types(t);
            if t == ff::ffi::AVHWDeviceType::AV_HWDEVICE_TYPE_NONE {
                return out;
            }
            let name = ff::ffi::av_hwdevice_get_type_name(t);
            if !name.is_null() {
                out.push(
                    std::ffi::CStr::from_ptr(name)
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
}

/// FFmpeg's decoder for `id` that can decode through the CUDA hwaccel with a device context: the native
/// decoder, not necessarily the default one (Debian's default AV1 decoder is libdav1d, which has no
/// hwaccel; the native `av1` decoder has).
pub fn cuda_decoder(id: ff::codec::Id) -> Option<ff::Codec> {
    let id: ff::ffi::AVCodecID = id.into();
    let mut opaque: *mut std::ffi::c_void = std::ptr::null_mut();
    loop {
        // SAFETY: av_codec_iterate walks FFmpeg's static codec table through `opaque`; it returns static
        // codecs, then null. avcodec_get_hw_config returns a static config, or null past the last one.
        unsafe {
            let codec = ff::ffi::av_codec_iterate(&mut opaque);
            let c = codec.as_ref()?;
            if c.id != id || ff::ffi::av_codec_is_decoder(codec) == 0 {
                continue;
            }
            let mut i = 0;
            while let Some(cfg) = ff::ffi::avcodec_get_hw_config(codec, i).as_ref() {
                if cfg.methods & ff::ffi::AV_CODEC_HW_CONFIG_METHOD_HW_DEVICE_CTX as i32 != 0
                    && cfg.device_type == ff::ffi::AVHWDeviceType::AV_HWDEVICE_TYPE_CUDA
                {
                    return Some(ff::Codec::wrap(codec));
                }
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::orientation_of;

    /// 16.16 fixed-point 2x2 part of a display matrix, as the mov demuxer stores it.
    fn matrix(a: i32, b: i32, c: i32, d: i32) -> [i32; 9] {
        [a << 16, b << 16, 0, c << 16, d << 16, 0, 0, 0, 1 << 30]
    }

    #[test]
    fn each_of_the_eight_orientations_maps_as_the_cli_chooses_its_filters() {
        // (matrix, theta as the CLI computes it, expected clockwise rotation and left-right flip).
        let cases = [
            (matrix(1, 0, 0, 1), 0.0, (0, false)),
            (matrix(-1, 0, 0, -1), 180.0, (180, false)),
            (matrix(0, 1, -1, 0), 90.0, (90, false)), // transpose=clock
            (matrix(0, -1, 1, 0), -90.0, (270, false)), // transpose=cclock
            (matrix(-1, 0, 0, 1), 180.0, (0, true)),  // hflip
            (matrix(1, 0, 0, -1), 0.0, (180, true)),  // vflip
            (matrix(0, 1, 1, 0), 90.0, (90, true)),   // transpose=cclock_flip
            (matrix(0, -1, -1, 0), -90.0, (270, true)), // transpose=clock_flip
        ];
        for (m, theta, want) in cases {
            assert_eq!(orientation_of(&m, theta), want, "{m:?} at {theta}");
        }
        // Angles the CLI would hand to its `rotate` filter, and garbage, are left as stored.
        assert_eq!(orientation_of(&matrix(1, 0, 0, 1), 45.0), (0, false));
        assert_eq!(orientation_of(&matrix(1, 0, 0, 1), f64::NAN), (0, false));
        assert_eq!(orientation_of(&matrix(0, 1, -1, 0), 450.4), (90, false));
    }
}
