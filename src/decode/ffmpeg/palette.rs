//! Palettes carried in packets: a paletted stream (8-bit `pal8` video in AVI, for one) may give its
//! palette only as side data of its first packet. The CLI, decoding from that packet, has it; a decode
//! that seeks past it, or a fresh decoder after a reopen, would draw every frame with an empty (black)
//! palette. So a paletted video's first palette is read once when it opens ([`first_palette`]) and
//! attached to the first packet sent after every open and seek ([`attach`]) unless that packet carries
//! its own.

use ffmpeg_next as ff;

use super::open::open_input;
use crate::dataset::CheckedFile;
use crate::decode::faults::Stage;

/// Packets of the stream looked at for a palette before giving up.
const LOOK: usize = 8;

/// The palette side data of the first packets of `stream` (a stream the index found paletted). Read
/// from a header-only open: FFmpeg's stream probing would take the first packet's palette itself, and the
/// demuxer gives it once.
pub(super) fn first_palette(file: &CheckedFile, stream: usize) -> Option<Vec<u8>> {
    let mut input = open_input(file, false, Stage::Decode).ok()?;
    let mut seen = 0;
    for (st, packet) in input.packets() {
        if st.index() != stream {
            continue;
        }
        if let Some(p) = side_palette(&packet) {
            return Some(p);
        }
        seen += 1;
        if seen >= LOOK {
            break;
        }
    }
    None
}

fn side_palette(packet: &ff::Packet) -> Option<Vec<u8>> {
    packet
        .side_data()
        .find(|d| d.kind() == ff::packet::side_data::Type::Palette)
        .map(|d| d.data().to_vec())
}

/// Attaches `palette` to `packet` unless it has one; false if FFmpeg could not allocate it.
pub(super) fn attach(packet: &mut ff::Packet, palette: &[u8]) -> bool {
    side_palette(packet).is_some()
        || attach_side_data(
            packet,
            ff::ffi::AVPacketSideDataType::AV_PKT_DATA_PALETTE,
            palette,
        )
}

/// Adds side data of `kind` holding `bytes` to `packet` (a palette here, a decoder's new parameter
/// sets in [`super::reuse`]); false if FFmpeg could not allocate it.
pub(super) fn attach_side_data(
    packet: &mut ff::Packet,
    kind: ff::ffi::AVPacketSideDataType,
    bytes: &[u8],
) -> bool {
    // SAFETY: `packet` wraps a valid AVPacket; av_packet_new_side_data returns null or a buffer of
    // exactly `bytes.len()` writable bytes owned by the packet (freed with it).
    unsafe {
        let dst = ff::ffi::av_packet_new_side_data(
            ff::packet::Mut::as_mut_ptr(packet),
            kind,
            bytes.len() as _,
        );
        if dst.is_null() {
            return false;
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len());
    }
    true
}
