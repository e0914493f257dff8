//! Probe: one video's frame table and stream facts, indexing it if it is not yet.
//!
//! A reply with the per-frame times (`include_pts`) is as long as the video: 900k frames make vectors of
//! 14 MB and a message of about as much again. Its bytes are reserved against the in-flight budget
//! ([`crate::budget`]) before it is made, and held until the reply is written, as GetClips replies are;
//! 64 such Probes in flight used to hold hundreds of MB no budget saw (probe P, F5).

use std::sync::Arc;

use crate::budget::{Reservation, Who};
use crate::engine::Engine;
use crate::error::Error;
use crate::index::VideoIndex;
use crate::peer::Peer;

/// Bytes a reply holds per frame with its times: the pts and duration vectors (8 bytes each) and their
/// encoding (at most 10 bytes each as varints).
pub const BYTES_PER_FRAME_WITH_PTS: u64 = 36;

/// A probed video, and the budget its reply holds.
pub struct Probed {
    pub index: Arc<VideoIndex>,
    /// Held until the reply is written (None without per-frame times: a few hundred bytes).
    pub reservation: Option<Reservation>,
}

/// The index of `video` in `dataset` (`stream`: a container stream index, else FFmpeg's best video
/// stream), with the reply's bytes reserved when it will carry every frame's times.
pub async fn probe(
    engine: &Arc<Engine>,
    dataset: &str,
    video: &str,
    stream: Option<u32>,
    include_pts: bool,
    peer: &Peer,
) -> Result<Probed, Error> {
    let _inflight = engine.request_started();
    let (_, index, _) = engine
        .catalog()
        .resolve(dataset, video, stream, &peer.key)
        .await?;
    let reservation = if include_pts {
        let frames = index.frame_count() as u64;
        let who = Who::new(format!(
            "Probe of {video:?} with the times of its {frames} frames"
        ))
        .client(peer);
        Some(
            engine
                .budget()
                .try_reserve(frames.saturating_mul(BYTES_PER_FRAME_WITH_PTS), who)
                .await?,
        )
    } else {
        None
    };
    Ok(Probed { index, reservation })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine over the committed demo clips (real indexes, fake decoding) with a budget of `bytes`.
    fn engine(bytes: &str) -> Arc<Engine> {
        let config = crate::cli::ServeArgs {
            dataset: vec![concat!("demo=", env!("CARGO_MANIFEST_DIR"), "/tests/data/demo").into()],
            decode_threads: Some(1),
            state_dir: Some("none".into()),
            max_inflight_bytes: Some(bytes.into()),
            ..Default::default()
        }
        .to_config()
        .unwrap();
        let factory: crate::decode::fleet::BackendFactory =
            Arc::new(|_| Box::new(crate::decode::fake::FakeBackend::default()));
        Engine::new(&config, factory).unwrap()
    }

    /// A Probe with every frame's times reserves its reply's bytes, which a budget too small refuses
    /// by name; without the times it reserves nothing.
    #[tokio::test]
    async fn a_probe_with_times_reserves_its_reply() {
        let peer = Peer::local();
        let e = engine("1MiB");
        let plain = probe(&e, "demo", "nasa_13013.mp4", None, false, &peer)
            .await
            .unwrap();
        assert!(plain.reservation.is_none());
        let frames = plain.index.frame_count() as u64;
        assert_eq!(frames, 390);
        let with = probe(&e, "demo", "nasa_13013.mp4", None, true, &peer)
            .await
            .unwrap();
        let r = with.reservation.expect("reserved");
        assert_eq!(r.bytes(), frames * BYTES_PER_FRAME_WITH_PTS);
        assert_eq!(e.budget().in_use(), frames * BYTES_PER_FRAME_WITH_PTS);
        drop(r);
        assert_eq!(e.budget().in_use(), 0);

        // 390 frames need 14,040 bytes: a budget of 8 KiB refuses them at once.
        let small = engine("8KiB");
        let err = probe(&small, "demo", "nasa_13013.mp4", None, true, &peer)
            .await
            .err()
            .expect("refused");
        assert_eq!(err.code(), crate::error::Code::ResourceExhausted);
        let m = err.to_string();
        assert!(
            m.contains(
                "Probe of \"nasa_13013.mp4\" with the times of its 390 frames needs 14040 bytes"
            ),
            "{m}"
        );
        assert!(probe(&small, "demo", "nasa_13013.mp4", None, false, &peer)
            .await
            .is_ok());
    }
}
