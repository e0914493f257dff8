//! CPU decoding through libavcodec (FFmpeg), and the conversion to RGB24 through libswscale.
//!
//! Inputs: a [`VideoSource`], a [`GopRun`], a [`Geometry`]. Outputs: the run's wanted frames as packed
//! RGB24. Frame k is found as the index defines it: by pts after a seek to the run's keyframe
//! ([`SeekMode::ByPts`]), or by counting from the start of the file ([`SeekMode::FromStart`]).
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

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};

use ffmpeg_next as ff;

use super::{rotate_rgb, Backend, DecodeError, Frame, Geometry, GopRun, RunOutput, VideoSource};
use crate::index::{IndexMethod, ScannedFrame, SeekMode, VideoIndex};

/// Videos a backend keeps open between runs.
const OPEN_VIDEOS: usize = 4;

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

/// A reference to an FFmpeg CUDA device context (an `AVHWDeviceContext` on one GPU). A GPU's device
/// context is created once and every decoder on that GPU holds its own reference ([`HwDevice::new_ref`]);
/// the context is freed with its last reference.
pub struct HwDevice {
    buf: *mut ff::ffi::AVBufferRef,
    ordinal: u32,
}

// SAFETY: an HwDevice owns one reference to a refcounted AVBufferRef (atomic reference counts); the device
// context behind it is immutable once created, and FFmpeg's CUDA code pushes its own CUcontext around each
// use, so a reference may move to and be dropped on another thread. It is not Sync: callers share a device
// across threads behind a Mutex and take their own reference.
unsafe impl Send for HwDevice {}

impl HwDevice {
    /// Creates a CUDA device context on GPU `ordinal` (FFmpeg loads libcuda at this point; without a
    /// driver or device this fails).
    pub fn cuda(ordinal: u32) -> Result<HwDevice, String> {
        init();
        let device = std::ffi::CString::new(ordinal.to_string())
            .map_err(|_| "bad device name".to_owned())?;
        let mut buf: *mut ff::ffi::AVBufferRef = std::ptr::null_mut();
        // SAFETY: `buf` is a null out-pointer, `device` a valid C string; no options, no flags. On failure
        // FFmpeg leaves `buf` null.
        let ret = unsafe {
            ff::ffi::av_hwdevice_ctx_create(
                &mut buf,
                ff::ffi::AVHWDeviceType::AV_HWDEVICE_TYPE_CUDA,
                device.as_ptr(),
                std::ptr::null_mut(),
                0,
            )
        };
        if ret < 0 || buf.is_null() {
            return Err(format!(
                "cannot create an FFmpeg CUDA device on GPU {ordinal}: {}",
                ff::Error::from(ret)
            ));
        }
        Ok(HwDevice { buf, ordinal })
    }

    /// Another reference to the same device context.
    pub fn new_ref(&self) -> Result<HwDevice, String> {
        // SAFETY: `self.buf` is a valid reference for as long as `self` lives.
        let buf = unsafe { ff::ffi::av_buffer_ref(self.buf) };
        if buf.is_null() {
            return Err("av_buffer_ref failed (out of memory)".into());
        }
        Ok(HwDevice {
            buf,
            ordinal: self.ordinal,
        })
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

impl Drop for HwDevice {
    fn drop(&mut self) {
        // SAFETY: `self.buf` is this value's own reference; av_buffer_unref nulls it.
        unsafe { ff::ffi::av_buffer_unref(&mut self.buf) };
    }
}

/// `get_format` for hardware decoding: the CUDA surface format when the decoder offers it, else
/// `AV_PIX_FMT_NONE`, which fails the decode (and so sends the video to the CPU) instead of letting FFmpeg
/// silently decode in software on a GPU thread.
unsafe extern "C" fn pick_cuda_format(
    _ctx: *mut ff::ffi::AVCodecContext,
    formats: *const ff::ffi::AVPixelFormat,
) -> ff::ffi::AVPixelFormat {
    use ff::ffi::AVPixelFormat::{AV_PIX_FMT_CUDA, AV_PIX_FMT_NONE};
    let mut p = formats;
    // SAFETY: FFmpeg passes a list terminated by AV_PIX_FMT_NONE.
    unsafe {
        while !p.is_null() && *p != AV_PIX_FMT_NONE {
            if *p == AV_PIX_FMT_CUDA {
                return AV_PIX_FMT_CUDA;
            }
            p = p.add(1);
        }
    }
    AV_PIX_FMT_NONE
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

/// Reads the next packet into `packet`, releasing the one it held first. `ff::Packet::read` calls
/// `av_read_frame`, which overwrites the packet without unreferencing its previous buffer: reusing one
/// packet across reads leaked every packet's data (measured: ~0.75 MB per index build of a 10 s clip).
pub(crate) fn read_packet(
    packet: &mut ff::Packet,
    input: &mut ff::format::context::Input,
) -> Result<(), ff::Error> {
    // SAFETY: `packet` wraps a valid AVPacket; av_packet_unref frees its buffer reference (if any) and
    // leaves it blank, as av_read_frame expects.
    unsafe { ff::ffi::av_packet_unref(ff::packet::Mut::as_mut_ptr(packet)) };
    packet.read(input)
}

fn open_decoder(
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
            let device_ref = device.new_ref()?;
            // SAFETY: `ctx` is a valid, unopened AVCodecContext. It takes over the new reference (freed by
            // avcodec_free_context); get_format is a plain callback field read during decoding.
            unsafe {
                let c = &mut *ctx.as_mut_ptr();
                c.hw_device_ctx = device_ref.buf;
                std::mem::forget(device_ref);
                c.get_format = Some(pick_cuda_format);
            }
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

/// What a decode scan found.
pub struct DecodeScan {
    pub frames: Vec<ScannedFrame>,
    /// The decoder reported errors (rejected packets, concealed or corrupt frames).
    pub errors: bool,
}

/// True when the decoder flagged this frame as damaged (concealment active, or marked corrupt).
fn frame_damaged(frame: &ff::frame::Video) -> bool {
    // SAFETY: `frame` holds a frame just returned by the decoder; these are plain fields.
    unsafe {
        let f = &*frame.as_ptr();
        f.decode_error_flags != 0 || (f.flags & ff::ffi::AV_FRAME_FLAG_CORRUPT) != 0
    }
}

/// Indexes a stream by decoding all of it: the table of what the decoder really outputs. One decoder
/// thread, as every run decodes, so concealment of damaged data is the same.
pub fn scan_by_decoding(path: &Path, index: usize) -> Result<DecodeScan, DecodeError> {
    init();
    let mut input = ff::format::input(&path).map_err(|e| DecodeError::Open {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let mut decoder =
        open_decoder(&input, index, 1, None).map_err(|reason| DecodeError::Unsupported {
            path: path.to_owned(),
            reason,
        })?;
    let mut frames = Vec::new();
    let mut errors = false;
    let mut frame = ff::frame::Video::empty();
    let mut packet = ff::Packet::empty();
    let mut drain =
        |decoder: &mut ff::decoder::Video, frames: &mut Vec<ScannedFrame>, errors: &mut bool| {
            while decoder.receive_frame(&mut frame).is_ok() {
                *errors |= frame_damaged(&frame);
                // SAFETY: `frame` holds a frame just returned by the decoder.
                let duration = unsafe { (*frame.as_ptr()).pkt_duration };
                frames.push(ScannedFrame {
                    pts: frame.pts(),
                    duration,
                    key: frame.is_key(),
                });
            }
        };
    while read_packet(&mut packet, &mut input).is_ok() {
        if packet.stream() != index {
            continue;
        }
        if let Err(e) = decoder.send_packet(&packet) {
            errors = true;
            tracing::trace!(path = %path.display(), error = %e, "packet rejected during scan");
        }
        drain(&mut decoder, &mut frames, &mut errors);
    }
    let _ = decoder.send_eof();
    drain(&mut decoder, &mut frames, &mut errors);
    Ok(DecodeScan { frames, errors })
}

/// A cached swscale context for one (input format, size, colour) → (RGB24, size) conversion.
struct Converter {
    key: (i32, u32, u32, i32, i32, u32, u32),
    ctx: ff::software::scaling::Context,
    out: ff::frame::Video,
}

impl Converter {
    fn convert(
        slot: &mut Option<Converter>,
        frame: &ff::frame::Video,
        width: u32,
        height: u32,
    ) -> Result<Frame, String> {
        // SAFETY: `frame` holds a decoded frame; colorspace/color_range/format are plain fields.
        let (fmt, cs, range) = unsafe {
            let f = &*frame.as_ptr();
            (f.format, f.colorspace as i32, f.color_range as i32)
        };
        let key = (fmt, frame.width(), frame.height(), cs, range, width, height);
        if slot.as_ref().map(|c| c.key) != Some(key) {
            // The FFmpeg CLI's own conversion (`-pix_fmt rgb24`) uses swscale's default, BICUBIC; at native
            // size that matters only for formats without a dedicated converter (10-bit). Resizes use BILINEAR.
            let flags = if (width, height) == (frame.width(), frame.height()) {
                ff::software::scaling::Flags::BICUBIC
            } else {
                ff::software::scaling::Flags::BILINEAR
            };
            let mut ctx = ff::software::scaling::Context::get(
                frame.format(),
                frame.width(),
                frame.height(),
                ff::format::Pixel::RGB24,
                width,
                height,
                flags,
            )
            .map_err(|e| format!("swscale cannot convert {:?}: {e}", frame.format()))?;
            let src_full = (range == ff::ffi::AVColorRange::AVCOL_RANGE_JPEG as i32) as i32;
            // SAFETY: `ctx` is a valid initialised SwsContext; sws_getCoefficients returns a static table for
            // any integer (unknown colour spaces map to the default, BT.601).
            unsafe {
                let ret = ff::ffi::sws_setColorspaceDetails(
                    ctx.as_mut_ptr(),
                    ff::ffi::sws_getCoefficients(cs),
                    src_full,
                    ff::ffi::sws_getCoefficients(ff::ffi::SWS_CS_DEFAULT),
                    1,
                    0,
                    1 << 16,
                    1 << 16,
                );
                if ret < 0 {
                    tracing::debug!(
                        cs,
                        range,
                        "sws_setColorspaceDetails refused; using defaults"
                    );
                }
            }
            *slot = Some(Converter {
                key,
                ctx,
                out: ff::frame::Video::new(ff::format::Pixel::RGB24, width, height),
            });
        }
        let Some(conv) = slot.as_mut() else {
            return Err("converter missing".into());
        };
        conv.ctx
            .run(frame, &mut conv.out)
            .map_err(|e| format!("swscale failed: {e}"))?;
        let row = width as usize * 3;
        let stride = conv.out.stride(0);
        let plane = conv.out.data(0);
        let mut data = Vec::with_capacity(row * height as usize);
        for y in 0..height as usize {
            data.extend_from_slice(&plane[y * stride..y * stride + row]);
        }
        Ok(Frame {
            width,
            height,
            data,
        })
    }
}

/// Converts a decoded frame to RGB24 at the geometry's size and orientation.
///
/// Rotation happens where the FFmpeg CLI's autorotation puts it: on the decoded planes, before the
/// conversion (and any scaling), as its `transpose`/`hflip,vflip` filters do. swscale's chroma filtering is
/// not symmetric in x and y, so rotating the RGB image afterwards would differ for most formats (10-bit
/// 4:2:0 by up to 104 levels). 4:2:2 turned by 90/270 follows the CLI's format negotiation (see below).
/// Formats whose planes cannot be rotated (packed, palette) fall back to rotating the RGB image, which
/// may differ from the CLI.
fn convert_frame(
    converter: &mut Option<Converter>,
    frame: &ff::frame::Video,
    geometry: Geometry,
) -> Result<Frame, String> {
    if geometry.rotation != 0 {
        let widened;
        let mut source = frame;
        let resized =
            (geometry.scaled_width, geometry.scaled_height) != (frame.width(), frame.height());
        if geometry.rotation != 180 && resized {
            // `transpose` takes no 4:2:2. Before a scale filter the CLI's format negotiation converts such
            // frames to 4:4:4 (swscale's default, bicubic, scaler) and so does this; at native size it
            // converts straight to RGB before transposing, which is the fallback below.
            if let Some(wide) = chroma_444(frame)? {
                widened = wide;
                source = &widened;
            }
        }
        if let Some(rotated) = rotate_planes(source, geometry.rotation) {
            let (w, h) = if geometry.rotation == 180 {
                (geometry.scaled_width, geometry.scaled_height)
            } else {
                (geometry.scaled_height, geometry.scaled_width)
            };
            return Converter::convert(converter, &rotated, w, h);
        }
    }
    let converted = Converter::convert(
        converter,
        frame,
        geometry.scaled_width,
        geometry.scaled_height,
    )?;
    Ok(rotate_rgb(converted, geometry.rotation))
}

/// A 4:2:2 frame converted to the 4:4:4 format the CLI's autorotation would convert it to; None for
/// other formats.
fn chroma_444(frame: &ff::frame::Video) -> Result<Option<ff::frame::Video>, String> {
    use ff::format::Pixel;
    let target = match frame.format() {
        Pixel::YUV422P => Pixel::YUV444P,
        Pixel::YUVJ422P => Pixel::YUVJ444P,
        Pixel::YUV422P10LE => Pixel::YUV444P10LE,
        Pixel::YUV422P12LE => Pixel::YUV444P12LE,
        _ => return Ok(None),
    };
    let (w, h) = (frame.width(), frame.height());
    let mut ctx = ff::software::scaling::Context::get(
        frame.format(),
        w,
        h,
        target,
        w,
        h,
        ff::software::scaling::Flags::empty(),
    )
    .map_err(|e| format!("swscale cannot widen {:?}: {e}", frame.format()))?;
    let mut out = ff::frame::Video::new(target, w, h);
    ctx.run(frame, &mut out)
        .map_err(|e| format!("swscale failed: {e}"))?;
    out.set_color_space(frame.color_space());
    out.set_color_range(frame.color_range());
    Ok(Some(out))
}

/// Bytes per sample of a planar format whose planes can be rotated sample by sample (every component
/// 1 or 2 bytes, the same for all), and whether its chroma grid is square (needed to transpose).
fn planar_layout(format: ff::format::Pixel) -> Option<(usize, bool)> {
    // SAFETY: av_pix_fmt_desc_get returns a pointer to a static descriptor, or null for unknown formats.
    let desc = unsafe { ff::ffi::av_pix_fmt_desc_get(format.into()).as_ref()? };
    let flags = desc.flags;
    let planar = flags & ff::ffi::AV_PIX_FMT_FLAG_PLANAR as u64 != 0 || desc.nb_components == 1;
    let odd = (ff::ffi::AV_PIX_FMT_FLAG_PAL
        | ff::ffi::AV_PIX_FMT_FLAG_BITSTREAM
        | ff::ffi::AV_PIX_FMT_FLAG_HWACCEL) as u64;
    if !planar || flags & odd != 0 || desc.nb_components == 0 {
        return None;
    }
    let comps = &desc.comp[..desc.nb_components as usize];
    let step = comps[0].step;
    if !(step == 1 || step == 2) || comps.iter().any(|c| c.step != step || c.offset != 0) {
        return None;
    }
    Some((step as usize, desc.log2_chroma_w == desc.log2_chroma_h))
}

/// Rotates every plane of a planar frame clockwise (8- or 16-bit samples), as FFmpeg's `transpose` and
/// `hflip,vflip` filters do; None for formats this does not handle.
fn rotate_planes(frame: &ff::frame::Video, rotation: u32) -> Option<ff::frame::Video> {
    let transposes = rotation == 90 || rotation == 270;
    let (bytes, square_chroma) = planar_layout(frame.format())?;
    if (transposes && !square_chroma) || !matches!(rotation, 90 | 180 | 270) {
        return None;
    }
    let (w, h) = (frame.width(), frame.height());
    let (ow, oh) = if transposes { (h, w) } else { (w, h) };
    let mut out = ff::frame::Video::new(frame.format(), ow, oh);
    out.set_color_space(frame.color_space());
    out.set_color_range(frame.color_range());
    for p in 0..frame.planes() {
        let (pw, ph) = (
            frame.plane_width(p) as usize,
            frame.plane_height(p) as usize,
        );
        let src_stride = frame.stride(p);
        let dst_stride = out.stride(p);
        let src = frame.data(p);
        let dst = out.data_mut(p);
        for y in 0..ph {
            for x in 0..pw {
                let (ox, oy) = match rotation {
                    90 => (ph - 1 - y, x),
                    270 => (y, pw - 1 - x),
                    _ => (pw - 1 - x, ph - 1 - y),
                };
                let s = y * src_stride + x * bytes;
                let d = oy * dst_stride + ox * bytes;
                dst[d..d + bytes].copy_from_slice(&src[s..s + bytes]);
            }
        }
    }
    Some(out)
}

/// Opens a file the index already describes. For MP4/MOV and Matroska/WebM the container header holds
/// everything decoding needs, so FFmpeg's stream probing (`avformat_find_stream_info`, which decodes
/// frames and costs ~2 ms per open against ~0.2 ms without) is skipped when the header's stream matches the
/// index (codec and size). Other containers, or any mismatch, get the full open.
fn open_for_decoding(
    path: &Path,
    index: &VideoIndex,
) -> Result<ff::format::context::Input, ff::Error> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(cpath) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return ff::format::input(&path);
    };
    let mut ctx: *mut ff::ffi::AVFormatContext = std::ptr::null_mut();
    // SAFETY: `ctx` is a null out-pointer and `cpath` a valid C string; on failure FFmpeg frees the context
    // and leaves `ctx` null.
    let ret = unsafe {
        ff::ffi::avformat_open_input(
            &mut ctx,
            cpath.as_ptr(),
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    };
    if ret < 0 || ctx.is_null() {
        return ff::format::input(&path);
    }
    // SAFETY: `ctx` is a valid, opened AVFormatContext that `Input` now owns and closes on drop.
    let input = unsafe { ff::format::context::Input::wrap(ctx) };
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
        ff::format::input(&path)
    }
}

/// One open video: demuxer, decoder, and where the decoder stands.
struct OpenVideo {
    path: PathBuf,
    /// The index this context was opened for.
    index: Arc<VideoIndex>,
    stream: usize,
    input: ff::format::context::Input,
    decoder: ff::decoder::Video,
    /// Index of the frame the decoder will output next, when it is positioned mid-stream.
    next_frame: Option<usize>,
    converter: Option<Converter>,
}

/// The FFmpeg backend: CPU decoding, or NVDEC when given a [`HwDevice`]. One per decode thread.
pub struct FfmpegBackend {
    /// libavcodec threads per decoder context (1 = the fleet's threads are the parallelism).
    threads_per_decoder: usize,
    /// The GPU this backend decodes on (FFmpeg's CUDA hwaccel), or None for the CPU.
    hw: Option<HwDevice>,
    open: VecDeque<OpenVideo>,
}

impl FfmpegBackend {
    pub fn new(threads_per_decoder: usize) -> Self {
        init();
        FfmpegBackend {
            threads_per_decoder,
            hw: None,
            open: VecDeque::new(),
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
        }
    }

    /// An open context for this video, reused only for the same index (a changed file, or one re-indexed
    /// after damage, gets a new index and so a fresh demuxer and decoder).
    fn open_video(
        &mut self,
        path: &Path,
        index: &Arc<VideoIndex>,
    ) -> Result<OpenVideo, DecodeError> {
        let stream = index.stream;
        if let Some(pos) = self
            .open
            .iter()
            .position(|v| v.path == path && Arc::ptr_eq(&v.index, index))
        {
            if let Some(v) = self.open.remove(pos) {
                return Ok(v);
            }
        }
        let input = open_for_decoding(path, index).map_err(|e| DecodeError::Open {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let decoder = open_decoder(&input, stream, self.threads_per_decoder, self.hw.as_ref())
            .map_err(|reason| DecodeError::Unsupported {
                path: path.to_owned(),
                reason,
            })?;
        Ok(OpenVideo {
            path: path.to_owned(),
            index: index.clone(),
            stream,
            input,
            decoder,
            next_frame: None,
            converter: None,
        })
    }

    fn keep(&mut self, video: OpenVideo) {
        self.open.push_front(video);
        self.open.truncate(OPEN_VIDEOS);
    }
}

impl Backend for FfmpegBackend {
    fn decode_run(
        &mut self,
        source: &VideoSource,
        run: &GopRun,
        geometry: Geometry,
    ) -> Result<RunOutput, DecodeError> {
        let index = &source.index;
        let mut video = self.open_video(&source.path, index)?;
        let result = decode_in(&mut video, index, run, geometry);
        match &result {
            // A video that failed mid-run is reopened next time rather than trusted.
            Ok(_) => self.keep(video),
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
        reposition(video, index, run.keyframe).map_err(backend_err)?;
    }
    let mut out = RunOutput::default();
    let mut emitted = vec![false; run.wanted.len()];
    let mut frame = ff::frame::Video::empty();
    let mut packet = ff::Packet::empty();
    let mut eof = false;
    let mut done = false;
    let last_pts = index.frames[last].pts;
    // Only a clean packet-scan table can be wrong about damage; decode-scan tables already account for it.
    let watch_damage = index.method == IndexMethod::PacketScan;
    while !done {
        while video.decoder.receive_frame(&mut frame).is_ok() {
            out.decoded += 1;
            let k = match index.seek {
                SeekMode::ByPts => {
                    let pts = frame.pts().or(frame.timestamp());
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
            video.next_frame = Some(k + 1);
            if let Ok(slot) = run.wanted.binary_search(&k) {
                if !emitted[slot] {
                    emitted[slot] = true;
                    let converted = if is_hw_frame(&frame) {
                        let host = download(&frame).map_err(backend_err)?;
                        convert_frame(&mut video.converter, &host, geometry)
                    } else {
                        convert_frame(&mut video.converter, &frame, geometry)
                    }
                    .map_err(backend_err)?;
                    out.frames.push((k, Arc::new(converted)));
                }
            }
            if k >= last {
                done = true;
                break;
            }
        }
        if done || eof {
            break;
        }
        match read_packet(&mut packet, &mut video.input) {
            Ok(()) => {
                if packet.stream() != video.stream {
                    continue;
                }
                // Only inside the run: packets past its last frame (read ahead in decode order) go to the
                // decoder, so the next run of this video can continue from here without a seek and find
                // every frame it wants.
                if disposable_unwanted(&packet, index, &run.wanted).is_some_and(|k| k <= last) {
                    out.skipped += 1;
                    continue;
                }
                if let Err(e) = video.decoder.send_packet(&packet) {
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
    out.frames.sort_by_key(|(k, _)| *k);
    let missing: Vec<usize> = run
        .wanted
        .iter()
        .zip(&emitted)
        .filter(|(_, e)| !**e)
        .map(|(k, _)| *k)
        .collect();
    if !missing.is_empty() {
        video.next_frame = None;
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

/// True for a frame held in GPU memory (a CUDA surface).
fn is_hw_frame(frame: &ff::frame::Video) -> bool {
    // SAFETY: `frame` holds a decoded frame; format is a plain field.
    unsafe { (*frame.as_ptr()).format == ff::ffi::AVPixelFormat::AV_PIX_FMT_CUDA as i32 }
}

/// Copies a GPU frame to host memory in the surface's software format (NV12 for 8-bit 4:2:0, P010/P016
/// for deeper ones), with the frame's colour properties, for the CPU conversion.
fn download(frame: &ff::frame::Video) -> Result<ff::frame::Video, String> {
    let mut host = ff::frame::Video::empty();
    // SAFETY: `frame` is a valid hardware frame (its hw_frames_ctx set by the decoder); `host` is an empty
    // frame that av_hwframe_transfer_data allocates in the first supported software format.
    let ret = unsafe { ff::ffi::av_hwframe_transfer_data(host.as_mut_ptr(), frame.as_ptr(), 0) };
    if ret < 0 {
        return Err(format!(
            "cannot copy a frame from the GPU: {}",
            ff::Error::from(ret)
        ));
    }
    // SAFETY: both frames are valid; this copies metadata (pts, colour space and range), not data.
    let ret = unsafe { ff::ffi::av_frame_copy_props(host.as_mut_ptr(), frame.as_ptr()) };
    if ret < 0 {
        return Err(format!(
            "cannot copy frame properties: {}",
            ff::Error::from(ret)
        ));
    }
    Ok(host)
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
        .is_some_and(|d| crate::index::h264_disposable(d, n))
        .then_some(k)
}

/// Puts the decoder just before `keyframe`: a pts seek for ByPts tables, a reopen for FromStart ones.
fn reposition(video: &mut OpenVideo, index: &VideoIndex, keyframe: usize) -> Result<(), String> {
    video.decoder.flush();
    match index.seek {
        SeekMode::ByPts => {
            let target = index.frames[keyframe].pts;
            // SAFETY: `input` is a valid open AVFormatContext and `stream` one of its streams.
            let ret = unsafe {
                ff::ffi::avformat_seek_file(
                    video.input.as_mut_ptr(),
                    video.stream as i32,
                    i64::MIN,
                    target,
                    target,
                    0,
                )
            };
            if ret < 0 {
                // Some demuxers cannot seek backwards by pts; reading from the start always works.
                tracing::debug!(path = %video.path.display(), target, ret, "seek failed; reopening");
                reopen(video, index)?;
            }
            video.next_frame = None;
        }
        SeekMode::FromStart => {
            reopen(video, index)?;
            video.next_frame = Some(0);
        }
    }
    Ok(())
}

fn reopen(video: &mut OpenVideo, index: &VideoIndex) -> Result<(), String> {
    video.input = open_for_decoding(&video.path, index).map_err(|e| e.to_string())?;
    video.decoder.flush();
    Ok(())
}
