//! H.264/HEVC bitstream facts read from packets without decoding: whether length-prefixed NAL units tile a
//! packet, and whether a picture is disposable (referenced by no other).

/// True when `data` (length-prefixed H.264 NAL units) holds coded slices and every one of them has
/// nal_ref_idc 0: the picture is referenced by no other, so skipping it changes no other frame.
pub fn h264_disposable(data: &[u8], n: usize) -> bool {
    let mut pos = 0usize;
    let mut slices = 0;
    while pos + n < data.len() {
        let size = data[pos..pos + n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | b as usize);
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

/// True when length-prefixed NAL units (AVCC/HVCC, `n`-byte big-endian sizes) cover `data` exactly.
pub fn nal_units_tile(data: &[u8], n: usize) -> bool {
    let mut pos = 0usize;
    while pos < data.len() {
        if pos + n > data.len() {
            return false;
        }
        let size = data[pos..pos + n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | b as usize);
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
    fn nal_tiling() {
        assert!(nal_units_tile(&[0, 0, 0, 2, 9, 9, 0, 0, 0, 1, 7], 4));
        assert!(!nal_units_tile(&[0, 0, 0, 3, 9, 9], 4));
        assert!(!nal_units_tile(&[0xff, 0xff, 0xff, 0xff, 1], 4));
        assert!(!nal_units_tile(&[0, 0, 0, 1, 9, 0, 0], 4));
    }
}
