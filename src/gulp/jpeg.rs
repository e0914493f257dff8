//! JPEG coding through libjpeg-turbo's TurboJPEG API (the only place `turbojpeg_sys` is named).
//!
//! Decoding uses the fast integer IDCT and fast chroma upsampling, as gulpio2's reader does (simplejpeg
//! with `fastdct=True, fastupsample=True`), so vserve and gulpio2 give the same pixels for the same bytes
//! (up to ±1 per channel where the two libjpeg-turbo builds' SIMD paths round differently). Encoding uses
//! the accurate DCT and 4:4:4 chroma, as gulpio2's writer does. Any warning (a truncated or damaged
//! stream) fails the call: a record either decodes cleanly or is reported.
//!
//! A handle is not thread-safe; each [`Decoder`]/[`Encoder`] lives on one thread.

use turbojpeg_sys as tj;

/// Decoded RGB24 image.
#[derive(Debug)]
pub struct Rgb {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct JpegError(pub String);

fn last_error(handle: tj::tjhandle) -> JpegError {
    // SAFETY: tjGetErrorStr2 accepts any handle (null included) and returns a NUL-terminated static or
    // per-handle string that stays valid until the next call on the handle; we copy it at once.
    let msg = unsafe {
        let p = tj::tjGetErrorStr2(handle);
        if p.is_null() {
            "unknown TurboJPEG error".to_owned()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    JpegError(msg)
}

/// A TurboJPEG decompressor.
pub struct Decoder {
    handle: tj::tjhandle,
}

// SAFETY: a TurboJPEG handle has no thread affinity; it may move between threads as long as one thread
// uses it at a time, which `&mut self` on every call guarantees. (Not Sync.)
unsafe impl Send for Decoder {}

impl Decoder {
    pub fn new() -> Result<Decoder, JpegError> {
        // SAFETY: plain constructor; null means failure.
        let handle = unsafe { tj::tjInitDecompress() };
        if handle.is_null() {
            return Err(last_error(handle));
        }
        Ok(Decoder { handle })
    }

    /// The error of the call that just failed, after replacing the handle with a new one: libjpeg-turbo
    /// 2.1's TurboJPEG API can leave a handle that met a damaged stream (e.g. garbage in its Huffman
    /// tables) failing every later call with that stream's error, so one bad record would break every
    /// decode after it on this thread. If no new handle can be made, later calls fail cleanly.
    fn failed(&mut self) -> JpegError {
        let e = last_error(self.handle);
        // SAFETY: the handle came from tjInitDecompress (or is null after a failed re-init, which
        // tjDestroy refuses harmlessly) and is destroyed once, then replaced.
        unsafe {
            tj::tjDestroy(self.handle);
            self.handle = tj::tjInitDecompress();
        }
        e
    }

    /// Width and height from the header.
    pub fn header(&mut self, jpeg: &[u8]) -> Result<(u32, u32), JpegError> {
        let (mut w, mut h, mut sub, mut cs) = (0, 0, 0, 0);
        // SAFETY: the buffer pointer and length describe `jpeg`; the out-pointers are valid locals.
        let rc = unsafe {
            tj::tjDecompressHeader3(
                self.handle,
                jpeg.as_ptr(),
                jpeg.len() as libc::c_ulong,
                &mut w,
                &mut h,
                &mut sub,
                &mut cs,
            )
        };
        if rc != 0 {
            return Err(self.failed());
        }
        if w <= 0 || h <= 0 {
            return Err(JpegError(format!("bad image size {w}x{h}")));
        }
        Ok((w as u32, h as u32))
    }

    /// Decodes to packed RGB24, refusing (before allocating anything) a picture whose header claims more
    /// than `max_pixels` pixels: a 12 KB record claiming 65000x65000 asked for 12.7 GB.
    pub fn decode(&mut self, jpeg: &[u8], max_pixels: u64) -> Result<Rgb, JpegError> {
        let (w, h) = self.header(jpeg)?;
        if w as u64 * h as u64 > max_pixels {
            return Err(JpegError(format!(
                "its header claims {w}x{h}, more than the {max_pixels} pixels a frame may have (--max-side squared)"
            )));
        }
        let pitch = w as usize * 3;
        let mut data = vec![0u8; pitch * h as usize];
        let flags = (tj::TJFLAG_FASTDCT | tj::TJFLAG_FASTUPSAMPLE) as libc::c_int;
        // SAFETY: `data` holds pitch * h bytes, exactly what an RGB decode of w x h at this pitch writes.
        let rc = unsafe {
            tj::tjDecompress2(
                self.handle,
                jpeg.as_ptr(),
                jpeg.len() as libc::c_ulong,
                data.as_mut_ptr(),
                w as libc::c_int,
                pitch as libc::c_int,
                h as libc::c_int,
                tj::TJPF_TJPF_RGB,
                flags,
            )
        };
        if rc != 0 {
            return Err(self.failed());
        }
        Ok(Rgb {
            width: w,
            height: h,
            data,
        })
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: the handle came from tjInitDecompress and is destroyed once.
        unsafe {
            tj::tjDestroy(self.handle);
        }
    }
}

/// A TurboJPEG compressor with a fixed quality.
pub struct Encoder {
    handle: tj::tjhandle,
    quality: i32,
}

// SAFETY: as for Decoder: no thread affinity, used through &mut self only.
unsafe impl Send for Encoder {}

impl Encoder {
    /// `quality` in 1..=100.
    pub fn new(quality: u8) -> Result<Encoder, JpegError> {
        if !(1..=100).contains(&quality) {
            return Err(JpegError(format!("quality {quality} is outside 1..=100")));
        }
        // SAFETY: plain constructor; null means failure.
        let handle = unsafe { tj::tjInitCompress() };
        if handle.is_null() {
            return Err(last_error(handle));
        }
        Ok(Encoder {
            handle,
            quality: quality as i32,
        })
    }

    /// Encodes packed RGB24 (`width * 3` bytes per row).
    pub fn encode(&mut self, rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, JpegError> {
        let pitch = width as usize * 3;
        if width == 0 || height == 0 || rgb.len() != pitch * height as usize {
            return Err(JpegError(format!(
                "{} bytes are not a {width}x{height} RGB image",
                rgb.len()
            )));
        }
        let mut out: *mut libc::c_uchar = std::ptr::null_mut();
        let mut size: libc::c_ulong = 0;
        // SAFETY: `rgb` holds pitch * height bytes; TurboJPEG allocates the output buffer (out starts
        // null, size 0), which we copy and free with tjFree below.
        let rc = unsafe {
            tj::tjCompress2(
                self.handle,
                rgb.as_ptr(),
                width as libc::c_int,
                pitch as libc::c_int,
                height as libc::c_int,
                tj::TJPF_TJPF_RGB,
                &mut out,
                &mut size,
                tj::TJSAMP_TJSAMP_444 as libc::c_int,
                self.quality,
                0,
            )
        };
        let result = if rc != 0 || out.is_null() {
            Err(last_error(self.handle))
        } else {
            // SAFETY: on success `out` points to `size` bytes written by TurboJPEG.
            Ok(unsafe { std::slice::from_raw_parts(out, size as usize) }.to_vec())
        };
        if !out.is_null() {
            // SAFETY: `out` was allocated by TurboJPEG and is freed once.
            unsafe { tj::tjFree(out) };
        }
        result
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        // SAFETY: the handle came from tjInitCompress and is destroyed once.
        unsafe {
            tj::tjDestroy(self.handle);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `jpeg` with its frame header (SOF: FF Cx, length, precision, height, width) claiming 65000x65000.
    pub(crate) fn claiming_65000(jpeg: &[u8]) -> Vec<u8> {
        let sof = jpeg
            .windows(2)
            .position(|m| m[0] == 0xFF && (0xC0..=0xC2).contains(&m[1]))
            .unwrap();
        let mut huge = jpeg.to_vec();
        huge[sof + 5..sof + 9].copy_from_slice(&[0xFD, 0xE8, 0xFD, 0xE8]);
        huge
    }

    #[test]
    fn round_trip_is_close_and_damage_is_reported() {
        let (w, h) = (32u32, 16u32);
        let rgb: Vec<u8> = (0..w * h)
            .flat_map(|i| {
                let (x, y) = (i % w, i / w);
                [(x * 8) as u8, (y * 16) as u8, 128]
            })
            .collect();
        let jpeg = Encoder::new(95).unwrap().encode(&rgb, w, h).unwrap();
        assert_eq!(&jpeg[..2], &[0xFF, 0xD8]);
        let mut d = Decoder::new().unwrap();
        assert_eq!(d.header(&jpeg).unwrap(), (w, h));
        let back = d.decode(&jpeg, u64::MAX).unwrap();
        assert_eq!((back.width, back.height), (w, h));
        let worst = rgb
            .iter()
            .zip(&back.data)
            .map(|(a, b)| (*a as i32 - *b as i32).abs())
            .max()
            .unwrap();
        assert!(worst <= 12, "worst difference {worst}");
        assert!(d.decode(&jpeg[..jpeg.len() / 2], u64::MAX).is_err());
        assert!(d.decode(b"not a jpeg", u64::MAX).is_err());
        assert!(Encoder::new(0).is_err());
    }

    /// A record that starts as a JPEG and turns into garbage fails alone: the same decoder then decodes
    /// good records exactly as before. (It used to fail every later decode on that handle with the damaged
    /// record's error, "Unsupported marker type 0x58": one bad record in one gulp dataset broke every JPEG
    /// decode of that decode thread, in every dataset, until the daemon restarted.)
    #[test]
    fn a_damaged_record_does_not_poison_the_decoder() {
        let (w, h) = (64u32, 48u32);
        let rgb: Vec<u8> = (0..w * h)
            .flat_map(|i| [(i * 7 % 251) as u8, (i / w * 5) as u8, (i % w * 3) as u8])
            .collect();
        let good = Encoder::new(90).unwrap().encode(&rgb, w, h).unwrap();
        let mut d = Decoder::new().unwrap();
        let first = d.decode(&good, u64::MAX).unwrap().data;
        // Random runs over the header's tables and the scan (as the record found poisoning the decoder:
        // 800 random bytes from offset 600, in its Huffman tables).
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for at in (40..good.len() - 8).step_by(37) {
            let mut bad = good.clone();
            let end = (at + 800).min(bad.len() - 2);
            for b in &mut bad[at..end] {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *b = seed as u8;
            }
            // Garbage in the scan may still decode (to other pixels); either way the next record is fine.
            let _ = d.decode(&bad, u64::MAX);
            let again = d
                .decode(&good, u64::MAX)
                .unwrap_or_else(|e| panic!("after garbage at {at}: {e}"));
            assert_eq!(again.data, first, "after garbage at {at}");
            assert_eq!(d.header(&good).unwrap(), (w, h));
        }
    }

    /// A record whose header claims a picture over the bound is refused before its pixels are allocated
    /// (a 12 KB record claiming 65000x65000 made a decode thread ask for 12.7 GB and abort the daemon).
    #[test]
    fn a_header_claiming_more_pixels_than_the_bound_is_refused() {
        let (w, h) = (16u32, 8u32);
        let good = Encoder::new(90)
            .unwrap()
            .encode(&vec![77u8; (w * h * 3) as usize], w, h)
            .unwrap();
        let mut d = Decoder::new().unwrap();
        assert!(d.decode(&good, (w * h) as u64).is_ok());
        let err = d.decode(&good, (w * h) as u64 - 1).unwrap_err().to_string();
        assert!(err.contains("claims 16x8"), "{err}");
        let huge = claiming_65000(&good);
        assert_eq!(d.header(&huge).unwrap(), (65000, 65000));
        let err = d.decode(&huge, 8192 * 8192).unwrap_err().to_string();
        assert!(err.contains("claims 65000x65000"), "{err}");
        assert_eq!(
            d.decode(&good, u64::MAX).unwrap().data,
            d.decode(&good, 128).unwrap().data
        );
    }
}
