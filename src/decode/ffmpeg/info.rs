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
    });
}

/// The video stream to use: `wanted` when given (it must be a video stream), else FFmpeg's best video
/// stream, the one `ffmpeg -i F` picks without `-map`.
pub fn pick_stream(
    input: &ff::format::context::Input,
    wanted: Option<usize>,
) -> Result<usize, String> {
    match wanted {
        Some(i) => {
            let st = input
                .stream(i)
                .ok_or_else(|| format!(": stream {i} does not exist"))?;
            if st.parameters().medium() != ff::media::Type::Video {
                return Err(format!(": stream {i} is not a video stream"));
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
    Ok(StreamFacts {
        codec: id.name().to_owned(),
        pixel_format,
        width: width as u32,
        height: height as u32,
        rotation: display_rotation(input, index),
        time_base: (tb.numerator(), tb.denominator()),
        avg_fps,
        nb_frames: st.frames(),
        nal_length_size,
    })
}

/// Clockwise display rotation from the stream's display matrix, normalised as the FFmpeg CLI's
/// autorotation does (`-theta`, snapped to 0/90/180/270).
fn display_rotation(input: &ff::format::context::Input, index: usize) -> u32 {
    // SAFETY: `input` is a valid, open AVFormatContext and `index` < nb_streams (checked by the caller).
    // av_stream_get_side_data returns a pointer into the stream's own side data or null.
    let theta = unsafe {
        let st = *(*input.as_ptr()).streams.add(index);
        let mut size: usize = 0;
        let data = ff::ffi::av_stream_get_side_data(
            st,
            ff::ffi::AVPacketSideDataType::AV_PKT_DATA_DISPLAYMATRIX,
            &mut size,
        );
        if data.is_null() || size < 9 * 4 {
            return 0;
        }
        -ff::ffi::av_display_rotation_get(data as *const i32)
    };
    if !theta.is_finite() {
        return 0;
    }
    let theta = theta - 360.0 * (theta / 360.0 + 0.9 / 360.0).floor();
    for cw in [90u32, 180, 270] {
        if (theta - cw as f64).abs() < 1.0 {
            return cw;
        }
    }
    0
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
