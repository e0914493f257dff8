//! Batch assembly: per-request augmentation and layout of frames into one array.
//!
//! Input: frames [clips][T] (all the same size, packed RGB24) and a [`BatchSpec`]. Output: the bytes of one
//! little-endian C-order array of shape [clips, T, H, W, 3] (THWC) or [clips, T, 3, H, W] (TCHW) after a
//! centre crop, an optional horizontal flip and conversion to uint8, float16 or float32
//! (float: `(x / 255 - mean[c]) / std[c]`, computed in f32).

use std::sync::Arc;

use crate::decode::Frame;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    U8,
    F16,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Thwc,
    Tchw,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BatchSpec {
    /// Centre crop (width, height); None keeps the whole frame.
    pub crop: Option<(u32, u32)>,
    pub hflip: bool,
    pub dtype: DType,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub layout: Layout,
}

impl Default for BatchSpec {
    fn default() -> Self {
        BatchSpec {
            crop: None,
            hflip: false,
            dtype: DType::U8,
            mean: [0.0; 3],
            std: [1.0; 3],
            layout: Layout::Thwc,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BatchError {
    #[error("crop {cw}x{ch} does not fit in frames of {w}x{h}")]
    CropTooLarge { cw: u32, ch: u32, w: u32, h: u32 },
    #[error("frames differ in size ({0}x{1} and {2}x{3}); request an output size or a crop")]
    MixedSizes(u32, u32, u32, u32),
    #[error("clips differ in length ({0} and {1} frames)")]
    RaggedClips(usize, usize),
    #[error("no frames")]
    Empty,
}

/// Output shape for `clips` clips of `t` frames of `w`x`h` input frames.
pub fn output_shape(
    clips: usize,
    t: usize,
    w: u32,
    h: u32,
    spec: &BatchSpec,
) -> Result<[u64; 5], BatchError> {
    let (ow, oh) = match spec.crop {
        Some((cw, ch)) if cw > w || ch > h || cw == 0 || ch == 0 => {
            return Err(BatchError::CropTooLarge { cw, ch, w, h })
        }
        Some(c) => c,
        None => (w, h),
    };
    Ok(match spec.layout {
        Layout::Thwc => [clips as u64, t as u64, oh as u64, ow as u64, 3],
        Layout::Tchw => [clips as u64, t as u64, 3, oh as u64, ow as u64],
    })
}

/// Assembles the array. Without a crop every frame must have the same size; with one, frames may differ
/// (clips of videos with other aspect ratios) as long as each holds the crop.
pub fn assemble(
    clips: &[Vec<Arc<Frame>>],
    spec: &BatchSpec,
) -> Result<(Vec<u64>, Vec<u8>), BatchError> {
    let first = clips
        .first()
        .and_then(|c| c.first())
        .ok_or(BatchError::Empty)?;
    let (w, h) = (first.width, first.height);
    let t = clips[0].len();
    for clip in clips {
        if clip.len() != t {
            return Err(BatchError::RaggedClips(t, clip.len()));
        }
        for f in clip {
            match spec.crop {
                None if (f.width, f.height) != (w, h) => {
                    return Err(BatchError::MixedSizes(w, h, f.width, f.height));
                }
                Some((cw, ch)) if cw > f.width || ch > f.height => {
                    return Err(BatchError::CropTooLarge {
                        cw,
                        ch,
                        w: f.width,
                        h: f.height,
                    });
                }
                _ => {}
            }
        }
    }
    let shape = output_shape(clips.len(), t, w, h, spec)?;
    let (cw, ch) = spec.crop.unwrap_or((w, h));
    let per_frame = cw as usize * ch as usize * 3;
    let mut out = vec![0u8; clips.len() * t * per_frame * spec.dtype.size()];
    // Per-channel lookup tables: every output value is a function of (channel, byte).
    let lut: Vec<[f32; 256]> = (0..3)
        .map(|c| {
            let mut table = [0f32; 256];
            for (v, slot) in table.iter_mut().enumerate() {
                *slot = (v as f32 / 255.0 - spec.mean[c]) / spec.std[c];
            }
            table
        })
        .collect();
    let mut scratch = vec![0u8; per_frame];
    for (i, frame) in clips.iter().flatten().enumerate() {
        // Crop (and flip) into packed HWC bytes.
        let (x0, y0) = ((frame.width - cw) / 2, (frame.height - ch) / 2);
        let src_row = frame.width as usize * 3;
        for y in 0..ch as usize {
            let src =
                &frame.data[(y0 as usize + y) * src_row + x0 as usize * 3..][..cw as usize * 3];
            let dst = &mut scratch[y * cw as usize * 3..][..cw as usize * 3];
            if spec.hflip {
                for x in 0..cw as usize {
                    let s = (cw as usize - 1 - x) * 3;
                    dst[x * 3..x * 3 + 3].copy_from_slice(&src[s..s + 3]);
                }
            } else {
                dst.copy_from_slice(src);
            }
        }
        let base = i * per_frame;
        let plane = cw as usize * ch as usize;
        // Position of element (pixel p, channel c) in this frame's output.
        let pos = |p: usize, c: usize| match spec.layout {
            Layout::Thwc => base + p * 3 + c,
            Layout::Tchw => base + c * plane + p,
        };
        match spec.dtype {
            DType::U8 => {
                if spec.layout == Layout::Thwc {
                    out[base..base + per_frame].copy_from_slice(&scratch);
                } else {
                    for p in 0..plane {
                        for c in 0..3 {
                            out[pos(p, c)] = scratch[p * 3 + c];
                        }
                    }
                }
            }
            DType::F32 => {
                for p in 0..plane {
                    for c in 0..3 {
                        let v = lut[c][scratch[p * 3 + c] as usize];
                        let at = pos(p, c) * 4;
                        out[at..at + 4].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            DType::F16 => {
                for p in 0..plane {
                    for c in 0..3 {
                        let v = half::f16::from_f32(lut[c][scratch[p * 3 + c] as usize]);
                        let at = pos(p, c) * 2;
                        out[at..at + 2].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
    }
    Ok((shape.to_vec(), out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4x2 frame whose pixel (x, y) is (10*y + x, 100 + x, 200 + y).
    fn frame() -> Arc<Frame> {
        let mut data = Vec::new();
        for y in 0..2u8 {
            for x in 0..4u8 {
                data.extend_from_slice(&[10 * y + x, 100 + x, 200 + y]);
            }
        }
        Arc::new(Frame {
            width: 4,
            height: 2,
            data,
        })
    }

    #[test]
    fn crop_flip_layout_u8() {
        let spec = BatchSpec {
            crop: Some((2, 1)),
            hflip: true,
            layout: Layout::Tchw,
            ..BatchSpec::default()
        };
        let (shape, out) = assemble(&[vec![frame()]], &spec).unwrap();
        assert_eq!(shape, vec![1, 1, 3, 1, 2]);
        // Crop x 1..3, y 0 (of 2 rows: y0 = 0); flipped: x = 2 then 1.
        assert_eq!(out, vec![2, 1, 102, 101, 200, 200]);
    }

    #[test]
    fn float_normalisation() {
        let spec = BatchSpec {
            dtype: DType::F32,
            mean: [0.5, 0.0, 0.0],
            std: [0.5, 1.0, 2.0],
            ..BatchSpec::default()
        };
        let (shape, out) = assemble(&[vec![frame()]], &spec).unwrap();
        assert_eq!(shape, vec![1, 1, 2, 4, 3]);
        let vals: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(vals[0], (0.0 / 255.0 - 0.5) / 0.5);
        assert_eq!(vals[1], (100.0 / 255.0) / 1.0);
        assert_eq!(vals[2], (200.0 / 255.0) / 2.0);
        let spec16 = BatchSpec {
            dtype: DType::F16,
            ..spec
        };
        let (_, out16) = assemble(&[vec![frame()]], &spec16).unwrap();
        let h = half::f16::from_le_bytes([out16[2], out16[3]]);
        assert_eq!(h, half::f16::from_f32(vals[1]));
    }

    #[test]
    fn crop_centres_each_frame_of_mixed_sizes() {
        // A 6x2 frame whose pixel (x, y) has red = 10*y + x; its centre 4x2 starts at x = 1.
        let wide = Arc::new(Frame {
            width: 6,
            height: 2,
            data: (0..2u8)
                .flat_map(|y| (0..6u8).flat_map(move |x| [10 * y + x, 0, 0]))
                .collect(),
        });
        let spec = BatchSpec {
            crop: Some((4, 2)),
            ..BatchSpec::default()
        };
        let (shape, out) = assemble(&[vec![frame()], vec![wide]], &spec).unwrap();
        assert_eq!(shape, vec![2, 1, 2, 4, 3]);
        let reds: Vec<u8> = out.chunks_exact(3).map(|p| p[0]).collect();
        assert_eq!(&reds[..8], &[0, 1, 2, 3, 10, 11, 12, 13]);
        assert_eq!(&reds[8..], &[1, 2, 3, 4, 11, 12, 13, 14]);
    }

    #[test]
    fn rejects_mixed_sizes_and_big_crops() {
        let small = Arc::new(Frame {
            width: 1,
            height: 1,
            data: vec![0; 3],
        });
        assert!(matches!(
            assemble(&[vec![frame()], vec![small]], &BatchSpec::default()),
            Err(BatchError::MixedSizes(4, 2, 1, 1))
        ));
        let spec = BatchSpec {
            crop: Some((5, 1)),
            ..BatchSpec::default()
        };
        assert!(matches!(
            assemble(&[vec![frame()]], &spec),
            Err(BatchError::CropTooLarge { .. })
        ));
    }
}
