//! Plan: how to read what a request wants. Pure; no FFmpeg.
//!
//! Input: a video's index and the set of frames wanted from it that the cache does not hold. Output: GOP
//! runs, each decoded in one pass from a keyframe to its last wanted frame. Invariant: every wanted frame
//! is in exactly one run, and a run starts at the latest keyframe at or before its first frame, so no run
//! decodes a frame another run of the same plan decodes.
//!
//! Runs of consecutive GOPs whose wanted frames (nearly) meet are one pass ([`MERGE_GAP`],
//! [`MERGED_SPAN`]): a pass ends only once its last wanted frame leaves the decoder, which reads the next
//! GOP's keyframe ahead and decodes it, so a second pass that seeks there decodes that keyframe again (and
//! pays a seek and a flush). Whole videos of 1 s GOPs decoded per GOP cost the decode threads 5-15% more CPU
//! than in one pass (docs/BENCHMARKS.md, "GOP runs that meet").

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

/// The most frames between one run's last wanted frame and the next run's keyframe for the two to be one
/// pass: continuing decodes those frames (the disposable ones are skipped), a second pass would decode the
/// keyframe twice and seek.
pub const MERGE_GAP: usize = 4;

/// About the most frames a pass of merged runs spans (one GOP alone may be longer): a long request is still
/// spread over the decode threads, a pass boundary costs one keyframe decoded twice in this many frames.
pub const MERGED_SPAN: usize = 256;

/// Groups `wanted` (frame indices valid for `index`) by the keyframe each is decoded from, then makes
/// runs of consecutive GOPs whose frames meet (at most [`MERGE_GAP`] frames apart) one pass each, split
/// evenly into passes of at most about [`MERGED_SPAN`] frames. `spread`: how many threads could decode
/// this plan at once (the decode threads idle with nothing queued, at least 1): a chain is cut into up to that
/// many passes (at most one per GOP run in it), so a request on an idle daemon uses every idle thread (its
/// latency is that of its longest pass, for one keyframe decoded twice per cut, on threads that would
/// otherwise wait), while a busy daemon decodes each chain in as few passes as possible.
pub fn gop_runs(index: &VideoIndex, wanted: &BTreeSet<usize>, spread: usize) -> Vec<GopRun> {
    merge_adjacent(per_gop(index, wanted), spread)
}

/// One run per keyframe that some wanted frame is decoded from.
fn per_gop(index: &VideoIndex, wanted: &BTreeSet<usize>) -> Vec<GopRun> {
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
    group(wanted.iter().copied(), |k| index.keyframe_before(k))
}

/// `run` cut at `cuts` (sorted keyframes after its own): each piece starts at the last cut at or before
/// its frames, or at the run's keyframe. Cuts with no wanted frame after them before the next make no
/// piece.
pub fn cut_at(run: GopRun, cuts: &[usize]) -> Vec<GopRun> {
    let keyframe = run.keyframe;
    group(run.wanted, |k| match cuts.partition_point(|&c| c <= k) {
        0 => keyframe,
        n => cuts[n - 1],
    })
}

/// Sorted frames grouped into runs by the keyframe `start_of` each (non-decreasing along the frames).
fn group(
    wanted: impl IntoIterator<Item = usize>,
    start_of: impl Fn(usize) -> usize,
) -> Vec<GopRun> {
    let mut runs: Vec<GopRun> = Vec::new();
    for k in wanted {
        let kf = start_of(k);
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

/// Whether a pass that ends with `prev` continues into `next` for less than a second pass costs.
fn meets(prev: &GopRun, next: &GopRun) -> bool {
    prev.wanted
        .last()
        .is_some_and(|&last| next.keyframe > last && next.keyframe - last - 1 <= MERGE_GAP)
}

/// Merges chains of runs that [`meets`] joins, each chain cut into equal passes at GOP boundaries: at most
/// about [`MERGED_SPAN`] frames each, and up to `spread` of them for a chain of that many GOP runs.
fn merge_adjacent(runs: Vec<GopRun>, spread: usize) -> Vec<GopRun> {
    let mut out: Vec<GopRun> = Vec::with_capacity(runs.len());
    let mut chain: Vec<GopRun> = Vec::new();
    for run in runs {
        if chain.last().is_some_and(|prev| !meets(prev, &run)) {
            split_chain(std::mem::take(&mut chain), spread, &mut out);
        }
        chain.push(run);
    }
    split_chain(chain, spread, &mut out);
    out
}

fn split_chain(chain: Vec<GopRun>, spread: usize, out: &mut Vec<GopRun>) {
    let (Some(first), Some(last)) = (chain.first(), chain.last()) else {
        return;
    };
    let begin = first.keyframe;
    let span = last.wanted.last().map_or(0, |l| l + 1 - begin);
    let passes = span
        .div_ceil(MERGED_SPAN)
        .max(spread.min(chain.len()))
        .max(1);
    // Each cut at the run (GOP start) nearest an even share of the span, after the previous cut.
    let mut cuts = Vec::with_capacity(passes);
    for i in 1..passes {
        let ideal = begin + i * span / passes;
        let after = cuts.last().map_or(1, |&c| c + 1);
        let nearest = (after..chain.len()).min_by_key(|&j| chain[j].keyframe.abs_diff(ideal));
        if let Some(j) = nearest {
            cuts.push(j);
        }
    }
    let mut pass: Option<GopRun> = None;
    for (j, run) in chain.into_iter().enumerate() {
        if cuts.contains(&j) {
            out.extend(pass.take());
        }
        pass.get_or_insert_with(|| GopRun {
            keyframe: run.keyframe,
            wanted: Vec::new(),
        })
        .wanted
        .extend(run.wanted);
    }
    out.extend(pass);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{IndexMethod, SeekMode};

    fn index(n: usize, keys: &[usize], seek: SeekMode) -> VideoIndex {
        VideoIndex {
            seek,
            ..crate::index::uniform(n, keys, 25)
        }
    }

    #[test]
    fn frames_group_by_preceding_keyframe() {
        let idx = index(40, &[0, 10, 20, 30], SeekMode::ByPts);
        let wanted: BTreeSet<usize> = [3, 5, 10, 12, 29, 39].into_iter().collect();
        let runs = per_gop(&idx, &wanted);
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
        // As passes: 5 → 10 leaves 4 frames between (merged), 12 → 20 leaves 7 (not), 29 → 30 none.
        assert_eq!(
            gop_runs(&idx, &wanted, 1),
            vec![run(0, &[3, 5, 10, 12]), run(20, &[29, 39])]
        );
    }

    fn run(keyframe: usize, wanted: &[usize]) -> GopRun {
        GopRun {
            keyframe,
            wanted: wanted.to_vec(),
        }
    }

    #[test]
    fn a_run_cut_at_keyframes_keeps_each_frame_once() {
        let r = run(0, &[27, 29, 31, 32, 61, 65]);
        assert_eq!(
            cut_at(r.clone(), &[30, 60]),
            vec![run(0, &[27, 29]), run(30, &[31, 32]), run(60, &[61, 65])]
        );
        // A cut with no frame of its own makes no piece; no cut leaves the run whole.
        assert_eq!(
            cut_at(r.clone(), &[30, 45, 60]),
            vec![run(0, &[27, 29]), run(30, &[31, 32]), run(60, &[61, 65])]
        );
        assert_eq!(cut_at(r.clone(), &[]), vec![r]);
    }

    fn every(n: usize, step: usize) -> Vec<usize> {
        (0..n).step_by(step).collect()
    }

    #[test]
    fn a_whole_video_of_short_gops_is_one_pass() {
        let idx = index(250, &every(250, 25), SeekMode::ByPts);
        let all: BTreeSet<usize> = (0..250).collect();
        assert_eq!(
            gop_runs(&idx, &all, 1),
            vec![GopRun {
                keyframe: 0,
                wanted: (0..250).collect()
            }]
        );
        // A clip across a GOP boundary (every 4th frame: 3 frames between 24 and the keyframe at 25).
        let clip: BTreeSet<usize> = (12..44).step_by(4).collect();
        assert_eq!(
            gop_runs(&idx, &clip, 1),
            vec![GopRun {
                keyframe: 0,
                wanted: clip.iter().copied().collect()
            }]
        );
        // Idle threads to share it: a whole video is cut into up to that many passes, a clip across a
        // keyframe into its two GOP runs.
        let starts = |spread| -> Vec<usize> {
            gop_runs(&idx, &all, spread)
                .iter()
                .map(|r| r.keyframe)
                .collect()
        };
        assert_eq!(starts(2), vec![0, 125]);
        // 8 passes of about 31 frames: each cut at the GOP start nearest its share.
        assert_eq!(starts(8), vec![0, 25, 50, 100, 125, 150, 175, 225]);
        assert_eq!(
            gop_runs(&idx, &clip, 8),
            vec![run(0, &[12, 16, 20, 24]), run(25, &[28, 32, 36, 40])]
        );
        // Never more passes than GOP runs, however many threads idle.
        assert_eq!(gop_runs(&idx, &clip, 16).len(), 2);
        // 5 frames between 19 and the keyframe at 25 (more than MERGE_GAP): two passes.
        let sparse: BTreeSet<usize> = [10, 19, 30, 40].into_iter().collect();
        assert_eq!(gop_runs(&idx, &sparse, 1).len(), 2);
    }

    #[test]
    fn long_chains_split_evenly_at_gop_boundaries() {
        let idx = index(1000, &every(1000, 25), SeekMode::ByPts);
        let all: BTreeSet<usize> = (0..600).collect();
        let runs = gop_runs(&idx, &all, 1);
        let starts: Vec<usize> = runs.iter().map(|r| r.keyframe).collect();
        assert_eq!(starts, vec![0, 200, 400]);
        assert!(runs
            .iter()
            .all(|r| r.span() == 200 && r.wanted.len() == 200));
        // One GOP longer than MERGED_SPAN stays one run.
        let long = index(1000, &[0, 700], SeekMode::ByPts);
        let wanted: BTreeSet<usize> = (0..1000).collect();
        let runs = gop_runs(&long, &wanted, 1);
        assert_eq!(
            runs.iter().map(|r| r.keyframe).collect::<Vec<_>>(),
            vec![0, 700]
        );
        // Coarse GOPs: 150 + 150 + 12 frames split 150 / 162, not 300 / 12.
        let coarse = index(312, &[0, 150, 300], SeekMode::ByPts);
        let wanted: BTreeSet<usize> = (0..312).collect();
        let spans: Vec<usize> = gop_runs(&coarse, &wanted, 1)
            .iter()
            .map(GopRun::span)
            .collect();
        assert_eq!(spans, vec![150, 162]);
    }

    #[test]
    fn passes_keep_the_plan_invariants() {
        // Pseudo-random wanted sets over irregular GOPs: every wanted frame in exactly one pass, in order,
        // each pass starting at the keyframe before its first frame, and no pass much past MERGED_SPAN.
        let keys = [0, 7, 30, 31, 90, 200, 260, 270, 300, 420, 800, 801, 900];
        let idx = index(1000, &keys, SeekMode::ByPts);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for case in 0..200 {
            let mut wanted = BTreeSet::new();
            let density = 1 + case % 9;
            for k in 0..1000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(density as u64) {
                    wanted.insert(k);
                }
            }
            let runs = gop_runs(&idx, &wanted, 1 + case % 4);
            let flat: Vec<usize> = runs.iter().flat_map(|r| r.wanted.clone()).collect();
            assert_eq!(flat, wanted.iter().copied().collect::<Vec<_>>());
            for r in &runs {
                assert_eq!(r.keyframe, idx.keyframe_before(r.wanted[0]));
                assert!(r.span() <= MERGED_SPAN + 400, "{r:?}");
            }
        }
    }

    #[test]
    fn from_start_videos_are_one_run() {
        let idx = index(40, &[0, 10, 20, 30], SeekMode::FromStart);
        let wanted: BTreeSet<usize> = [3, 25].into_iter().collect();
        assert_eq!(
            gop_runs(&idx, &wanted, 1),
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
            gop_runs(&idx, &wanted, 1),
            vec![GopRun {
                keyframe: 7,
                wanted: vec![7, 11, 39]
            }]
        );
        assert!(gop_runs(&idx, &BTreeSet::new(), 1).is_empty());
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
