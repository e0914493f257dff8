//! Augmentation: a clip's crop box, resize and flip ([`ClipAug`]), drawn from an [`AugmentSpec`] for a
//! frame size with a generator keyed by the clip (see the parent module).

use super::{Rng, SampleError};

/// A crop rectangle in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CropBox {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

impl CropBox {
    /// A `width` x `height` box centred in a `w` x `h` frame as torchvision's `CenterCrop` and
    /// TorchCodec's place it: each offset is half the difference rounded to the nearest integer, ties to
    /// even (Python's `round`), so `(270 - 101) / 2` = 84.5 starts at 84 and `(480 - 201) / 2` = 139.5 at
    /// 140. The caller checks that the box fits.
    pub fn centred(w: u32, h: u32, width: u32, height: u32) -> CropBox {
        let half = |d: u32| {
            let k = d / 2;
            if d % 2 == 1 && k % 2 == 1 {
                k + 1
            } else {
                k
            }
        };
        CropBox {
            x: half(w - width),
            y: half(h - height),
            width,
            height,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CropSpec {
    Random {
        width: u32,
        height: u32,
    },
    RandomResized {
        width: u32,
        height: u32,
        scale: (f64, f64),
        ratio: (f64, f64),
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct AugmentSpec {
    pub crop: Option<CropSpec>,
    pub random_hflip: bool,
}

/// One clip's augmentation: a crop box in the frame, an optional resize of the crop, a flip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClipAug {
    pub crop: Option<CropBox>,
    pub resize_to: Option<(u32, u32)>,
    pub flip: bool,
}

/// Draws a clip's augmentation for frames of `w`x`h`.
pub fn draw_augment(
    spec: &AugmentSpec,
    w: u32,
    h: u32,
    rng: &mut Rng,
) -> Result<ClipAug, SampleError> {
    let mut aug = ClipAug::default();
    match spec.crop {
        None => {}
        Some(CropSpec::Random { width, height }) => {
            if width > w || height > h {
                return Err(SampleError::Invalid(format!(
                    "random crop {width}x{height} does not fit in frames of {w}x{h}"
                )));
            }
            aug.crop = Some(CropBox {
                x: rng.below((w - width + 1) as u64) as u32,
                y: rng.below((h - height + 1) as u64) as u32,
                width,
                height,
            });
        }
        Some(CropSpec::RandomResized {
            width,
            height,
            scale,
            ratio,
        }) => {
            aug.crop = Some(random_resized_box(w, h, scale, ratio, rng));
            aug.resize_to = Some((width, height));
        }
    }
    // Drawn last and always, so adding a flip does not move the crops.
    let flip = rng.unit() < 0.5;
    aug.flip = spec.random_hflip && flip;
    Ok(aug)
}

/// torchvision's RandomResizedCrop.get_params: ten tries at an area in `scale` of the frame and a
/// log-uniform aspect ratio in `ratio`; then the largest centred box with a ratio inside `ratio`.
fn random_resized_box(
    w: u32,
    h: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut Rng,
) -> CropBox {
    let area = w as f64 * h as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * rng.uniform(scale.0, scale.1);
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let cw = (target * aspect).sqrt().round() as i64;
        let ch = (target / aspect).sqrt().round() as i64;
        if 0 < cw && cw <= w as i64 && 0 < ch && ch <= h as i64 {
            let (cw, ch) = (cw as u32, ch as u32);
            return CropBox {
                x: rng.below((w - cw + 1) as u64) as u32,
                y: rng.below((h - ch + 1) as u64) as u32,
                width: cw,
                height: ch,
            };
        }
    }
    let in_ratio = w as f64 / h as f64;
    let (cw, ch) = if in_ratio < ratio.0 {
        (w, ((w as f64 / ratio.0).round() as u32).clamp(1, h))
    } else if in_ratio > ratio.1 {
        (((h as f64 * ratio.1).round() as u32).clamp(1, w), h)
    } else {
        (w, h)
    };
    CropBox {
        x: (w - cw) / 2,
        y: (h - ch) / 2,
        width: cw,
        height: ch,
    }
}
