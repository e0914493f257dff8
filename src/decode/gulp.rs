//! The GulpIO backend: a "run" of a stored video is its wanted frames, each JPEG-decoded on its own (every
//! stored frame is a keyframe), then resized to the geometry's size with the batch stage's bilinear
//! resize when the request asks for another size. Stored frames carry no rotation.
//!
//! A record that is missing, lies past the end of its data file or is not valid JPEG fails the run with
//! [`DecodeError::MissingFrames`] naming that frame (DATA_LOSS at the edge).

use std::sync::Arc;

use super::{DecodeError, Frame, Geometry, GopRun, RunOutput, VideoSource};
use crate::gulp::jpeg::Decoder;

#[derive(Default)]
pub struct GulpBackend {
    /// Created on first use, kept for the thread's lifetime.
    decoder: Option<Decoder>,
    /// The record being decoded, reused across frames.
    record: Vec<u8>,
}

impl GulpBackend {
    pub fn decode_run(
        &mut self,
        source: &VideoSource,
        run: &GopRun,
        geometry: Geometry,
    ) -> Result<RunOutput, DecodeError> {
        let missing = |k: usize, detail: String| DecodeError::MissingFrames {
            path: source.path.clone(),
            frames: vec![k],
            detail: format!(": {detail}"),
        };
        let Some(video) = &source.gulp else {
            return Err(DecodeError::Backend {
                path: source.path.clone(),
                reason: "not a stored (gulp) video".into(),
            });
        };
        let decoder = match &mut self.decoder {
            Some(d) => d,
            slot => slot.insert(Decoder::new().map_err(|e| DecodeError::Backend {
                path: source.path.clone(),
                reason: e.to_string(),
            })?),
        };
        let (w, h) = (geometry.scaled_width, geometry.scaled_height);
        let mut frames = Vec::with_capacity(run.wanted.len());
        let first = run.wanted.first().copied().unwrap_or(0);
        let records = video
            .dataset
            .records(&video.id)
            .map_err(|e| missing(first, e.to_string()))?;
        for &k in &run.wanted {
            records
                .read(k, &mut self.record)
                .map_err(|e| missing(k, e.to_string()))?;
            let rgb = decoder
                .decode(&self.record, video.dataset.max_pixels)
                .map_err(|e| missing(k, format!("not a valid JPEG: {e}")))?;
            let frame = if (rgb.width, rgb.height) == (w, h) {
                Frame {
                    width: w,
                    height: h,
                    data: rgb.data,
                }
            } else {
                let mut data = vec![0u8; w as usize * h as usize * 3];
                super::resize::resize_bilinear(&rgb.data, rgb.width, rgb.height, &mut data, w, h);
                Frame {
                    width: w,
                    height: h,
                    data,
                }
            };
            frames.push((k, Arc::new(frame)));
        }
        if self.record.capacity() > 16 << 20 {
            // One outsized record does not keep its buffer for the thread's life.
            self.record = Vec::new();
        }
        Ok(RunOutput {
            frames,
            sunk: Vec::new(),
            decoded: run.wanted.len() as u64,
            skipped: 0,
            ..Default::default()
        })
    }
}
