//! Resizing packed RGB24 outside FFmpeg: the bilinear filter of torchvision's `antialias=False` (used by
//! `random_resized_crop` in [`crate::batch`] and for stored JPEG frames in [`super::gulp`]).

/// Bilinear resize of packed RGB, half-pixel centres, no antialiasing (OpenCV's INTER_LINEAR, and
/// torchvision's with antialias=False), rounded to nearest.
pub fn resize_bilinear(src: &[u8], sw: u32, sh: u32, dst: &mut [u8], dw: u32, dh: u32) {
    let (sx, sy) = (sw as f32 / dw as f32, sh as f32 / dh as f32);
    let coord = |d: u32, scale: f32, n: u32| -> (usize, usize, f32) {
        let c = ((d as f32 + 0.5) * scale - 0.5).max(0.0);
        let i0 = (c.floor() as usize).min(n as usize - 1);
        let i1 = (i0 + 1).min(n as usize - 1);
        (i0, i1, c - i0 as f32)
    };
    let xs: Vec<(usize, usize, f32)> = (0..dw).map(|x| coord(x, sx, sw)).collect();
    let row = sw as usize * 3;
    for y in 0..dh {
        let (y0, y1, fy) = coord(y, sy, sh);
        for (x, &(x0, x1, fx)) in xs.iter().enumerate() {
            for c in 0..3 {
                let p = |yy: usize, xx: usize| src[yy * row + xx * 3 + c] as f32;
                let top = p(y0, x0) + (p(y0, x1) - p(y0, x0)) * fx;
                let bottom = p(y1, x0) + (p(y1, x1) - p(y1, x0)) * fx;
                let v = top + (bottom - top) * fy;
                dst[(y as usize * dw as usize + x) * 3 + c] = v.round().clamp(0.0, 255.0) as u8;
            }
        }
    }
}
