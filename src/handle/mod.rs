//! One module per RPC's logic, in domain types: [`probe`], [`clips`] (GetClips), [`stream`]
//! (StreamBatches), [`check`] (CheckDataset). Each takes the [`crate::engine::Engine`] and a request from [`crate::request`] (or its
//! own, for streams) and returns domain results; [`crate::api`] converts at the edge.

pub mod check;
pub mod clips;
pub mod probe;
pub mod stream;

/// The nice value of background work (builds ahead of a stream, CheckDataset): 0 is the decode
/// fleet's, 19 the lowest priority, so the fleet wins the cores whenever both want them.
pub const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to [`BACKGROUND_NICE`] (Linux: per thread). A failure
/// leaves it as it was, logged at debug.
pub(crate) fn lower_priority(what: &str) {
    // SAFETY: gettid and setpriority take and return plain integers; they touch only this thread's
    // scheduling priority.
    let r = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            BACKGROUND_NICE,
        )
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the priority of {what}");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::engine::Engine;

    /// A copy of the demo's nasa_13013.mp4 in `dir`, as `name`.
    pub(crate) fn demo_video(dir: &std::path::Path, name: &str) {
        let demo = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/demo/nasa_13013.mp4"
        );
        std::fs::copy(demo, dir.join(name)).unwrap();
    }

    /// An engine over `root` as dataset `d` (real indexes, fake decoding, one decode thread), with
    /// `--max-inflight-bytes` of `bytes` when given.
    pub(crate) fn engine(root: &std::path::Path, bytes: Option<&str>) -> Arc<Engine> {
        let config = crate::cli::ServeArgs {
            dataset: vec![format!("d={}", root.display())],
            decode_threads: Some(1),
            state_dir: Some("none".into()),
            max_inflight_bytes: bytes.map(Into::into),
            ..Default::default()
        }
        .to_config()
        .unwrap();
        let factory: crate::decode::fleet::BackendFactory =
            Arc::new(|_| Box::new(crate::decode::fake::FakeBackend::default()));
        Engine::new(&config, factory).unwrap()
    }
}
