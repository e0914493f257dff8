//! Test-only fault injection: how the integration tests make a real daemon meet a stuck read or a crash
//! inside the decoder without a hung file system or a poison file at hand. Honoured only in debug builds
//! (`cfg(debug_assertions)`; the tests run the debug binary); a release build compiles [`at_open`] to
//! nothing and ignores the variables.
//!
//! - `VSERVE_TEST_STALL_ON=NAME[,NAME…]`: a thread about to open a file whose name is `NAME` blocks
//!   forever, as a read from a hung NFS mount would.
//! - `VSERVE_TEST_ABORT_ON=NAME[,NAME…]`: the process aborts (`std::process::abort`) there, as a crash
//!   inside libavcodec would.
//!
//! `NAME` may be prefixed with `index:` or `decode:` to fault only index builds or only decode runs.

use std::path::Path;

/// Who is opening the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// An index build (packet scan or decode scan) on a blocking thread.
    Index,
    /// A decode run on a fleet thread.
    Decode,
}

/// Called just before a video is opened by FFmpeg.
pub fn at_open(stage: Stage, path: &Path) {
    #[cfg(debug_assertions)]
    {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if listed("VSERVE_TEST_ABORT_ON", stage, &name) {
            tracing::error!(path = %path.display(), ?stage, "VSERVE_TEST_ABORT_ON: aborting (test-only fault)");
            std::process::abort();
        }
        if listed("VSERVE_TEST_STALL_ON", stage, &name) {
            tracing::warn!(path = %path.display(), ?stage, "VSERVE_TEST_STALL_ON: blocking forever (test-only fault)");
            loop {
                std::thread::park();
            }
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = (stage, path);
}

/// Whether `var` lists `name` for `stage`.
#[cfg(debug_assertions)]
fn listed(var: &str, stage: Stage, name: &str) -> bool {
    let Some(value) = std::env::var_os(var) else {
        return false;
    };
    let value = value.to_string_lossy();
    value.split(',').any(|entry| {
        let (only, file) = match entry.split_once(':') {
            Some(("index", f)) => (Some(Stage::Index), f),
            Some(("decode", f)) => (Some(Stage::Decode), f),
            _ => (None, entry),
        };
        !file.is_empty() && file == name && only.is_none_or(|s| s == stage)
    })
}
