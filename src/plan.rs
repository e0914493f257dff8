//! Plan: how to read what a request wants. Pure; no FFmpeg.
//!
//! Input: a video's index and the set of frames wanted from it that the cache does not hold. Output: GOP
//! runs, each decoded in one pass from a keyframe to its last wanted frame. Invariant: every wanted frame
//! is in exactly one run, and a run starts at the latest keyframe at or before its first frame, so no run
//! decodes a frame another run of the same plan decodes.

use std::collections::BTreeSet;

use crate::index::VideoIndex;

/// Frames of one video decoded in one pass: from `keyframe` up to the last of `wanted`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GopRun {
    /// Frame index where decoding starts (a keyframe, or 0 for videos that can only be read from the start).
    pub keyframe: usize,
    /// Wanted frame indices, sorted, unique, all >= `keyframe`.
    pub wanted: Vec<usize>,
}

impl GopRun {
    /// Frames a pass decodes: keyframe through the last wanted frame.
    pub fn span(&self) -> usize {
        self.wanted
            .last()
            .map_or(0, |last| last + 1 - self.keyframe)
    }
}

/// Groups `wanted` (frame indices valid for `index`) by the keyframe each is decoded from.
pub fn gop_runs(index: &VideoIndex, wanted: &BTreeSet<usize>) -> Vec<GopRun> {
    if index.method == crate::index::IndexMethod::Stored {
        // Stored frames (GulpIO) decode independently, each its own keyframe: one run takes them all,
        // so a clip costs one decode job, not one per frame.
        return wanted
            .first()
            .map(|&k| {
                vec![GopRun {
                    keyframe: k,
                    wanted: wanted.iter().copied().collect(),
                }]
            })
            .unwrap_or_default();
    }
    let mut runs: Vec<GopRun> = Vec::new();
    for &k in wanted {
        let kf = index.keyframe_before(k);
        match runs.last_mut() {
            Some(run) if run.keyframe == kf => run.wanted.push(k),
            _ => runs.push(GopRun {
                keyframe: kf,
                wanted: vec![k],
            }),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{FrameEntry, IndexMethod, SeekMode};

    fn index(n: usize, keys: &[usize], seek: SeekMode) -> VideoIndex {
        VideoIndex {
            stream: 0,
            codec: "h264".into(),
            pixel_format: "yuv420p".into(),
            width: 2,
            height: 2,
            rotation: 0,
            time_base: (1, 25),
            avg_fps: 25.0,
            frames: (0..n)
                .map(|i| FrameEntry {
                    pts: i as i64,
                    duration: 1,
                    key: keys.contains(&i),
                    stated_duration: 1,
                })
                .collect(),
            keyframes: keys.to_vec().into(),
            declared_frames: 0,
            seek,
            method: IndexMethod::PacketScan,
            h264_nal_length: None,
            damaged: false,
        }
    }

    #[test]
    fn frames_group_by_preceding_keyframe() {
        let idx = index(40, &[0, 10, 20, 30], SeekMode::ByPts);
        let wanted: BTreeSet<usize> = [3, 5, 10, 12, 29, 39].into_iter().collect();
        let runs = gop_runs(&idx, &wanted);
        assert_eq!(
            runs,
            vec![
                GopRun {
                    keyframe: 0,
                    wanted: vec![3, 5]
                },
                GopRun {
                    keyframe: 10,
                    wanted: vec![10, 12]
                },
                GopRun {
                    keyframe: 20,
                    wanted: vec![29]
                },
                GopRun {
                    keyframe: 30,
                    wanted: vec![39]
                },
            ]
        );
        let total: usize = runs.iter().map(GopRun::span).sum();
        assert_eq!(total, 6 + 3 + 10 + 10);
    }

    #[test]
    fn from_start_videos_are_one_run() {
        let idx = index(40, &[0, 10, 20, 30], SeekMode::FromStart);
        let wanted: BTreeSet<usize> = [3, 25].into_iter().collect();
        assert_eq!(
            gop_runs(&idx, &wanted),
            vec![GopRun {
                keyframe: 0,
                wanted: vec![3, 25]
            }]
        );
    }

    #[test]
    fn stored_frames_are_one_run_from_the_first_wanted() {
        let all: Vec<usize> = (0..40).collect();
        let mut idx = index(40, &all, SeekMode::ByPts);
        idx.method = IndexMethod::Stored;
        let wanted: BTreeSet<usize> = [7, 11, 39].into_iter().collect();
        assert_eq!(
            gop_runs(&idx, &wanted),
            vec![GopRun {
                keyframe: 7,
                wanted: vec![7, 11, 39]
            }]
        );
        assert!(gop_runs(&idx, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn gop_run_span_counts_keyframe_through_last_wanted() {
        let run = GopRun {
            keyframe: 10,
            wanted: vec![12, 15],
        };
        assert_eq!(run.span(), 6);
    }
}
