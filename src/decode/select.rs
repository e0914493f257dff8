//! Backend choice: which decoder each fleet slot runs. Input: the decode configuration (`--gpus`,
//! `--decode-threads`, `--nvdec-sessions`) and what the CUDA driver reports. Output: [`Backends`], the
//! slot counts and one factory giving each slot its backend. Every slot's backend is [`Routed`]: videos of
//! GulpIO datasets go to the stored-JPEG decoder, all others to the slot's video decoder (FFmpeg on the CPU
//! or NVDEC), so the fleet itself knows no formats.

use std::sync::Arc;

use super::ffmpeg::FfmpegBackend;
use super::fleet::BackendFactory;
use super::gpus::{resolve as resolve_gpus, Driver};
use super::gulp::GulpBackend;
use super::sink::Sink;
use super::{Backend, DecodeError, Geometry, GopRun, RunOutput, VideoSource};
use crate::config::{DecodeConfig, GpuSpec};

/// One slot's backend: stored frames of GulpIO videos to [`GulpBackend`], everything else to `video`.
pub struct Routed {
    video: Box<dyn Backend>,
    stored: GulpBackend,
}

impl Routed {
    pub fn new(video: Box<dyn Backend>) -> Routed {
        Routed {
            video,
            stored: GulpBackend::default(),
        }
    }
}

impl Backend for Routed {
    fn decode_run(
        &mut self,
        source: &VideoSource,
        run: &GopRun,
        geometry: Geometry,
        sink: Option<&Sink>,
    ) -> Result<RunOutput, DecodeError> {
        if source.gulp.is_some() {
            // Stored JPEGs decode into frames; the request copies them into its reply.
            self.stored.decode_run(source, run, geometry)
        } else {
            self.video.decode_run(source, run, geometry, sink)
        }
    }

    fn drives_a_device(&self) -> bool {
        self.video.drives_a_device()
    }
}

/// The production backend factory: one FFmpeg CPU backend per decode thread.
pub fn ffmpeg_backends(threads_per_decoder: usize) -> BackendFactory {
    Arc::new(move |_slot| {
        Box::new(Routed::new(Box::new(FfmpegBackend::new(
            threads_per_decoder,
        ))))
    })
}

/// How the fleet decodes: `cpu_threads` FFmpeg CPU threads, then `gpu_threads` NVDEC sessions.
pub struct Backends {
    pub cpu_threads: usize,
    pub gpu_threads: usize,
    /// The GPUs in use (empty: CPU only).
    pub gpus: Vec<u32>,
    pub factory: BackendFactory,
    /// Why these GPUs (one line for the log).
    pub why: String,
}

/// What the CUDA driver reports here (nothing is loaded for builds without the `cuda` feature).
pub fn gpu_driver() -> Driver {
    #[cfg(feature = "cuda")]
    {
        crate::decode::cuda::driver()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Driver::NotBuilt
    }
}

/// Resolves `--gpus` and builds the fleet's backends. An explicit `--gpus` that cannot be satisfied is
/// [`ServerError::Unavailable`], naming the missing driver or device; `auto` falls back to the CPU.
pub fn select(decode: &DecodeConfig) -> Result<Backends, String> {
    let driver = match decode.gpus {
        GpuSpec::None => Driver::NotBuilt,
        _ => gpu_driver(),
    };
    let choice = resolve_gpus(&decode.gpus, &driver)?;
    let cpu = Backends {
        cpu_threads: decode.threads,
        gpu_threads: 0,
        gpus: Vec::new(),
        factory: ffmpeg_backends(decode.threads_per_decoder),
        why: choice.why.clone(),
    };
    if choice.gpus.is_empty() {
        return Ok(cpu);
    }
    gpu_plan(decode, choice, cpu)
}

/// CPU decode threads when GPUs decode: none unless `--decode-threads` was set, since the NVDEC sessions
/// take all the work (falling back to the CPU on their own threads) and the cores belong to the trainers.
pub fn cpu_threads_beside_gpus(decode: &DecodeConfig) -> usize {
    if decode.threads_explicit {
        decode.threads
    } else {
        0
    }
}

#[cfg(feature = "cuda")]
fn gpu_plan(
    decode: &DecodeConfig,
    choice: crate::decode::gpus::GpuChoice,
    cpu: Backends,
) -> Result<Backends, String> {
    let pool = match crate::decode::cuda::GpuPool::open(&choice.gpus, decode.threads_per_decoder) {
        Ok(pool) => Arc::new(pool),
        Err(e) if decode.gpus == GpuSpec::Auto => {
            return Ok(Backends {
                why: format!("--gpus auto: {e}; decoding on the CPU"),
                ..cpu
            })
        }
        Err(e) => return Err(format!("--gpus {}: {e}", decode.gpus)),
    };
    let cpu_threads = cpu_threads_beside_gpus(decode);
    let tpd = decode.threads_per_decoder;
    let factory: BackendFactory = Arc::new(move |slot| {
        let video: Box<dyn Backend> = if slot < cpu_threads {
            Box::new(FfmpegBackend::new(tpd))
        } else {
            Box::new(pool.backend(slot - cpu_threads))
        };
        Box::new(Routed::new(video))
    });
    Ok(Backends {
        cpu_threads,
        gpu_threads: decode.nvdec_sessions * choice.gpus.len(),
        gpus: choice.gpus,
        factory,
        why: choice.why,
    })
}

#[cfg(not(feature = "cuda"))]
fn gpu_plan(
    _decode: &DecodeConfig,
    _choice: crate::decode::gpus::GpuChoice,
    cpu: Backends,
) -> Result<Backends, String> {
    // resolve() never chooses GPUs for Driver::NotBuilt.
    Ok(cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_leave_the_cores_alone_unless_cpu_threads_are_asked_for() {
        let mut decode = DecodeConfig {
            threads: 16,
            threads_explicit: false,
            queue: 64,
            threads_per_decoder: 1,
            gpus: GpuSpec::Auto,
            nvdec_sessions: 4,
            deadline: std::time::Duration::from_secs(60),
            index_deadline: std::time::Duration::from_secs(600),
        };
        assert_eq!(cpu_threads_beside_gpus(&decode), 0);
        decode.threads = 2;
        decode.threads_explicit = true;
        assert_eq!(cpu_threads_beside_gpus(&decode), 2);
    }
}
