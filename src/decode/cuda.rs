//! NVDEC decoding on the GPUs named by `--gpus`, and CUDA discovery (the `cuda` Cargo feature).
//!
//! Inputs: the GPU ordinals [`super::gpus::resolve`] chose. Outputs: a [`GpuPool`] holding one FFmpeg CUDA
//! device context per GPU, whose [`CudaBackend`]s (one per NVDEC session thread, spread round-robin over
//! the GPUs) decode runs through FFmpeg's CUDA hwaccel ([`FfmpegBackend::on_gpu`]: same seek, index and
//! frame numbering as the CPU path; wanted frames copied to host memory, then the CPU path's swscale
//! conversion). Discovery ([`driver`], [`gpu_info`]) reads the driver through cudarc, loaded at run time.
//!
//! Invariants: cudarc panics when libcuda is absent, so every cudarc call happens after
//! `is_culib_present()` and inside `catch_unwind` (a driver library lacking a symbol is reported, never a
//! crash). A video NVDEC cannot decode (codec without a CUDA hwaccel, a profile or pixel format NVDEC
//! refuses, a size outside its limits, a decode error) is decoded on the CPU by the same thread, and
//! remembered, so later runs of it go straight to the CPU; such runs are reported as
//! [`DecodedOn::CpuFallback`].
//!
//! The frames are converted on the CPU after a transfer (NV12/P010 → RGB24 by swscale, with the frame's
//! colour matrix, exactly as the CPU path) rather than by kernels on the GPU: that choice was made without
//! a GPU to measure on, and keeps native-size output within rounding of the CPU reference.

use std::collections::{HashSet, VecDeque};
use std::ffi::{c_int, c_uint, c_void};
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{result, sys};
use parking_lot::Mutex;

use super::ffmpeg::{FfmpegBackend, HwDevice};
use super::gpus::Driver;
use super::{Backend, DecodeError, DecodedOn, Geometry, GopRun, RunOutput, VideoSource};

/// Videos remembered as refused by NVDEC (oldest forgotten first).
const REFUSED_VIDEOS: usize = 4096;

/// What loading the driver found. Never panics, whatever the driver library lacks.
pub fn driver() -> Driver {
    // SAFETY: is_culib_present only tries to dlopen the driver library's candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Driver::Absent("libcuda.so.1 not found".to_owned());
    }
    quietly(probe_driver).unwrap_or_else(Driver::Failed)
}

/// Runs a cudarc call that panics when the driver library lacks a symbol, turning the panic into its
/// message ("Missing symbol cuDeviceGetCount: …"). The default panic hook is silenced meanwhile (the
/// message is reported by the caller instead); this runs at start-up and in `vserve doctor`, before any
/// decode thread exists.
fn quietly<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = std::panic::catch_unwind(f);
    std::panic::set_hook(hook);
    out.map_err(|payload| {
        let what = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a cudarc call panicked".to_owned());
        format!("the driver library is unusable: {what}")
    })
}

fn probe_driver() -> Driver {
    if let Err(e) = result::init() {
        return Driver::Failed(format!("cuInit: {}", code(e)));
    }
    let mut version: c_int = 0;
    // SAFETY: cuDriverGetVersion writes one int.
    if let Err(e) = unsafe { sys::cuDriverGetVersion(&mut version) }.result() {
        return Driver::Failed(format!("cuDriverGetVersion: {}", code(e)));
    }
    match result::device::get_count() {
        Ok(n) => Driver::Present {
            version,
            devices: n.max(0) as u32,
        },
        Err(e) => Driver::Failed(format!("cuDeviceGetCount: {}", code(e))),
    }
}

/// A driver error's name (`CUDA_ERROR_NO_DEVICE`), without asking the driver (which may lack
/// `cuGetErrorName`).
fn code(e: result::DriverError) -> String {
    format!("{:?}", e.0)
}

/// One GPU as the driver describes it.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    pub ordinal: u32,
    pub name: String,
    pub memory_bytes: u64,
    /// Compute capability (major, minor).
    pub compute: (i32, i32),
    /// NVDEC support per codec (8-bit 4:2:0), or why it could not be read.
    pub nvdec: Result<Vec<NvdecCaps>, String>,
}

/// What `cuvidGetDecoderCaps` says about one codec at 8-bit 4:2:0.
#[derive(Clone, Debug)]
pub struct NvdecCaps {
    pub codec: &'static str,
    pub supported: bool,
    pub max_width: u32,
    pub max_height: u32,
    pub min_width: u32,
    pub min_height: u32,
    /// NVDEC engines on the GPU (0 when the driver does not say).
    pub engines: u8,
}

/// Describes GPU `ordinal`. Call only after [`driver`] reported a working driver.
pub fn gpu_info(ordinal: u32) -> Result<GpuInfo, String> {
    quietly(|| read_gpu(ordinal)).and_then(|r| r)
}

fn read_gpu(ordinal: u32) -> Result<GpuInfo, String> {
    let dev = result::device::get(ordinal as c_int)
        .map_err(|e| format!("cuDeviceGet({ordinal}): {}", code(e)))?;
    let name =
        result::device::get_name(dev).map_err(|e| format!("cuDeviceGetName: {}", code(e)))?;
    // SAFETY: `dev` came from cuDeviceGet.
    let (memory, major, minor) = unsafe {
        use sys::CUdevice_attribute::*;
        (
            result::device::total_mem(dev),
            result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        )
    };
    let memory = memory.map_err(|e| format!("cuDeviceTotalMem: {}", code(e)))?;
    Ok(GpuInfo {
        ordinal,
        name,
        memory_bytes: memory as u64,
        compute: (major.unwrap_or(0), minor.unwrap_or(0)),
        nvdec: nvdec_caps(dev),
    })
}

/// `CUVIDDECODECAPS` from the Video Codec SDK's cuviddec.h, with room to spare at the end.
#[repr(C)]
#[derive(Default)]
struct CuvidDecodeCaps {
    codec_type: c_uint,
    chroma_format: c_uint,
    bit_depth_minus8: c_uint,
    reserved1: [c_uint; 3],
    is_supported: u8,
    num_nvdecs: u8,
    output_format_mask: u16,
    max_width: c_uint,
    max_height: c_uint,
    max_mb_count: c_uint,
    min_width: u16,
    min_height: u16,
    histogram: u8,
    counter_bit_depth: u8,
    max_histogram_bins: u16,
    reserved3: [c_uint; 10],
    spare: [c_uint; 16],
}

/// `cudaVideoCodec` values of the codecs vserve serves.
const NVDEC_CODECS: [(&str, c_uint); 4] = [("h264", 4), ("hevc", 8), ("vp9", 10), ("av1", 11)];

type GetDecoderCaps = unsafe extern "C" fn(*mut CuvidDecodeCaps) -> c_int;

/// NVDEC capabilities through libnvcuvid (the driver's video decode library), with the device's primary
/// context current on this thread for the query.
fn nvdec_caps(dev: sys::CUdevice) -> Result<Vec<NvdecCaps>, String> {
    // SAFETY: dlopen/dlsym with valid C strings; the library stays loaded (never dlclosed), so the function
    // pointer stays valid. Its type is cuvidGetDecoderCaps's from cuviddec.h.
    let get_caps: GetDecoderCaps = unsafe {
        let lib = libc::dlopen(
            c"libnvcuvid.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if lib.is_null() {
            return Err("libnvcuvid.so.1 not found".to_owned());
        }
        let f: *mut c_void = libc::dlsym(lib, c"cuvidGetDecoderCaps".as_ptr());
        if f.is_null() {
            return Err("libnvcuvid.so.1 has no cuvidGetDecoderCaps".to_owned());
        }
        std::mem::transmute::<*mut c_void, GetDecoderCaps>(f)
    };
    // SAFETY: `dev` came from cuDeviceGet; the retained primary context is released below.
    let ctx = unsafe { result::primary_ctx::retain(dev) }
        .map_err(|e| format!("cuDevicePrimaryCtxRetain: {}", code(e)))?;
    // SAFETY: `ctx` is a live context.
    let caps = match unsafe { result::ctx::set_current(ctx) } {
        Err(e) => Err(format!("cuCtxSetCurrent: {}", code(e))),
        Ok(()) => Ok(NVDEC_CODECS
            .iter()
            .map(|&(name, id)| {
                let mut c = CuvidDecodeCaps {
                    codec_type: id,
                    chroma_format: 1,
                    ..Default::default()
                };
                // SAFETY: `c` is a zeroed CUVIDDECODECAPS (plus spare room) with its inputs set; a context
                // is current.
                let ok = unsafe { get_caps(&mut c) } == 0;
                NvdecCaps {
                    codec: name,
                    supported: ok && c.is_supported != 0,
                    max_width: c.max_width,
                    max_height: c.max_height,
                    min_width: c.min_width as u32,
                    min_height: c.min_height as u32,
                    engines: c.num_nvdecs,
                }
            })
            .collect()),
    };
    // SAFETY: undoes the retain above; a null current context is valid.
    unsafe {
        let _ = result::ctx::set_current(std::ptr::null_mut());
        let _ = result::primary_ctx::release(dev);
    }
    caps
}

/// Videos NVDEC failed on, shared by every session of every GPU.
#[derive(Default)]
struct Refused {
    set: HashSet<PathBuf>,
    order: VecDeque<PathBuf>,
}

impl Refused {
    fn insert(&mut self, path: PathBuf) {
        if self.set.insert(path.clone()) {
            self.order.push_back(path);
            while self.order.len() > REFUSED_VIDEOS {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

/// The GPUs in use: one FFmpeg CUDA device context each, shared by that GPU's sessions.
pub struct GpuPool {
    /// Behind a Mutex only to take references (see [`HwDevice`]).
    devices: Vec<Mutex<HwDevice>>,
    refused: Arc<Mutex<Refused>>,
    threads_per_decoder: usize,
}

impl GpuPool {
    /// Creates a CUDA device context on each GPU; the error names the GPU that failed.
    pub fn open(gpus: &[u32], threads_per_decoder: usize) -> Result<GpuPool, String> {
        let devices = gpus
            .iter()
            .map(|&g| HwDevice::cuda(g).map(Mutex::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(GpuPool {
            devices,
            refused: Arc::default(),
            threads_per_decoder,
        })
    }

    pub fn gpus(&self) -> usize {
        self.devices.len()
    }

    /// The backend of NVDEC session `session` (GPU `session mod gpus`, round-robin).
    pub fn backend(&self, session: usize) -> CudaBackend {
        let gpu = if self.devices.is_empty() {
            None
        } else {
            let device = self.devices[session % self.devices.len()].lock();
            match device.new_ref() {
                Ok(d) => Some(FfmpegBackend::on_gpu(d)),
                Err(e) => {
                    tracing::warn!(gpu = device.ordinal(), error = %e, "NVDEC session decodes on the CPU");
                    None
                }
            }
        };
        CudaBackend {
            gpu,
            cpu: FfmpegBackend::new(self.threads_per_decoder),
            refused: self.refused.clone(),
        }
    }
}

/// One NVDEC session: decodes on its GPU, or on the CPU for videos NVDEC cannot decode.
pub struct CudaBackend {
    gpu: Option<FfmpegBackend>,
    cpu: FfmpegBackend,
    refused: Arc<Mutex<Refused>>,
}

impl Backend for CudaBackend {
    fn decode_run(
        &mut self,
        source: &VideoSource,
        run: &GopRun,
        geometry: Geometry,
        sink: Option<&super::sink::Sink>,
    ) -> Result<RunOutput, DecodeError> {
        let refused = self.refused.lock().set.contains(&source.path);
        if let (Some(gpu), false) = (self.gpu.as_mut(), refused) {
            match gpu.decode_run(source, run, geometry, sink) {
                Ok(mut out) => {
                    out.decoded_on = DecodedOn::Gpu;
                    return Ok(out);
                }
                // A file that cannot be opened cannot be decoded anywhere.
                Err(e @ DecodeError::Open { .. }) => return Err(e),
                Err(e) => {
                    tracing::info!(path = %source.path.display(), error = %e, "NVDEC cannot decode this video; decoding it on the CPU");
                    self.refused.lock().insert(source.path.clone());
                }
            }
        }
        // Sink places the failed GPU pass took stay taken: the CPU pass emits those frames as frames
        // (the request copies them in) and writes the rest in place.
        let mut out = self.cpu.decode_run(source, run, geometry, sink)?;
        out.decoded_on = DecodedOn::CpuFallback;
        Ok(out)
    }

    fn drives_a_device(&self) -> bool {
        self.gpu.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoder_caps_struct_has_the_sdk_layout() {
        // cuviddec.h: 88 bytes, nMaxWidth at 28; the spare tail only adds room.
        assert_eq!(std::mem::offset_of!(CuvidDecodeCaps, is_supported), 24);
        assert_eq!(std::mem::offset_of!(CuvidDecodeCaps, max_width), 28);
        assert_eq!(std::mem::offset_of!(CuvidDecodeCaps, spare), 88);
    }

    #[test]
    fn refused_videos_are_bounded_and_forgotten_oldest_first() {
        let mut r = Refused::default();
        for i in 0..REFUSED_VIDEOS + 2 {
            r.insert(PathBuf::from(format!("/v/{i}.mp4")));
        }
        r.insert(PathBuf::from("/v/5.mp4"));
        assert_eq!(r.set.len(), REFUSED_VIDEOS);
        assert!(!r.set.contains(&PathBuf::from("/v/0.mp4")));
        assert!(r.set.contains(&PathBuf::from("/v/2.mp4")));
    }

    #[test]
    fn discovery_never_panics_and_a_pool_without_gpus_decodes_on_the_cpu() {
        // Whatever this host has (no driver in CI), discovery answers.
        let d = driver();
        assert!(!d.describe().is_empty());
        let pool = GpuPool {
            devices: Vec::new(),
            refused: Arc::default(),
            threads_per_decoder: 1,
        };
        assert!(pool.backend(0).gpu.is_none());
    }
}
