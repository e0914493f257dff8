//! Probe: one video's frame table and stream facts, indexing it if it is not yet.

use std::sync::Arc;

use crate::engine::Engine;
use crate::error::Error;
use crate::index::VideoIndex;
use crate::peer::Peer;

/// The index of `video` in `dataset` (`stream`: a container stream index, else FFmpeg's best video
/// stream).
pub async fn probe(
    engine: &Arc<Engine>,
    dataset: &str,
    video: &str,
    stream: Option<u32>,
    peer: &Peer,
) -> Result<Arc<VideoIndex>, Error> {
    let _inflight = engine.request_started();
    let (_, index, _) = engine
        .catalog()
        .resolve(dataset, video, stream, &peer.key)
        .await?;
    Ok(index)
}
