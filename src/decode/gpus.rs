//! Which GPUs the fleet decodes on: `--gpus` resolved against what the CUDA driver reports.
//!
//! Input: a [`GpuSpec`] (validated syntax) and a [`Driver`] (what discovery found: no cuda feature, no
//! driver library, a driver that failed to start, or a driver with N devices). Output: the GPU ordinals
//! to use (empty = CPU only) and one line saying why, or an error naming the missing driver or device.
//!
//! Pure: discovery itself (cudarc) lives in `decode/cuda.rs`, so this is unit-tested without a GPU.

use crate::config::GpuSpec;

/// What CUDA discovery found on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Driver {
    /// This binary was built without the `cuda` Cargo feature.
    NotBuilt,
    /// No CUDA driver library could be loaded; the reason names what was looked for.
    Absent(String),
    /// The driver library loaded but did not start (`cuInit` or a query failed).
    Failed(String),
    /// A working driver: its version (`cuDriverGetVersion`, e.g. 12080) and device count.
    Present { version: i32, devices: u32 },
}

impl Driver {
    /// One line for logs and `vserve doctor`, e.g. "CUDA driver 12.8 present, 2 devices".
    pub fn describe(&self) -> String {
        match self {
            Driver::NotBuilt => "built without the cuda feature".to_owned(),
            Driver::Absent(why) => format!("no CUDA driver ({why})"),
            Driver::Failed(why) => format!("CUDA driver failed to start ({why})"),
            Driver::Present { version, devices } => format!(
                "CUDA driver {} present, {devices} device{}",
                version_string(*version),
                if *devices == 1 { "" } else { "s" }
            ),
        }
    }
}

/// `12080` → `12.8` (the driver's encoding: 1000 × major + 10 × minor).
pub fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The resolved choice: GPU ordinals to decode on (empty: CPU only) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuChoice {
    pub gpus: Vec<u32>,
    pub why: String,
}

/// Resolves `--gpus` against the driver. `auto` never fails (it falls back to the CPU); `all` and an
/// explicit list fail with a message that starts `--gpus SPEC:` and names the missing driver or device.
pub fn resolve(spec: &GpuSpec, driver: &Driver) -> Result<GpuChoice, String> {
    let unavailable = |why: String| format!("--gpus {spec}: {why}");
    match (spec, driver) {
        (GpuSpec::None, _) => Ok(GpuChoice {
            gpus: Vec::new(),
            why: "--gpus none: decoding on the CPU".to_owned(),
        }),
        (GpuSpec::Auto, Driver::Present { devices, .. }) if *devices > 0 => Ok(GpuChoice {
            gpus: (0..*devices).collect(),
            why: format!("--gpus auto: {}; decoding on NVDEC", driver.describe()),
        }),
        (GpuSpec::Auto, _) => Ok(GpuChoice {
            gpus: Vec::new(),
            why: format!("--gpus auto: {}; decoding on the CPU", driver.describe()),
        }),
        (_, Driver::NotBuilt) => Err(unavailable(
            "this vserve was built without the cuda feature".to_owned(),
        )),
        (_, Driver::Absent(_) | Driver::Failed(_)) => Err(unavailable(driver.describe())),
        (GpuSpec::All, Driver::Present { devices: 0, .. }) => {
            Err(unavailable(format!("no GPU found ({})", driver.describe())))
        }
        (GpuSpec::All, Driver::Present { devices, .. }) => Ok(GpuChoice {
            gpus: (0..*devices).collect(),
            why: format!("--gpus all: {}; decoding on NVDEC", driver.describe()),
        }),
        (GpuSpec::List(list), Driver::Present { devices, .. }) => {
            let missing: Vec<String> = list
                .iter()
                .filter(|&&g| g >= *devices)
                .map(|g| g.to_string())
                .collect();
            if missing.is_empty() {
                return Ok(GpuChoice {
                    gpus: list.clone(),
                    why: format!("--gpus {spec}: {}; decoding on NVDEC", driver.describe()),
                });
            }
            let present: Vec<String> = (0..*devices).map(|g| g.to_string()).collect();
            let reports = match *devices {
                0 => "the driver reports 0 devices".to_owned(),
                1 => "the driver reports 1 device: 0".to_owned(),
                n => format!("the driver reports {n} devices: {}", present.join(", ")),
            };
            Err(unavailable(format!(
                "GPU {} not found ({reports})",
                missing.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present(devices: u32) -> Driver {
        Driver::Present {
            version: 12080,
            devices,
        }
    }

    #[test]
    fn auto_uses_every_gpu_or_falls_back_to_the_cpu() {
        let two = resolve(&GpuSpec::Auto, &present(2)).unwrap();
        assert_eq!(two.gpus, vec![0, 1]);
        assert_eq!(
            two.why,
            "--gpus auto: CUDA driver 12.8 present, 2 devices; decoding on NVDEC"
        );
        let none = resolve(&GpuSpec::Auto, &present(0)).unwrap();
        assert!(none.gpus.is_empty());
        assert_eq!(
            none.why,
            "--gpus auto: CUDA driver 12.8 present, 0 devices; decoding on the CPU"
        );
        let absent = Driver::Absent("libcuda.so.1 not found".into());
        assert_eq!(
            resolve(&GpuSpec::Auto, &absent).unwrap().why,
            "--gpus auto: no CUDA driver (libcuda.so.1 not found); decoding on the CPU"
        );
        assert!(resolve(&GpuSpec::Auto, &Driver::NotBuilt)
            .unwrap()
            .gpus
            .is_empty());
        assert!(resolve(&GpuSpec::None, &present(4))
            .unwrap()
            .gpus
            .is_empty());
    }

    #[test]
    fn explicit_choices_name_what_is_missing() {
        let absent = Driver::Absent("libcuda.so.1 not found".into());
        assert_eq!(
            resolve(&GpuSpec::List(vec![0]), &absent).unwrap_err(),
            "--gpus 0: no CUDA driver (libcuda.so.1 not found)"
        );
        assert_eq!(
            resolve(&GpuSpec::All, &Driver::NotBuilt).unwrap_err(),
            "--gpus all: this vserve was built without the cuda feature"
        );
        assert_eq!(
            resolve(&GpuSpec::List(vec![0]), &present(0)).unwrap_err(),
            "--gpus 0: GPU 0 not found (the driver reports 0 devices)"
        );
        assert_eq!(
            resolve(&GpuSpec::List(vec![1, 3]), &present(2)).unwrap_err(),
            "--gpus 1,3: GPU 3 not found (the driver reports 2 devices: 0, 1)"
        );
        assert_eq!(
            resolve(&GpuSpec::All, &present(0)).unwrap_err(),
            "--gpus all: no GPU found (CUDA driver 12.8 present, 0 devices)"
        );
        let failed = Driver::Failed("cuInit: CUDA_ERROR_NO_DEVICE".into());
        assert_eq!(
            resolve(&GpuSpec::All, &failed).unwrap_err(),
            "--gpus all: CUDA driver failed to start (cuInit: CUDA_ERROR_NO_DEVICE)"
        );
        assert_eq!(
            resolve(&GpuSpec::List(vec![0, 1]), &present(2))
                .unwrap()
                .gpus,
            vec![0, 1]
        );
        assert_eq!(resolve(&GpuSpec::All, &present(1)).unwrap().gpus, vec![0]);
    }
}
