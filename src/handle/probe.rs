//! Probe: one video's frame table and stream facts, indexing it if it is not yet.
//!
//! A reply with the per-frame times (`include_pts`) is as long as the video: 900k frames make vectors of
//! 14 MB and a message of about as much again; so is the keyframe list of an all-intra video (MJPEG,
//! ProRes), which every reply carries. A reply's bytes beyond [`FREE_BYTES`] are reserved against the
//! in-flight budget ([`crate::budget`]) before it is made, and held until the reply is written, as
//! GetClips replies are; 64 Probes with times in flight used to hold hundreds of MB no budget saw
//! (probe P, F5).

use std::sync::Arc;

use crate::budget::{Reservation, Who};
use crate::engine::Engine;
use crate::error::Error;
use crate::index::VideoIndex;
use crate::peer::Peer;

/// Bytes a reply holds per frame with its times: the pts and duration vectors (8 bytes each) and their
/// encoding (at most 10 bytes each as varints).
pub const BYTES_PER_FRAME_WITH_PTS: u64 = 36;
/// Bytes a reply holds per keyframe listed: the vector's 8 and at most 10 encoded.
pub const BYTES_PER_KEYFRAME: u64 = 18;
/// Replies up to this many bytes reserve nothing (the budget's bookkeeping would cost more).
pub const FREE_BYTES: u64 = 64 << 10;

/// A probed video, and the budget its reply holds.
pub struct Probed {
    pub index: Arc<VideoIndex>,
    /// The file's version ([`crate::cache::VideoId::version`]).
    pub version: u64,
    /// Held until the reply is written (None for a reply of at most [`FREE_BYTES`]).
    pub reservation: Option<Reservation>,
}

/// The index of `video` in `dataset` (`stream`: a container stream index, else FFmpeg's best video
/// stream), with the reply's bytes reserved when they are many (see the module comment).
pub async fn probe(
    engine: &Arc<Engine>,
    dataset: &str,
    video: &str,
    stream: Option<u32>,
    include_pts: bool,
    peer: &Peer,
) -> Result<Probed, Error> {
    let _inflight = engine.request_started();
    let (id, index, _) = engine
        .catalog()
        .resolve(dataset, video, stream, &peer.key)
        .await?;
    let frames = index.frame_count() as u64;
    let keyframes = index.keyframes.len() as u64;
    let bytes = keyframes
        .saturating_mul(BYTES_PER_KEYFRAME)
        .saturating_add(if include_pts {
            frames.saturating_mul(BYTES_PER_FRAME_WITH_PTS)
        } else {
            0
        });
    let reservation = if bytes > FREE_BYTES {
        let what = if include_pts {
            format!("with the times of its {frames} frames and {keyframes} keyframes")
        } else {
            format!("with its {keyframes} keyframes")
        };
        let who = Who::new(format!("Probe of {video:?} {what}")).client(peer);
        Some(engine.budget().try_reserve(bytes, who).await?)
    } else {
        None
    };
    Ok(Probed {
        index,
        version: id.version(),
        reservation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine over `root` (real indexes, fake decoding) with a budget of `bytes`.
    fn engine(root: &std::path::Path, bytes: &str) -> Arc<Engine> {
        crate::handle::tests::engine(root, Some(bytes))
    }

    /// A Probe reserves its reply's bytes when they are many (every frame's times, or the keyframes of
    /// an all-intra video), which a budget too small refuses by name; a short one reserves nothing.
    #[tokio::test]
    async fn long_probe_replies_reserve_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        // 5000 frames, every one a keyframe (MJPEG).
        let ok = std::process::Command::new("ffmpeg")
            .args([
                "-v",
                "error",
                "-f",
                "lavfi",
                "-i",
                "testsrc=size=16x16:rate=1000",
                "-t",
                "5",
            ])
            .args(["-c:v", "mjpeg"])
            .arg(dir.path().join("intra.avi"))
            .status()
            .unwrap();
        assert!(ok.success());
        crate::handle::tests::demo_video(dir.path(), "nasa.mp4");
        let peer = Peer::local();
        let e = engine(dir.path(), "1MiB");
        // 390 frames, 2 keyframes: 14,076 bytes with the times, under FREE_BYTES.
        let short = probe(&e, "d", "nasa.mp4", None, true, &peer).await.unwrap();
        assert_eq!(short.index.frame_count(), 390);
        assert!(short.reservation.is_none());

        let plain = probe(&e, "d", "intra.avi", None, false, &peer)
            .await
            .unwrap();
        assert_eq!(plain.index.frame_count(), 5000);
        assert_eq!(plain.index.keyframes.len(), 5000);
        let r = plain.reservation.expect("reserved");
        assert_eq!(r.bytes(), 5000 * BYTES_PER_KEYFRAME);
        assert_eq!(e.budget().in_use(), 5000 * BYTES_PER_KEYFRAME);
        drop(r);
        let with = probe(&e, "d", "intra.avi", None, true, &peer)
            .await
            .unwrap();
        let r = with.reservation.expect("reserved");
        assert_eq!(
            r.bytes(),
            5000 * (BYTES_PER_KEYFRAME + BYTES_PER_FRAME_WITH_PTS)
        );
        drop(r);
        assert_eq!(e.budget().in_use(), 0);

        // A budget of 64 KiB cannot hold 90,000 bytes: refused at once.
        let small = engine(dir.path(), "64KiB");
        let err = probe(&small, "d", "intra.avi", None, false, &peer)
            .await
            .err()
            .expect("refused");
        assert_eq!(err.code(), crate::error::Code::ResourceExhausted);
        let m = err.to_string();
        assert!(
            m.contains("Probe of \"intra.avi\" with its 5000 keyframes needs 90000 bytes"),
            "{m}"
        );
        assert!(probe(&small, "d", "nasa.mp4", None, true, &peer)
            .await
            .is_ok());
    }
}
