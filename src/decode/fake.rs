//! A deterministic fake backend: frame k of any video is a solid colour derived from k, so tests of the
//! fleet, cache and batching run without media or FFmpeg.

use std::sync::Arc;

use super::sink::Sink;
use super::{Backend, DecodeError, Frame, Geometry, GopRun, RunOutput, VideoSource};

#[derive(Default)]
pub struct FakeBackend {
    /// Time each run takes, so tests can overlap requests.
    pub delay: std::time::Duration,
}

/// The pixel value the fake decoder gives every byte of frame k.
pub fn fake_value(k: usize) -> u8 {
    (k % 251) as u8
}

impl Backend for FakeBackend {
    fn decode_run(
        &mut self,
        source: &VideoSource,
        run: &GopRun,
        geometry: Geometry,
        sink: Option<&Sink>,
    ) -> Result<RunOutput, DecodeError> {
        if let Some(&bad) = run
            .wanted
            .iter()
            .find(|&&k| k >= source.index.frame_count())
        {
            return Err(DecodeError::MissingFrames {
                path: source.path.clone(),
                frames: vec![bad],
                detail: String::new(),
            });
        }
        std::thread::sleep(self.delay);
        let (w, h) = geometry.display_dims();
        // Frames with a place in the sink are written there (and also emitted when it is shared).
        let mut sunk = Vec::new();
        let sink = sink.filter(|s| s.frame_bytes() == w as usize * h as usize * 3);
        for &k in &run.wanted {
            if let Some(mut slot) = sink.and_then(|s| s.take(k)) {
                slot.fill(fake_value(k));
                sunk.push(k);
            }
        }
        let frames = run
            .wanted
            .iter()
            .filter(|&&k| sunk.binary_search(&k).is_err() || sink.is_some_and(Sink::shared))
            .map(|&k| {
                let data = vec![fake_value(k); w as usize * h as usize * 3];
                (
                    k,
                    Arc::new(Frame {
                        width: w,
                        height: h,
                        data,
                    }),
                )
            })
            .collect();
        Ok(RunOutput {
            frames,
            sunk,
            decoded: run.span() as u64,
            skipped: 0,
            ..Default::default()
        })
    }
}
