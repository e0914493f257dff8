"""Pure parts without a daemon: argument -> message mapping, error classes, worker splitting, transports."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

import vserve_client
from vserve_client import errors, request as rq
from vserve_client._proto import vserve_pb2 as pb
from vserve_client.batch import Batch
from vserve_client.transport import is_local, select
from vserve_client.workers import worker_batches

# -- requests ------------------------------------------------------------------------------------------


def test_transform_defaults():
    t = rq.transform_msg()
    assert t == pb.Transform(dtype=pb.DTYPE_UINT8, layout=pb.LAYOUT_THWC)
    assert t.WhichOneof("resize") is None and not t.HasField("center_crop")


def test_transform_every_field():
    t = rq.transform_msg(
        size=(240, 320), crop=112, flip=True, dtype="float16", mean=[0.4, 0.5, 0.6], std=0.25, layout="tchw",
        rotate=False,
    )
    assert (t.size.width, t.size.height) == (320, 240)
    assert (t.center_crop.width, t.center_crop.height) == (112, 112)
    assert t.hflip and t.no_rotate
    assert t.dtype == pb.DTYPE_FLOAT16 and t.layout == pb.LAYOUT_TCHW
    assert list(t.mean) == pytest.approx([0.4, 0.5, 0.6]) and list(t.std) == [0.25] * 3
    t = rq.transform_msg(short_side=256, dtype=np.float32, crop={"width": 10, "height": 20})
    assert t.short_side == 256 and t.dtype == pb.DTYPE_FLOAT32
    assert (t.center_crop.width, t.center_crop.height) == (10, 20)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(size=(1, 2), short_side=3), "give one of them"),
        (dict(size=(0, 2)), "positive"),
        (dict(size="big"), "size='big'"),
        (dict(dtype="int8"), "dtype='int8'"),
        (dict(layout="HWC"), "layout='HWC'"),
        (dict(mean=[1, 2]), "3 per-channel values"),
        (dict(short_side=-1), "short_side=-1"),
    ],
)
def test_transform_bad_arguments(kwargs, match):
    with pytest.raises(vserve_client.InvalidArgument, match=match):
        rq.transform_msg(**kwargs)


def test_clip_specs():
    c = rq.clip_msg(("a.mp4", [0, 5, 9]))
    assert c.video == "a.mp4" and list(c.frames.indices) == [0, 5, 9] and not c.HasField("stream")
    c = rq.clip_msg(("a.mp4", np.arange(3)))
    assert list(c.frames.indices) == [0, 1, 2]
    c = rq.clip_msg(("a.mp4", {"times": [0.5, 1.0], "stream": 3}))
    assert list(c.times.seconds) == [0.5, 1.0] and c.stream == 3
    c = rq.clip_msg(("a.mp4", {"frames": [4]}, 0))
    assert list(c.frames.indices) == [4] and c.HasField("stream") and c.stream == 0
    for bad in [("a.mp4", [-1]), ("a.mp4", [0.5]), ("a.mp4",), (3, [0]), ("a.mp4", {"frames": [1], "times": [1]})]:
        with pytest.raises(vserve_client.InvalidArgument):
            rq.clip_msg(bad)


def test_stream_request_every_field():
    r = rq.stream_request(
        "kin",
        batch_size=32,
        sampler="regular_timestamps",
        num_clips=2,
        num_frames_per_clip=8,
        num_indices_between_frames=4,
        seconds_between_frames=0.1,
        seconds_between_clip_starts=2.0,
        sampling_range_start=1.0,
        sampling_range_end=-1.0,
        policy="wrap",
        short_side=256,
        random_resized_crop={"size": 224, "scale": (0.2, 1.0), "ratio": (0.5, 2.0)},
        random_hflip=True,
        dtype="float32",
        mean=[0.45, 0.45, 0.45],
        std=[0.225, 0.225, 0.225],
        layout="TCHW",
        drop_last=True,
        seed=7,
        epoch=3,
        rank=1,
        world_size=4,
        start_batch=5,
        prefetch=6,
        shuffle=False,
        shard_remainder="pad",
        on_error="fail",
    )
    s = r.sampler
    assert (s.kind, s.num_clips, s.frames_per_clip, s.frame_stride) == (pb.SAMPLER_REGULAR_TIMESTAMPS, 2, 8, 4)
    assert (s.seconds_between_frames, s.seconds_between_clip_starts) == (0.1, 2.0)
    assert (s.range_start, s.range_end, s.short_video) == (1.0, -1.0, pb.SHORT_VIDEO_WRAP)
    rrc = r.augment.random_resized_crop
    assert (rrc.size.width, rrc.size.height) == (224, 224)
    assert (rrc.scale_min, rrc.scale_max, rrc.ratio_min, rrc.ratio_max) == pytest.approx((0.2, 1.0, 0.5, 2.0))
    assert r.augment.random_hflip and r.augment.WhichOneof("crop") == "random_resized_crop"
    assert r.transform.short_side == 256 and r.transform.dtype == pb.DTYPE_FLOAT32
    assert r.transform.layout == pb.LAYOUT_TCHW
    assert (r.batch_size, r.drop_last, r.seed, r.epoch, r.rank, r.world_size) == (32, True, 7, 3, 1, 4)
    assert (r.start_batch, r.prefetch, r.no_shuffle) == (5, 6, True)
    assert (r.shard_remainder, r.on_error) == (pb.SHARD_REMAINDER_PAD, pb.ON_ERROR_FAIL)


def test_stream_request_defaults():
    r = rq.stream_request("kin", batch_size=4)
    assert r.sampler.kind == pb.SAMPLER_RANDOM_INDICES
    assert (r.sampler.num_clips, r.sampler.frames_per_clip, r.sampler.frame_stride) == (1, 1, 1)
    assert not r.sampler.HasField("range_start") and not r.sampler.HasField("range_end")
    assert r.augment.WhichOneof("crop") is None and not r.augment.random_hflip
    assert (r.world_size, r.rank, r.prefetch, r.no_shuffle) == (1, 0, 2, False)
    assert (r.shard_remainder, r.on_error) == (pb.SHARD_REMAINDER_UNEVEN, pb.ON_ERROR_SKIP)
    r = rq.stream_request("kin", batch_size=4, random_crop=(100, 200))
    assert (r.augment.random_crop.width, r.augment.random_crop.height) == (200, 100)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=0), "batch_size=0"),
        (dict(batch_size=2, rank=2, world_size=2), "rank=2"),
        (dict(batch_size=2, sampler="uniform"), "sampler='uniform'"),
        (dict(batch_size=2, policy="pad"), "policy='pad'"),
        (dict(batch_size=2, shard_remainder="even"), "shard_remainder"),
        (dict(batch_size=2, on_error="ignore"), "on_error"),
        (dict(batch_size=2, random_crop=10, random_resized_crop=10), "give one of them"),
        (dict(batch_size=2, seed=-1), "seed=-1"),
    ],
)
def test_stream_request_bad_arguments(kwargs, match):
    with pytest.raises(vserve_client.InvalidArgument, match=match):
        rq.stream_request("kin", **kwargs)


def test_stream_kwargs_names():
    names = rq.stream_kwargs_names()
    assert "batch_size" in names and "on_error" in names and "dataset" not in names


# -- errors --------------------------------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c != grpc.StatusCode.OK])
def test_every_status_has_its_class(code):
    err = errors.from_rpc_error(FakeRpcError(code, "what went wrong"))
    assert isinstance(err, vserve_client.VServeError)
    assert err.code == code.name and err.message == "what went wrong"
    assert type(err).code_name == code.name
    assert str(err) == f"{code.name}: what went wrong"


def test_errors_pickle():
    import pickle

    err = pickle.loads(pickle.dumps(vserve_client.NotFound('video "x" not in dataset "d"', code="NOT_FOUND")))
    assert type(err) is vserve_client.NotFound
    assert (err.code, err.message) == ("NOT_FOUND", 'video "x" not in dataset "d"')
    assert str(err) == 'NOT_FOUND: video "x" not in dataset "d"'


def test_error_classes_by_name():
    cases = {
        grpc.StatusCode.NOT_FOUND: vserve_client.NotFound,
        grpc.StatusCode.PERMISSION_DENIED: vserve_client.PermissionDenied,
        grpc.StatusCode.INVALID_ARGUMENT: vserve_client.InvalidArgument,
        grpc.StatusCode.OUT_OF_RANGE: vserve_client.OutOfRange,
        grpc.StatusCode.RESOURCE_EXHAUSTED: vserve_client.ResourceExhausted,
        grpc.StatusCode.UNAVAILABLE: vserve_client.Unavailable,
        grpc.StatusCode.DATA_LOSS: vserve_client.DataLoss,
        grpc.StatusCode.UNAUTHENTICATED: vserve_client.Unauthenticated,
        grpc.StatusCode.INTERNAL: vserve_client.Internal,
        grpc.StatusCode.UNIMPLEMENTED: vserve_client.Unimplemented,
    }
    for code, cls in cases.items():
        assert type(errors.from_rpc_error(FakeRpcError(code, "x"))) is cls
    # Python's own hierarchy where it fits, so generic handlers catch them too.
    assert issubclass(vserve_client.NotFound, LookupError)
    assert issubclass(vserve_client.PermissionDenied, PermissionError)
    assert issubclass(vserve_client.InvalidArgument, ValueError)
    assert issubclass(vserve_client.ProtocolError, vserve_client.Internal)


# -- transports and addresses --------------------------------------------------------------------------


def test_transport_selection():
    def release(arena, slots):
        raise AssertionError("no release expected")

    assert select("auto", "unix:/x.sock", release).name == "shm"
    assert select("auto", "localhost:7070", release).name == "inline"
    assert select("inline", "unix:/x.sock", release).name == "inline"
    assert select("shm", "host:1", release).name == "shm"
    with pytest.raises(vserve_client.InvalidArgument, match="transport='tcp'"):
        select("tcp", "unix:/x.sock", release)
    assert vserve_client.Client("unix:/nonexistent.sock").transport == "shm"
    assert is_local("unix:/a.sock") and is_local("localhost:7070") and is_local("[::1]:7070")
    assert not is_local("gpu-node-3:7070")


@pytest.mark.parametrize("addr", ["", "unix:", "nohostport", "host:port", ":7070"])
def test_bad_addresses(addr):
    with pytest.raises(vserve_client.InvalidArgument):
        vserve_client.Client(addr)


def test_unreachable_daemon_is_unavailable(tmp_path):
    with vserve_client.Client(f"unix:{tmp_path}/none.sock", timeout=5) as c:
        with pytest.raises(vserve_client.Unavailable):
            c.list_datasets()


# -- worker splitting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("total", [0, 1, 7, 12])
@pytest.mark.parametrize("start", [0, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_worker_batches_partition(total, start, n):
    shares = [list(worker_batches(start, total, w, n)) for w in range(n)]
    flat = sorted(b for s in shares for b in s)
    assert flat == list(range(start, total))  # disjoint and covering
    for w, share in enumerate(shares):
        assert all((b - start) % n == w for b in share)
    if start == 0:
        assert all(b % n == w for w, s in enumerate(shares) for b in s)
    # A DataLoader takes one item per worker in turn: that yields start, start + 1, ...
    order = [s[i] for i in range(max(map(len, shares), default=0)) for s in shares if i < len(s)]
    assert order == list(range(start, total))


def test_resolve_rank():
    from vserve_client.workers import resolve_rank

    assert resolve_rank(None, None, None, {}) == (0, 1)
    assert resolve_rank(None, None, None, {"RANK": "3", "WORLD_SIZE": "4"}) == (3, 4)
    # torch.distributed, when initialised, wins over the environment; explicit arguments win over both.
    assert resolve_rank(None, None, (1, 2), {"RANK": "3", "WORLD_SIZE": "4"}) == (1, 2)
    assert resolve_rank(0, 8, (1, 2), {"RANK": "3"}) == (0, 8)
    for bad in [dict(rank=1, world_size=None), dict(rank=2, world_size=2)]:
        with pytest.raises(ValueError):
            resolve_rank(bad["rank"], bad["world_size"], None, {})
    with pytest.raises(ValueError, match="RANK='x'"):
        resolve_rank(None, None, None, {"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError):
        resolve_rank(None, None, None, {"RANK": "2", "WORLD_SIZE": "2"})
