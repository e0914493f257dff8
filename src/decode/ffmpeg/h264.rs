//! H.264/HEVC bitstream facts read from packets without decoding: whether length-prefixed NAL units tile a
//! packet, and whether a picture is disposable (referenced by no other).

/// A NAL unit's length prefix: big-endian, of its bytes.
fn be_size(prefix: &[u8]) -> usize {
    prefix
        .iter()
        .fold(0usize, |acc, &b| (acc << 8) | b as usize)
}

/// True when `data` (length-prefixed H.264 NAL units) holds coded slices and every one of them has
/// nal_ref_idc 0: the picture is referenced by no other, so skipping it changes no other frame.
pub fn h264_disposable(data: &[u8], n: usize) -> bool {
    let mut pos = 0usize;
    let mut slices = 0;
    while pos + n < data.len() {
        let size = be_size(&data[pos..pos + n]);
        let start = pos + n;
        if size == 0 || start + size > data.len() {
            return false;
        }
        let header = data[start];
        let nal_type = header & 0x1f;
        let ref_idc = (header >> 5) & 3;
        if (1..=5).contains(&nal_type) {
            if ref_idc != 0 || nal_type == 5 {
                return false;
            }
            slices += 1;
        }
        pos = start + size;
    }
    slices > 0
}

/// Whether an H.264 packet the container marks as a keyframe holds a picture the decoder calls one: an
/// IDR, or a picture of intra slices only (an open GOP's I picture). A recovery point of a stream coded
/// with periodic intra refresh is a P picture the container marks too: decoding cannot start there and
/// give the stream's frames (they are whole only once the refresh has swept the picture), and FFmpeg's
/// frames there are not key frames. `n`: the NAL units' length prefix (AVCC), or None for start codes
/// (Annex B: MPEG-TS, raw H.264). None when the packet holds no slice header to read.
pub fn h264_key_picture(data: &[u8], n: Option<usize>) -> Option<bool> {
    let mut intra = None;
    for nal in nal_units(data, n) {
        let Some(&header) = nal.first() else {
            continue;
        };
        match header & 0x1f {
            5 => return Some(true),
            // A coded slice, or partition A (which carries the slice header).
            1 | 2 => {
                let mut bits = Bits::new(&nal[1..]);
                let (_first_mb, slice_type) = (bits.ue()?, bits.ue()?);
                // 2 I, 4 SI (and the same plus 5: all slices of the picture are of that type).
                let i = slice_type % 5 == 2 || slice_type % 5 == 4;
                intra = Some(intra.unwrap_or(true) && i);
            }
            _ => {}
        }
    }
    intra
}

/// A packet's NAL units: `n`-byte big-endian length prefixes, or start codes when `n` is None. Stops at
/// the first malformed length.
fn nal_units(data: &[u8], n: Option<usize>) -> Vec<&[u8]> {
    let mut out = Vec::new();
    match n {
        Some(n) => {
            let mut pos = 0usize;
            while pos + n <= data.len() {
                let size = be_size(&data[pos..pos + n]);
                let start = pos + n;
                match start.checked_add(size) {
                    Some(end) if size > 0 && end <= data.len() => out.push(&data[start..end]),
                    _ => break,
                }
                pos = start + size;
            }
        }
        None => {
            // Each unit runs from after a 00 00 01 to the next one (a 4-byte start code's leading zero
            // and trailing zero bytes stay on the unit before, where they do no harm to its header).
            let starts: Vec<usize> = data
                .windows(3)
                .enumerate()
                .filter(|(_, w)| *w == [0, 0, 1])
                .map(|(i, _)| i + 3)
                .collect();
            for (k, &s) in starts.iter().enumerate() {
                let end = starts.get(k + 1).map_or(data.len(), |&next| next - 3);
                out.push(&data[s..end.max(s)]);
            }
        }
    }
    out
}

/// An Exp-Golomb reader over a NAL unit's payload, dropping emulation-prevention bytes (00 00 03).
struct Bits<'a> {
    data: &'a [u8],
    byte: usize,
    bit: u32,
    zeros: u32,
    current: Option<u8>,
}

impl<'a> Bits<'a> {
    fn new(data: &'a [u8]) -> Self {
        Bits {
            data,
            byte: 0,
            bit: 8,
            zeros: 0,
            current: None,
        }
    }

    fn bit(&mut self) -> Option<u32> {
        if self.bit == 8 {
            let mut b = *self.data.get(self.byte)?;
            self.byte += 1;
            if self.zeros >= 2 && b == 3 {
                self.zeros = 0;
                b = *self.data.get(self.byte)?;
                self.byte += 1;
            }
            self.zeros = if b == 0 { self.zeros + 1 } else { 0 };
            self.current = Some(b);
            self.bit = 0;
        }
        let b = self.current?;
        let v = (b >> (7 - self.bit)) & 1;
        self.bit += 1;
        Some(u32::from(v))
    }

    /// ue(v): an unsigned Exp-Golomb code (at most 31 leading zeros).
    fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        let mut v = 0u64;
        for _ in 0..zeros {
            v = (v << 1) | u64::from(self.bit()?);
        }
        u32::try_from((1u64 << zeros) - 1 + v).ok()
    }
}

/// True when length-prefixed NAL units (AVCC/HVCC, `n`-byte big-endian sizes) cover `data` exactly.
pub fn nal_units_tile(data: &[u8], n: usize) -> bool {
    let mut pos = 0usize;
    while pos < data.len() {
        if pos + n > data.len() {
            return false;
        }
        let size = be_size(&data[pos..pos + n]);
        if size == 0 {
            return false;
        }
        pos = match (pos + n).checked_add(size) {
            Some(p) if p <= data.len() => p,
            _ => return false,
        };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposable_h264_pictures() {
        // Non-reference slice (nal_ref_idc 0, type 1) after an SEI: disposable.
        assert!(h264_disposable(
            &[0, 0, 0, 2, 0x06, 1, 0, 0, 0, 2, 0x01, 0x88],
            4
        ));
        // Reference P slice (nal_ref_idc 2): not.
        assert!(!h264_disposable(&[0, 0, 0, 2, 0x41, 0x9a], 4));
        // IDR: not. No slice at all: not.
        assert!(!h264_disposable(&[0, 0, 0, 2, 0x05, 0x88], 4));
        assert!(!h264_disposable(&[0, 0, 0, 2, 0x06, 1], 4));
        // Truncated: not.
        assert!(!h264_disposable(&[0, 0, 0, 9, 0x01, 0x88], 4));
    }

    #[test]
    fn key_pictures_are_idr_or_intra() {
        // IDR slice (type 5): key. Non-IDR slice, first_mb 0 ('1'), slice_type 7 = I ('0001000'):
        // 0b1000_1000 → key. slice_type 5 = P ('00110'): 0b1001_1000 → not. An SEI alone: unknown.
        assert_eq!(
            h264_key_picture(&[0, 0, 0, 2, 0x65, 0x88], Some(4)),
            Some(true)
        );
        assert_eq!(
            h264_key_picture(&[0, 0, 0, 2, 0x41, 0x88], Some(4)),
            Some(true)
        );
        assert_eq!(
            h264_key_picture(&[0, 0, 0, 2, 0x41, 0x98], Some(4)),
            Some(false)
        );
        assert_eq!(h264_key_picture(&[0, 0, 0, 2, 0x06, 0x05], Some(4)), None);
        // Two slices, I then P: not all intra.
        let two = [0, 0, 0, 2, 0x41, 0x88, 0, 0, 0, 2, 0x41, 0x98];
        assert_eq!(h264_key_picture(&two, Some(4)), Some(false));
        // Annex B: an SEI with its recovery point, then a P slice (an intra-refresh recovery point).
        let annexb = [
            0, 0, 0, 1, 0x06, 0x06, 0x01, 0x00, 0x80, 0, 0, 1, 0x41, 0x98,
        ];
        assert_eq!(h264_key_picture(&annexb, None), Some(false));
        assert_eq!(
            h264_key_picture(&[0, 0, 1, 0x65, 0x88, 0x80], None),
            Some(true)
        );
        // An emulation-prevention byte inside the header is skipped: first_mb_in_slice 2^24 - 2 (23
        // zeros, '1', 23 ones: 00 00 [03] 01 ff ff fe) then slice_type I ('011') or P ('00110').
        let epb = |tail: u8| [0, 0, 0, 9, 0x41, 0, 0, 3, 1, 0xff, 0xff, 0xfe, tail];
        assert_eq!(h264_key_picture(&epb(0xc0), Some(4)), Some(true));
        assert_eq!(h264_key_picture(&epb(0x60), Some(4)), Some(false));
        // Truncated sizes: nothing read.
        assert_eq!(h264_key_picture(&[0, 0, 0, 9, 0x41, 0x88], Some(4)), None);
    }

    #[test]
    fn nal_tiling() {
        assert!(nal_units_tile(&[0, 0, 0, 2, 9, 9, 0, 0, 0, 1, 7], 4));
        assert!(!nal_units_tile(&[0, 0, 0, 3, 9, 9], 4));
        assert!(!nal_units_tile(&[0xff, 0xff, 0xff, 0xff, 1], 4));
        assert!(!nal_units_tile(&[0, 0, 0, 1, 9, 0, 0], 4));
    }
}
