//! `vserve doctor`: what this host can decode with, without a daemon.
//!
//! Prints the FFmpeg libraries, their decoders for H.264, HEVC, VP9 and AV1 (with the `*_cuvid` ones and
//! which decode through the CUDA hwaccel), FFmpeg's hardware device types, the CUDA driver, each GPU (name,
//! memory, compute capability, NVDEC capabilities), and what `--gpus auto` (and `--gpus` when given) would
//! choose. `--json` prints the same as one JSON object. Exit 0, or 69 when the given `--gpus` cannot be
//! satisfied (as `vserve serve` would exit).

use serde_json::{json, Value};

use crate::config::{parse_gpus, GpuSpec};
use crate::decode::ffmpeg;
use crate::decode::gpus::{resolve, Driver};

/// The codecs the doctor reports decoders for (FFmpeg's names).
const CODECS: [&str; 4] = ["h264", "hevc", "vp9", "av1"];

/// Runs `vserve doctor`.
pub fn run(args: &crate::cli::DoctorArgs) -> std::process::ExitCode {
    let spec = match args.gpus.as_deref().map(parse_gpus).transpose() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vserve: {e}");
            return std::process::ExitCode::from(64);
        }
    };
    let report = report(spec.as_ref());
    if args.json {
        println!("{report}");
    } else {
        print!("{}", text(&report));
    }
    let unsatisfied = report["gpus"]
        .as_array()
        .is_some_and(|a| a.iter().any(|c| c.get("error").is_some()));
    if unsatisfied {
        std::process::ExitCode::from(69)
    } else {
        std::process::ExitCode::SUCCESS
    }
}

/// Everything the doctor knows, as JSON.
pub fn report(spec: Option<&GpuSpec>) -> Value {
    let driver = crate::decode::select::gpu_driver();
    let devices = match &driver {
        Driver::Present { devices, .. } => gpu_entries(*devices),
        _ => Vec::new(),
    };
    let (version, count) = match &driver {
        Driver::Present { version, devices } => (
            Value::from(crate::decode::gpus::version_string(*version)),
            Value::from(*devices),
        ),
        _ => (Value::Null, Value::from(0)),
    };
    let mut choices = vec![GpuSpec::Auto];
    if let Some(s) = spec {
        if *s != GpuSpec::Auto {
            choices.push(s.clone());
        }
    }
    let gpus: Vec<Value> = choices
        .iter()
        .map(|s| match resolve(s, &driver) {
            Ok(c) => json!({"spec": s.to_string(), "gpus": c.gpus, "why": c.why}),
            Err(e) => json!({"spec": s.to_string(), "error": e}),
        })
        .collect();
    let decoders: serde_json::Map<String, Value> = CODECS
        .iter()
        .map(|c| {
            let list: Vec<Value> = ffmpeg::decoders_of(c)
                .into_iter()
                .map(|d| json!({"name": d.name, "cuda_hwaccel": d.cuda_hwaccel}))
                .collect();
            (c.to_string(), Value::from(list))
        })
        .collect();
    let libs: serde_json::Map<String, Value> = ffmpeg::library_versions()
        .into_iter()
        .map(|(n, v)| (n.to_owned(), Value::from(v)))
        .collect();
    json!({
        "ffmpeg": {"release": ffmpeg::release(), "libraries": libs},
        "decoders": decoders,
        "hwaccels": ffmpeg::hwaccel_types(),
        "cuda": {
            "built": !matches!(driver, Driver::NotBuilt),
            "driver": driver.describe(),
            "present": matches!(driver, Driver::Present { .. }),
            "version": version,
            "devices": count,
        },
        "devices": devices,
        "gpus": gpus,
    })
}

#[cfg(feature = "cuda")]
fn gpu_entries(count: u32) -> Vec<Value> {
    (0..count)
        .map(|g| match crate::decode::cuda::gpu_info(g) {
            Ok(info) => {
                let nvdec = match &info.nvdec {
                    Ok(caps) => Value::from(
                        caps.iter()
                            .map(|c| {
                                json!({
                                    "codec": c.codec,
                                    "supported": c.supported,
                                    "max_width": c.max_width,
                                    "max_height": c.max_height,
                                    "min_width": c.min_width,
                                    "min_height": c.min_height,
                                    "engines": c.engines,
                                })
                            })
                            .collect::<Vec<_>>(),
                    ),
                    Err(e) => json!({"error": e}),
                };
                json!({
                    "ordinal": g,
                    "name": info.name,
                    "memory_bytes": info.memory_bytes,
                    "compute_capability": format!("{}.{}", info.compute.0, info.compute.1),
                    "nvdec": nvdec,
                })
            }
            Err(e) => json!({"ordinal": g, "error": e}),
        })
        .collect()
}

#[cfg(not(feature = "cuda"))]
fn gpu_entries(_count: u32) -> Vec<Value> {
    Vec::new()
}

/// The report as text, one fact per line.
pub fn text(r: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_owned();
    let mut out = String::new();
    let libs: Vec<String> = r["ffmpeg"]["libraries"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k} {}", s(v))).collect())
        .unwrap_or_default();
    out += &format!(
        "FFmpeg {}: {}\n",
        s(&r["ffmpeg"]["release"]),
        libs.join(", ")
    );
    out += "decoders:\n";
    for c in CODECS {
        let names: Vec<String> = r["decoders"][c]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|d| {
                        let name = s(&d["name"]);
                        if d["cuda_hwaccel"].as_bool() == Some(true) {
                            format!("{name} (cuda hwaccel)")
                        } else {
                            name
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let names = if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        };
        out += &format!("  {c}: {names}\n");
    }
    let hw: Vec<String> = r["hwaccels"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    out += &format!(
        "hwaccels: {}\n",
        if hw.is_empty() {
            "none".to_owned()
        } else {
            hw.join(", ")
        }
    );
    out += &format!("CUDA: {}\n", s(&r["cuda"]["driver"]));
    let devices = r["devices"].as_array().cloned().unwrap_or_default();
    out += &format!("GPUs: {}\n", devices.len());
    for d in &devices {
        if let Some(e) = d.get("error") {
            out += &format!("  GPU {}: {}\n", d["ordinal"], s(e));
            continue;
        }
        let gib = d["memory_bytes"].as_u64().unwrap_or(0) as f64 / (1u64 << 30) as f64;
        out += &format!(
            "  GPU {}: {}, {gib:.1} GiB, compute capability {}\n",
            d["ordinal"],
            s(&d["name"]),
            s(&d["compute_capability"])
        );
        match d["nvdec"].as_array() {
            Some(caps) => {
                let c: Vec<String> = caps
                    .iter()
                    .map(|c| {
                        if c["supported"].as_bool() == Some(true) {
                            format!(
                                "{} up to {}x{}",
                                s(&c["codec"]),
                                c["max_width"],
                                c["max_height"]
                            )
                        } else {
                            format!("{} no", s(&c["codec"]))
                        }
                    })
                    .collect();
                let engines = caps
                    .first()
                    .and_then(|c| c["engines"].as_u64())
                    .filter(|&n| n > 0)
                    .map(|n| format!(" ({n} engines)"))
                    .unwrap_or_default();
                out += &format!("    NVDEC 8-bit 4:2:0{engines}: {}\n", c.join(", "));
            }
            None => out += &format!("    NVDEC: {}\n", s(&d["nvdec"]["error"])),
        }
    }
    for g in r["gpus"].as_array().cloned().unwrap_or_default() {
        match g.get("error") {
            Some(e) => out += &format!("--gpus {}: fails: {}\n", s(&g["spec"]), s(e)),
            None => {
                let list: Vec<String> = g["gpus"]
                    .as_array()
                    .map(|a| a.iter().map(|v| v.to_string()).collect())
                    .unwrap_or_default();
                let on = if list.is_empty() {
                    "CPU".to_owned()
                } else {
                    format!("GPUs {}", list.join(","))
                };
                out += &format!(
                    "--gpus {} would use: {on} ({})\n",
                    s(&g["spec"]),
                    s(&g["why"])
                );
            }
        }
    }
    out
}
