//! Decoded frame → packed RGB24 through swscale (the frame's colour matrix and range, BILINEAR for
//! resizes, bicubic at native size), with display rotation applied to the planes first where the CLI's
//! autorotation puts it.
//!
//! Native size is the video's, which is its first frame's. A stream that changes size makes the CLI
//! rebuild its filter graph with a scale filter to the size its output started with (`-sws_flags`,
//! default BICUBIC) before the sink; this does what that graph does ([`Scaling`]): at native size a frame
//! of another size is scaled to it with BICUBIC in the conversion to RGB; resized, such a frame is first
//! resized (BILINEAR) in its own pixel format, then converted (BICUBIC), as the rebuilt graph's two scale
//! filters do.

use ffmpeg_next as ff;

use crate::decode::{oriented, rotate_rgb, Frame, Geometry};

/// How a frame reaches its output size, as the CLI's filter graph gets it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scaling {
    /// The video's own size: one BICUBIC conversion (and scale, for a frame of another size).
    Native,
    /// A resize of a frame of the video's size: one BILINEAR scale and conversion (a size equal to the
    /// video's included: the scale filter converts to RGB24 with its own flags).
    Resize,
    /// A resize of a frame of another size: BILINEAR resize in the frame's format, then a BICUBIC
    /// conversion.
    ResizeChanged,
}

/// A cached swscale context for one (input format, size, colour) → (RGB24, size) conversion.
pub(super) struct Converter {
    key: (i32, u32, u32, i32, i32, u32, u32, Scaling),
    /// The resize before the conversion ([`Scaling::ResizeChanged`]), and its output frame.
    pre: Option<(ff::software::scaling::Context, ff::frame::Video)>,
    ctx: ff::software::scaling::Context,
    out: ff::frame::Video,
}

/// The colour matrix FFmpeg's scale filter gives swscale for a frame tagged `cs` (its default
/// `in_color_matrix=auto`): the tag, unless it names no YUV matrix swscale has (RGB, YCgCo, unknown),
/// which reads as BT.601. (`sws_getCoefficients` alone would map RGB, value 0, to BT.709's row: every
/// frame of planar RGB above 8 bits, which swscale converts through YUV, came out 40 levels off.)
fn scale_filter_matrix(cs: i32) -> i32 {
    if (1..=10).contains(&cs) && cs != 8 {
        cs
    } else {
        ff::ffi::AVColorSpace::AVCOL_SPC_BT470BG as i32
    }
}

/// Gives `ctx` the source's colour matrix and range as FFmpeg's scale filter does: the matrix of
/// [`scale_filter_matrix`] for both sides (the filter's output matrix follows its input's), the
/// source's range where the frame states one, and otherwise swscale's own defaults for the formats
/// (full range for gray above 8 bits and gray+alpha, which forcing limited would shift by up to 20
/// levels). `dst_full`: the destination's range, or None for swscale's default.
fn colour_details(
    ctx: &mut ff::software::scaling::Context,
    cs: i32,
    range: i32,
    dst_full: Option<i32>,
) {
    // SAFETY: `ctx` is a valid initialised SwsContext; sws_getColorspaceDetails writes through the
    // out-pointers given, all valid locals; sws_getCoefficients returns a static table for the values
    // scale_filter_matrix returns.
    unsafe {
        let (mut inv, mut table) = (std::ptr::null_mut(), std::ptr::null_mut());
        let (mut src_full, mut out_full, mut brightness, mut contrast, mut saturation) =
            (0, 0, 0, 0, 0);
        let ret = ff::ffi::sws_getColorspaceDetails(
            ctx.as_mut_ptr(),
            &mut inv,
            &mut src_full,
            &mut table,
            &mut out_full,
            &mut brightness,
            &mut contrast,
            &mut saturation,
        );
        if ret < 0 {
            // Not a YUV/RGB conversion swscale keeps details for (it has none to change).
            return;
        }
        if range == ff::ffi::AVColorRange::AVCOL_RANGE_JPEG as i32 {
            src_full = 1;
        } else if range == ff::ffi::AVColorRange::AVCOL_RANGE_MPEG as i32 {
            src_full = 0;
        }
        let matrix = ff::ffi::sws_getCoefficients(scale_filter_matrix(cs));
        let ret = ff::ffi::sws_setColorspaceDetails(
            ctx.as_mut_ptr(),
            matrix,
            src_full,
            matrix,
            dst_full.unwrap_or(out_full),
            brightness,
            contrast,
            saturation,
        );
        if ret < 0 {
            tracing::debug!(
                cs,
                range,
                "sws_setColorspaceDetails refused; using defaults"
            );
        }
    }
}

impl Converter {
    /// Bytes of its buffers: the RGB output and the resize's frame (counted at 3 bytes a pixel).
    pub(super) fn bytes(&self) -> usize {
        let (w, h) = (self.key.5 as usize, self.key.6 as usize);
        w * h * 3 * (1 + self.pre.is_some() as usize)
    }

    /// Converts `frame` into `place` when given and of the output's size (None comes back), else into a
    /// new [`Frame`] from the buffer pool. swscale writes its own padded buffer either way (its SIMD
    /// paths write whole 8-pixel groups and skip a row's tail when the stride has no room for them, so it
    /// never writes packed rows in place); the rows are then copied once to where they stay.
    fn convert(
        slot: &mut Option<Converter>,
        frame: &ff::frame::Video,
        width: u32,
        height: u32,
        scaling: Scaling,
        place: Option<&mut [u8]>,
    ) -> Result<Option<Frame>, String> {
        use ff::software::scaling::{Context, Flags};
        // SAFETY: `frame` holds a decoded frame; colorspace/color_range/format are plain fields.
        let (fmt, cs, range) = unsafe {
            let f = &*frame.as_ptr();
            (f.format, f.colorspace as i32, f.color_range as i32)
        };
        // A frame of another size than the video's already at the output size is passed through by the
        // user's scale filter (same size, same format) and converted by the CLI's own, BICUBIC.
        let own_size = (width, height) == (frame.width(), frame.height());
        let key = (
            fmt,
            frame.width(),
            frame.height(),
            cs,
            range,
            width,
            height,
            scaling,
        );
        if slot.as_ref().map(|c| c.key) != Some(key) {
            let cannot = |e: ff::Error| format!("swscale cannot convert {:?}: {e}", frame.format());
            // The FFmpeg CLI's own conversion (`-pix_fmt rgb24`) uses swscale's default, BICUBIC; at native
            // size that matters only for formats without a dedicated converter (10-bit), and for frames of
            // another size than the first, which the CLI scales to it. Resizes use BILINEAR.
            let pre = if scaling == Scaling::ResizeChanged && !own_size {
                let mut pre = Context::get(
                    frame.format(),
                    frame.width(),
                    frame.height(),
                    frame.format(),
                    width,
                    height,
                    Flags::BILINEAR,
                )
                .map_err(cannot)?;
                // The scale filter's YUV → YUV: the source's range in, the format's default out.
                colour_details(&mut pre, cs, range, None);
                Some((pre, ff::frame::Video::new(frame.format(), width, height)))
            } else {
                None
            };
            let (from_w, from_h) = if pre.is_some() {
                (width, height)
            } else {
                (frame.width(), frame.height())
            };
            let flags = if scaling == Scaling::Resize {
                Flags::BILINEAR
            } else {
                Flags::BICUBIC
            };
            let mut ctx = Context::get(
                frame.format(),
                from_w,
                from_h,
                ff::format::Pixel::RGB24,
                width,
                height,
                flags,
            )
            .map_err(cannot)?;
            colour_details(&mut ctx, cs, range, Some(1));
            *slot = Some(Converter {
                key,
                pre,
                ctx,
                out: ff::frame::Video::new(ff::format::Pixel::RGB24, width, height),
            });
        }
        let Some(conv) = slot.as_mut() else {
            return Err("converter missing".into());
        };
        let Converter { pre, ctx, out, .. } = conv;
        let source = match pre {
            Some((pre, resized)) => {
                pre.run(frame, resized)
                    .map_err(|e| format!("swscale failed: {e}"))?;
                // The resized frame keeps the source's colour properties (as a filter's output frame does).
                resized.set_color_space(frame.color_space());
                resized.set_color_range(frame.color_range());
                &*resized
            }
            None => frame,
        };
        ctx.run(source, out)
            .map_err(|e| format!("swscale failed: {e}"))?;
        let row = width as usize * 3;
        let stride = out.stride(0);
        let plane = out.data(0);
        let rows = (0..height as usize).map(|y| &plane[y * stride..y * stride + row]);
        if let Some(place) = place.filter(|p| p.len() == row * height as usize) {
            for (dst, src) in place.chunks_exact_mut(row).zip(rows) {
                dst.copy_from_slice(src);
            }
            return Ok(None);
        }
        let mut data = crate::decode::pool::take(row * height as usize);
        for src in rows {
            data.extend_from_slice(src);
        }
        Ok(Some(Frame {
            width,
            height,
            data,
        }))
    }
}

/// Converts a decoded frame to RGB24 at the geometry's size and orientation. `native_size`: the video's
/// size (its first frame's, stored orientation), to which the CLI scales frames of other sizes. With a
/// `place` of the output's size the frame is written there and None comes back; otherwise a new frame.
///
/// Rotation happens where the FFmpeg CLI's autorotation puts it: on the decoded planes, before the
/// conversion (and any scaling), as its `transpose`/`hflip,vflip` filters do. swscale's chroma filtering is
/// not symmetric in x and y, so rotating the RGB image afterwards would differ for most formats (10-bit
/// 4:2:0 by up to 104 levels). 4:2:2 turned by 90/270 follows the CLI's format negotiation (see below).
/// Packed formats without subsampling (RGB0, RGB48, ...) are turned pixel by pixel, as `transpose` turns
/// them. Formats that cannot be turned so (palette, packed 4:2:2, bitstreams) fall back to rotating the
/// RGB image, which may differ from the CLI once resized.
pub(super) fn convert_frame(
    converter: &mut Option<Converter>,
    frame: &ff::frame::Video,
    geometry: Geometry,
    native_size: (u32, u32),
    place: Option<&mut [u8]>,
) -> Result<Option<Frame>, String> {
    let scaling = if !geometry.resized {
        Scaling::Native
    } else if (frame.width(), frame.height()) == native_size {
        Scaling::Resize
    } else {
        Scaling::ResizeChanged
    };
    if !geometry.upright() {
        let widened;
        let mut source = frame;
        if geometry.rotation % 180 == 90 && geometry.resized {
            // `transpose` takes no 4:2:2. Before a scale filter the CLI's format negotiation converts such
            // frames to 4:4:4 (swscale's default, bicubic, scaler) and so does this; at native size it
            // converts straight to RGB before transposing, which is the fallback below.
            if let Some(wide) = chroma_444(frame)? {
                widened = wide;
                source = &widened;
            }
        }
        if let Some(rotated) = rotate_planes(source, geometry.rotation, geometry.mirror) {
            let (w, h) = geometry.display_dims();
            return Converter::convert(converter, &rotated, w, h, scaling, place);
        }
    } else {
        return Converter::convert(
            converter,
            frame,
            geometry.scaled_width,
            geometry.scaled_height,
            scaling,
            place,
        );
    }
    let Some(converted) = Converter::convert(
        converter,
        frame,
        geometry.scaled_width,
        geometry.scaled_height,
        scaling,
        None,
    )?
    else {
        return Err("converter wrote no frame".into());
    };
    let rotated = rotate_rgb(converted, geometry.rotation, geometry.mirror);
    match place {
        Some(p) if p.len() == rotated.data.len() => {
            p.copy_from_slice(&rotated.data);
            drop(rotated);
            Ok(None)
        }
        _ => Ok(Some(rotated)),
    }
}

/// A 4:2:2 frame converted to the 4:4:4 format the CLI's autorotation would convert it to (its format
/// negotiation picks 16-bit 4:4:4 for 10- and 12-bit sources: `-v debug` says "picking yuv444p16le out
/// of ... ref:yuv422p10le"); None for other formats.
fn chroma_444(frame: &ff::frame::Video) -> Result<Option<ff::frame::Video>, String> {
    use ff::format::Pixel;
    let target = match frame.format() {
        Pixel::YUV422P => Pixel::YUV444P,
        Pixel::YUVJ422P => Pixel::YUVJ444P,
        Pixel::YUV422P10LE | Pixel::YUV422P12LE => Pixel::YUV444P16LE,
        _ => return Ok(None),
    };
    let (w, h) = (frame.width(), frame.height());
    let mut ctx = ff::software::scaling::Context::get(
        frame.format(),
        w,
        h,
        target,
        w,
        h,
        ff::software::scaling::Flags::empty(),
    )
    .map_err(|e| format!("swscale cannot widen {:?}: {e}", frame.format()))?;
    let mut out = ff::frame::Video::new(target, w, h);
    ctx.run(frame, &mut out)
        .map_err(|e| format!("swscale failed: {e}"))?;
    out.set_color_space(frame.color_space());
    out.set_color_range(frame.color_range());
    Ok(Some(out))
}

/// Bytes per sample of a format whose planes can be rotated sample by sample, and whether its chroma
/// grid is square (needed to transpose): planar with every component 1 or 2 bytes, the same for all, or
/// packed in one plane without subsampling (a whole pixel of up to 8 bytes moved at once).
fn planar_layout(format: ff::format::Pixel) -> Option<(usize, bool)> {
    // SAFETY: av_pix_fmt_desc_get returns a pointer to a static descriptor, or null for unknown formats.
    let desc = unsafe { ff::ffi::av_pix_fmt_desc_get(format.into()).as_ref()? };
    let flags = desc.flags;
    let planar = flags & ff::ffi::AV_PIX_FMT_FLAG_PLANAR as u64 != 0 || desc.nb_components == 1;
    let odd = (ff::ffi::AV_PIX_FMT_FLAG_PAL
        | ff::ffi::AV_PIX_FMT_FLAG_BITSTREAM
        | ff::ffi::AV_PIX_FMT_FLAG_HWACCEL) as u64;
    if flags & odd != 0 || desc.nb_components == 0 {
        return None;
    }
    let comps = &desc.comp[..desc.nb_components as usize];
    if !planar {
        let step = comps[0].step;
        let one_plane = comps.iter().all(|c| c.plane == 0 && c.step == step);
        let whole = desc.log2_chroma_w == 0 && desc.log2_chroma_h == 0;
        return (one_plane && whole && (1..=8).contains(&step)).then_some((step as usize, true));
    }
    let step = comps[0].step;
    if !(step == 1 || step == 2) || comps.iter().any(|c| c.step != step || c.offset != 0) {
        return None;
    }
    Some((step as usize, desc.log2_chroma_w == desc.log2_chroma_h))
}

/// Rotates every plane of a planar frame clockwise (8- or 16-bit samples) and with `mirror` flips it
/// left-right, as FFmpeg's `transpose`, `hflip` and `vflip` filters do; None for formats this does not
/// handle.
fn rotate_planes(
    frame: &ff::frame::Video,
    rotation: u32,
    mirror: bool,
) -> Option<ff::frame::Video> {
    let transposes = rotation == 90 || rotation == 270;
    let (bytes, square_chroma) = planar_layout(frame.format())?;
    if (transposes && !square_chroma) || !matches!(rotation, 0 | 90 | 180 | 270) {
        return None;
    }
    let (w, h) = (frame.width(), frame.height());
    let (ow, oh) = if transposes { (h, w) } else { (w, h) };
    let mut out = ff::frame::Video::new(frame.format(), ow, oh);
    out.set_color_space(frame.color_space());
    out.set_color_range(frame.color_range());
    for p in 0..frame.planes() {
        let (pw, ph) = (
            frame.plane_width(p) as usize,
            frame.plane_height(p) as usize,
        );
        let src_stride = frame.stride(p);
        let dst_stride = out.stride(p);
        let src = frame.data(p);
        let dst = out.data_mut(p);
        for y in 0..ph {
            for x in 0..pw {
                let (ox, oy) = oriented(x, y, pw, ph, rotation, mirror);
                let s = y * src_stride + x * bytes;
                let d = oy * dst_stride + ox * bytes;
                dst[d..d + bytes].copy_from_slice(&src[s..s + bytes]);
            }
        }
    }
    Some(out)
}
