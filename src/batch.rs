//! Batch assembly: per-request augmentation and layout of frames into one array.
//!
//! Input: frames [clips][T] (all the same size, packed RGB24) and a [`BatchSpec`]. Output: the bytes of one
//! little-endian C-order array of shape [clips, T, H, W, 3] (THWC) or [clips, T, 3, H, W] (TCHW) after a
//! centre crop, an optional horizontal flip and conversion to uint8, float16 or float32
//! (float: `(x / 255 - mean[c]) / std[c]`, computed in f32). Streams give each clip its own crop box,
//! resize and flip instead ([`assemble_augmented`]).

use std::sync::Arc;

use crate::decode::resize::resize_bilinear;
use crate::decode::Frame;
use crate::sample::{ClipAug, CropBox};

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
    #[error("output buffer of {0} bytes is smaller than the batch's {1}")]
    OutputTooSmall(usize, usize),
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
    assemble_augmented(clips, &centre_augs(clips, spec)?, spec)
}

/// The per-clip augmentation [`assemble`] applies: the spec's crop centred in each clip's frames, and its
/// flip (for [`augmented_shape`] and [`assemble_augmented_into`], to assemble in place).
pub fn centre_augs(
    clips: &[Vec<Arc<Frame>>],
    spec: &BatchSpec,
) -> Result<Vec<ClipAug>, BatchError> {
    clips
        .iter()
        .map(|clip| {
            let f = clip.first().ok_or(BatchError::Empty)?;
            let crop = match spec.crop {
                None => None,
                Some((cw, ch)) => {
                    if cw > f.width || ch > f.height || cw == 0 || ch == 0 {
                        return Err(BatchError::CropTooLarge {
                            cw,
                            ch,
                            w: f.width,
                            h: f.height,
                        });
                    }
                    Some(CropBox::centred(f.width, f.height, cw, ch))
                }
            };
            Ok(ClipAug {
                crop,
                resize_to: None,
                flip: spec.hflip,
            })
        })
        .collect()
}

/// Assembles the array with a per-clip crop box, resize and flip (`spec.crop` and `spec.hflip` are not
/// used). Every clip must come out the same size.
pub fn assemble_augmented(
    clips: &[Vec<Arc<Frame>>],
    augs: &[ClipAug],
    spec: &BatchSpec,
) -> Result<(Vec<u64>, Vec<u8>), BatchError> {
    let shape = augmented_shape(clips, augs, spec)?;
    let mut out = vec![0u8; shape_bytes(&shape, spec)];
    fill(clips, augs, spec, &shape, &mut out);
    Ok((shape.to_vec(), out))
}

/// Bytes of an array of `shape` in the spec's dtype.
pub fn shape_bytes(shape: &[u64; 5], spec: &BatchSpec) -> usize {
    shape.iter().product::<u64>() as usize * spec.dtype.size()
}

/// As [`assemble_augmented`], into `out` (at least [`shape_bytes`] long; a shared-memory slot).
pub fn assemble_augmented_into(
    clips: &[Vec<Arc<Frame>>],
    augs: &[ClipAug],
    spec: &BatchSpec,
    out: &mut [u8],
) -> Result<Vec<u64>, BatchError> {
    let shape = augmented_shape(clips, augs, spec)?;
    let n = shape_bytes(&shape, spec);
    if out.len() < n {
        return Err(BatchError::OutputTooSmall(out.len(), n));
    }
    fill(clips, augs, spec, &shape, &mut out[..n]);
    Ok(shape.to_vec())
}

/// Checks that every clip has T frames holding its crop and comes out the same size; the output shape.
pub fn augmented_shape(
    clips: &[Vec<Arc<Frame>>],
    augs: &[ClipAug],
    spec: &BatchSpec,
) -> Result<[u64; 5], BatchError> {
    let first = clips
        .first()
        .and_then(|c| c.first())
        .ok_or(BatchError::Empty)?;
    if augs.len() != clips.len() {
        return Err(BatchError::Empty);
    }
    let t = clips[0].len();
    let (ow, oh) = out_size(first, &augs[0]);
    for (clip, aug) in clips.iter().zip(augs) {
        if clip.len() != t {
            return Err(BatchError::RaggedClips(t, clip.len()));
        }
        for f in clip {
            if let Some(c) = aug.crop {
                if c.width == 0
                    || c.height == 0
                    || c.x + c.width > f.width
                    || c.y + c.height > f.height
                {
                    return Err(BatchError::CropTooLarge {
                        cw: c.width,
                        ch: c.height,
                        w: f.width,
                        h: f.height,
                    });
                }
            }
            let (w, h) = out_size(f, aug);
            if (w, h) != (ow, oh) {
                return Err(BatchError::MixedSizes(ow, oh, w, h));
            }
        }
    }
    Ok(match spec.layout {
        Layout::Thwc => [clips.len() as u64, t as u64, oh as u64, ow as u64, 3],
        Layout::Tchw => [clips.len() as u64, t as u64, 3, oh as u64, ow as u64],
    })
}

fn out_size(f: &Frame, aug: &ClipAug) -> (u32, u32) {
    aug.resize_to
        .or(aug.crop.map(|c| (c.width, c.height)))
        .unwrap_or((f.width, f.height))
}

/// Writes checked clips into `out` (exactly the shape's bytes).
fn fill(
    clips: &[Vec<Arc<Frame>>],
    augs: &[ClipAug],
    spec: &BatchSpec,
    shape: &[u64; 5],
    out: &mut [u8],
) {
    let (oh, ow) = match spec.layout {
        Layout::Thwc => (shape[2] as u32, shape[3] as u32),
        Layout::Tchw => (shape[3] as u32, shape[4] as u32),
    };
    let per_frame = ow as usize * oh as usize * 3;
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
    // uint8 THWC frames are the output bytes themselves: written in place, no second copy.
    let direct = spec.dtype == DType::U8 && spec.layout == Layout::Thwc;
    let mut scratch = if direct {
        Vec::new()
    } else {
        vec![0u8; per_frame]
    };
    let mut cropped = Vec::new();
    let mut i = 0;
    for (clip, aug) in clips.iter().zip(augs) {
        for frame in clip {
            let target: &mut [u8] = if direct {
                &mut out[i * per_frame..(i + 1) * per_frame]
            } else {
                &mut scratch
            };
            let crop = aug.crop.unwrap_or(CropBox {
                x: 0,
                y: 0,
                width: frame.width,
                height: frame.height,
            });
            let src_row = frame.width as usize * 3;
            let row_bytes = crop.width as usize * 3;
            let rows = (0..crop.height as usize).map(|y| {
                &frame.data[(crop.y as usize + y) * src_row + crop.x as usize * 3..][..row_bytes]
            });
            match aug.resize_to {
                None => {
                    for (y, src) in rows.enumerate() {
                        let dst = &mut target[y * row_bytes..][..row_bytes];
                        if aug.flip {
                            flip_row(src, dst);
                        } else {
                            dst.copy_from_slice(src);
                        }
                    }
                }
                Some((rw, rh)) => {
                    cropped.clear();
                    for src in rows {
                        cropped.extend_from_slice(src);
                    }
                    resize_bilinear(&cropped, crop.width, crop.height, target, rw, rh);
                    if aug.flip {
                        let rb = rw as usize * 3;
                        let mut copy = vec![0u8; rb];
                        for y in 0..rh as usize {
                            let row = &mut target[y * rb..][..rb];
                            copy.copy_from_slice(row);
                            flip_row(&copy, row);
                        }
                    }
                }
            }
            if !direct {
                convert(&scratch, out, i, ow, oh, spec, &lut);
            }
            i += 1;
        }
    }
}

/// Writes the RGB pixels of `src` into `dst` right to left (a horizontal flip of one row).
fn flip_row(src: &[u8], dst: &mut [u8]) {
    debug_assert!(src.len() == dst.len() && src.len().is_multiple_of(3));
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("ssse3") {
        // SAFETY: the CPU has SSSE3 (checked just above).
        unsafe { flip::row_ssse3(src, dst) };
        return;
    }
    flip::row_scalar(src, dst);
}

/// The row flip: 16 pixels (48 bytes, three registers) at a time with SSSE3 byte shuffles, about four
/// times as fast as pixel by pixel on a 224-pixel row; the pixels left over go one by one.
mod flip {
    /// Pixel by pixel from the right, without a bounds check per pixel.
    pub(super) fn row_scalar(src: &[u8], dst: &mut [u8]) {
        for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(3).rev()) {
            d.copy_from_slice(s);
        }
    }

    /// `MASKS[3 * r + s]` picks, for output register `r` of a reversed 16-pixel block, the bytes that
    /// come from input register `s` (0x80: none, the shuffle writes 0 there).
    #[cfg(target_arch = "x86_64")]
    const MASKS: [[u8; 16]; 9] = {
        let mut m = [[0x80u8; 16]; 9];
        let mut k = 0;
        while k < 48 {
            // Output byte k is channel k % 3 of pixel k / 3, which is input pixel 15 - k / 3.
            let src = (15 - k / 3) * 3 + k % 3;
            m[(k / 16) * 3 + src / 16][k % 16] = (src % 16) as u8;
            k += 1;
        }
        m
    };

    /// # Safety
    /// The CPU must support SSSE3; `src` and `dst` must have the same length, a multiple of 3.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "ssse3")]
    pub(super) unsafe fn row_ssse3(src: &[u8], dst: &mut [u8]) {
        use std::arch::x86_64::{
            __m128i, _mm_loadu_si128, _mm_or_si128, _mm_shuffle_epi8, _mm_storeu_si128,
        };
        let n = src.len().min(dst.len()) / 3;
        let blocks = n / 16;
        let m: [__m128i; 9] =
            std::array::from_fn(|i| _mm_loadu_si128(MASKS[i].as_ptr() as *const __m128i));
        for b in 0..blocks {
            // Input pixels n - 16 (b + 1) .. n - 16 b, reversed, are output pixels 16 b .. 16 (b + 1):
            // both 48 bytes inside the slices (b < blocks <= n / 16).
            let s = src.as_ptr().add((n - 16 * (b + 1)) * 3);
            let i = [
                _mm_loadu_si128(s as *const __m128i),
                _mm_loadu_si128(s.add(16) as *const __m128i),
                _mm_loadu_si128(s.add(32) as *const __m128i),
            ];
            let d = dst.as_mut_ptr().add(b * 48);
            for r in 0..3 {
                let o = _mm_or_si128(
                    _mm_or_si128(
                        _mm_shuffle_epi8(i[0], m[3 * r]),
                        _mm_shuffle_epi8(i[1], m[3 * r + 1]),
                    ),
                    _mm_shuffle_epi8(i[2], m[3 * r + 2]),
                );
                _mm_storeu_si128(d.add(16 * r) as *mut __m128i, o);
            }
        }
        let done = blocks * 16;
        row_scalar(&src[..(n - done) * 3], &mut dst[done * 3..n * 3]);
    }
}

/// Writes frame `i` (packed HWC bytes of `w`x`h`) into the output in the spec's dtype and layout.
fn convert(
    scratch: &[u8],
    out: &mut [u8],
    i: usize,
    w: u32,
    h: u32,
    spec: &BatchSpec,
    lut: &[[f32; 256]],
) {
    let plane = w as usize * h as usize;
    let per_frame = plane * 3;
    let base = i * per_frame;
    // Position of element (pixel p, channel c) in this frame's output.
    let pos = |p: usize, c: usize| match spec.layout {
        Layout::Thwc => base + p * 3 + c,
        Layout::Tchw => base + c * plane + p,
    };
    match spec.dtype {
        DType::U8 => {
            if spec.layout == Layout::Thwc {
                out[base..base + per_frame].copy_from_slice(&scratch[..per_frame]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_row_has_its_pixels_in_reverse_order_at_every_width() {
        // Widths around the 16-pixel blocks (none, one, several, with and without a tail).
        for width in (0..=70).chain([223, 224, 225, 340]) {
            let src: Vec<u8> = (0..width * 3).map(|i| (i * 7 % 251) as u8).collect();
            let mut dst = vec![0xEE; width * 3];
            flip_row(&src, &mut dst);
            for x in 0..width {
                assert_eq!(
                    dst[3 * x..3 * x + 3],
                    src[3 * (width - 1 - x)..3 * (width - x)],
                    "width {width}, pixel {x}"
                );
            }
            let mut scalar = vec![0xEE; width * 3];
            flip::row_scalar(&src, &mut scalar);
            assert_eq!(scalar, dst, "width {width}: both paths agree");
        }
    }

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
    fn per_clip_crop_resize_and_flip() {
        // Clip 0: box x 1..3, y 0..2 of the 4x2 frame, flipped; clip 1: the whole frame resized to 2x1.
        let augs = [
            ClipAug {
                crop: Some(CropBox {
                    x: 1,
                    y: 0,
                    width: 2,
                    height: 1,
                }),
                resize_to: None,
                flip: true,
            },
            ClipAug {
                crop: None,
                resize_to: Some((2, 1)),
                flip: false,
            },
        ];
        let (shape, out) = assemble_augmented(
            &[vec![frame()], vec![frame()]],
            &augs,
            &BatchSpec::default(),
        )
        .unwrap();
        assert_eq!(shape, vec![2, 1, 1, 2, 3]);
        assert_eq!(&out[..6], &[2, 102, 200, 1, 101, 200]);
        // 4x2 → 2x1: output x samples source x = 0.5 and 2.5, y = 0.5; red = 10*y + x → 5.5 and 7.5,
        // rounded half away from zero.
        let reds: Vec<u8> = out[6..].chunks_exact(3).map(|p| p[0]).collect();
        assert_eq!(reds, vec![6, 8]);
        let mixed = [augs[0], ClipAug::default()];
        assert!(matches!(
            assemble_augmented(
                &[vec![frame()], vec![frame()]],
                &mixed,
                &BatchSpec::default()
            ),
            Err(BatchError::MixedSizes(2, 1, 4, 2))
        ));
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
