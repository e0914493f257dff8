//! NVDEC through FFmpeg's CUDA hwaccel: the device context, the `get_format` pick, and the copy of a GPU
//! surface to host memory before conversion.

use ffmpeg_next as ff;

use super::info::init;

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

impl HwDevice {
    /// Makes an unopened decoder context decode on this device: it takes a new reference to the device
    /// context and picks `AV_PIX_FMT_CUDA` in `get_format`.
    pub(super) fn attach(&self, ctx: &mut ff::codec::context::Context) -> Result<(), String> {
        let device_ref = self.new_ref()?;
        // SAFETY: `ctx` is a valid, unopened AVCodecContext. It takes over the new reference (freed by
        // avcodec_free_context); get_format is a plain callback field read during decoding.
        unsafe {
            let c = &mut *ctx.as_mut_ptr();
            c.hw_device_ctx = device_ref.buf;
            std::mem::forget(device_ref);
            c.get_format = Some(pick_cuda_format);
        }
        Ok(())
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

/// True for a frame held in GPU memory (a CUDA surface).
pub(super) fn is_hw_frame(frame: &ff::frame::Video) -> bool {
    // SAFETY: `frame` holds a decoded frame; format is a plain field.
    unsafe { (*frame.as_ptr()).format == ff::ffi::AVPixelFormat::AV_PIX_FMT_CUDA as i32 }
}

/// Copies a GPU frame to host memory in the surface's software format (NV12 for 8-bit 4:2:0, P010/P016
/// for deeper ones), with the frame's colour properties, for the CPU conversion.
pub(super) fn download(frame: &ff::frame::Video) -> Result<ff::frame::Video, String> {
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
