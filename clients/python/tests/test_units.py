"""Pure parts without a daemon: argument -> message mapping, error classes, worker splitting, transports."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

import vserve_client
from vserve_client import bfloat16, errors, request as rq
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
    # mean/std on uint8: refused here, naming every float dtype (the daemon's refusal named only its wire
    # types, not bfloat16: probe B).
    with pytest.raises(vserve_client.InvalidArgument, match="float16, bfloat16 or float32"):
        rq.transform_msg(mean=[0.5] * 3, std=[0.2] * 3)
    # A video may be a pathlib path, relative to its dataset, as TorchCodec takes paths (it was refused:
    # probe B); a bytes path is not.
    from pathlib import PurePosixPath

    assert rq.clip_msg((PurePosixPath("a/b.mp4"), [0])).video == "a/b.mp4"
    with pytest.raises(vserve_client.InvalidArgument, match="expected a str"):
        rq.clip_msg((b"a/b.mp4", [0]))
    # Negative indices: said so, not "ints from 0 to 18446744073709551615" (probe B).
    with pytest.raises(vserve_client.InvalidArgument, match="no negative ones"):
        rq.clip_msg(("a.mp4", [-1]))
    # A sampling range backwards, named as the caller named it (it was the daemon's "range_start ... must be
    # before range_end"); bounds from the end are the daemon's to check.
    with pytest.raises(vserve_client.InvalidArgument, match="sampling_range_start=50 must be before sampling_range_end=10"):
        rq.stream_request("kin", batch_size=2, sampling_range_start=50, sampling_range_end=10)
    rq.stream_request("kin", batch_size=2, sampling_range_start=50, sampling_range_end=-1)


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
        # 0 is "unset" on the wire: the daemon's default would have been used in silence (probe).
        (dict(batch_size=2, seconds_between_frames=0), "seconds_between_frames=0: must be a finite number"),
        (dict(batch_size=2, seconds_between_frames=-0.5), "seconds_between_frames=-0.5"),
        (dict(batch_size=2, seconds_between_clip_starts=float("nan")), "seconds_between_clip_starts=nan"),
        (dict(batch_size=2, seconds_between_clip_starts="x"), "expected a number of seconds"),
    ],
)
def test_stream_request_bad_arguments(kwargs, match):
    with pytest.raises(vserve_client.InvalidArgument, match=match):
        rq.stream_request("kin", **kwargs)


# Calls that must be refused here, before anything is sent: the client below has no daemon, so a request
# that went out would fail Unavailable (or protobuf's own errors, which name no argument, would escape).
BIG = 2**40
CLIP = ("a.mp4", [0])


@pytest.fixture
def unconnected(tmp_path):
    c = vserve_client.Client(f"unix:{tmp_path}/none.sock", timeout=5)
    yield c
    c.close()


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda c: c.get_clips("media", [CLIP], size=(BIG, 48)), f"size=({BIG}, 48)"),
        (lambda c: c.get_clips("media", [CLIP], size=2**32), f"size={2**32}"),
        (lambda c: c.get_clips("media", [CLIP], crop={"height": 8, "width": -BIG}), "crop="),
        (lambda c: c.get_clips("media", [CLIP], short_side=2**32), f"short_side={2**32}"),
        (lambda c: c.get_clips_async("media", [CLIP], size=(48, BIG)), f"size=(48, {BIG})"),
        (lambda c: next(c.get_clips_many([("media", [CLIP])], size=(BIG, 48))), f"size=({BIG}, 48)"),
        (lambda c: c.get_clips("media", [("a.mp4", {"frames": [0], "stream": -1})]), "stream=-1"),
        (lambda c: c.get_clips("media", [("a.mp4", [0], 2**32)]), f"stream={2**32}"),
        (lambda c: c.get_clips("media", [("a.mp4", [2**64])]), "frame indices"),
        (lambda c: c.probe("media", "a.mp4", stream=BIG), f"stream={BIG}"),
        (lambda c: c.probe("media", "a.mp4", stream=-1), "stream=-1"),
        (lambda c: c.stream("media", batch_size=2**32), f"batch_size={2**32}"),
        (lambda c: c.stream("media", batch_size=1, num_clips=BIG), f"num_clips={BIG}"),
        (lambda c: c.stream("media", batch_size=1, prefetch=2**32), f"prefetch={2**32}"),
        (lambda c: c.stream("media", batch_size=1, seed=2**64), f"seed={2**64}"),
        (lambda c: c.stream("media", batch_size=1, epoch=-1), "epoch=-1"),
        (lambda c: c.stream("media", batch_size=1, start_sample=2**64), f"start_sample={2**64}"),
        (lambda c: c.stream("media", batch_size=1, random_crop=(BIG, 8)), f"random_crop=({BIG}, 8)"),
        (lambda c: c.stream("media", batch_size=1, worker=(0, 2**32)), f"worker=(0, {2**32})"),
    ],
)
def test_ints_outside_their_wire_range_are_invalid_argument(unconnected, call, words):
    # protobuf's "ValueError: Value out of range: 1099511627776" named neither the argument nor the call.
    with pytest.raises(vserve_client.InvalidArgument) as e:
        call(unconnected)
    assert type(e.value) is vserve_client.InvalidArgument
    assert words in e.value.message
    # The largest values the wire carries are accepted.
    assert rq.transform_msg(size=(rq.UINT32_MAX, 1), short_side=None).size.width == 1
    assert rq.stream_request("d", batch_size=1, seed=rq.UINT64_MAX).seed == rq.UINT64_MAX
    assert rq.clip_msg(("a.mp4", [2**64 - 1], rq.UINT32_MAX)).stream == rq.UINT32_MAX


@pytest.mark.parametrize("name", ["a\udc80.mp4", None, b"a.mp4"], ids=["surrogate", "None", "bytes"])
@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda c, n: c.get_clips(n, [CLIP]), "dataset"),
        (lambda c, n: c.get_clips("media", [(n, [0])]), "video"),
        (lambda c, n: c.get_clips("media", [{"video": n, "times": [0.5]}]), "video"),
        (lambda c, n: c.get_clips_async(n, [CLIP]), "dataset"),
        (lambda c, n: next(c.get_clips_many([(n, [CLIP])])), "dataset"),
        (lambda c, n: next(c.get_clips_many([{"dataset": "media", "clips": [(n, [1])]}])), "video"),
        (lambda c, n: c.probe(n, "a.mp4"), "dataset"),
        (lambda c, n: c.probe("media", n), "video"),
        (lambda c, n: c.metadata(n, "a.mp4"), "dataset"),
        (lambda c, n: c.stream(n, batch_size=1), "dataset"),
        (lambda c, n: c.dataset_info(n), "dataset"),
    ],
)
def test_names_the_wire_cannot_carry_are_invalid_argument(unconnected, call, arg, name):
    # A lone surrogate (os.fsdecode of a file name that is not UTF-8) raised UnicodeEncodeError from
    # protobuf; None was sent as "" (the daemon then answered NOT_FOUND for dataset ""); bytes went out
    # as whatever they decoded to.
    with pytest.raises(vserve_client.InvalidArgument) as e:
        call(unconnected, name)
    assert type(e.value) is vserve_client.InvalidArgument
    assert f"{arg}={name!r}" in e.value.message, e.value.message
    str(e.value).encode("utf-8")  # the message itself can be printed and logged
    if isinstance(name, str):
        assert "surrogate" in e.value.message


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


# -- client-side outputs: bfloat16, DLPack, sizes ----------------------------------------------------


def _bf16_value(bits: int) -> float:
    """The value of a bfloat16 pattern, decoded by hand in float64 (which holds 2**128 too)."""
    sign = -1.0 if bits & 0x8000 else 1.0
    exp, man = (bits >> 7) & 0xFF, bits & 0x7F
    if exp == 0:
        return sign * man * 2.0**-133
    return sign * (1 + man / 128) * 2.0 ** (exp - 127)


def _nearest_even_reference(x: np.float32) -> int:
    """bfloat16 rounding by its definition: of the two patterns around x, the nearer one; on a tie the
    even one. Overflow past the largest finite value lands on infinity, as in IEEE."""
    bits = int(np.array([x], np.float32).view(np.uint32)[0])
    if np.isnan(x):
        return 0x7FC0
    if np.isinf(x):
        return bits >> 16
    lo = bits >> 16  # truncation toward zero
    hi = lo + 1
    v = float(x)
    d_lo, d_hi = abs(v - _bf16_value(lo)), abs(_bf16_value(hi) - v)
    if d_lo != d_hi:
        return lo if d_lo < d_hi else hi
    return lo if lo % 2 == 0 else hi


def test_bfloat16_rounds_to_nearest_even():
    edge = [
        0x3F800000, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,  # 1.0, ties to even (down, up), near ties
        0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7FFFFF,  # around the largest finite bfloat16: to inf
        0x00000001, 0x00008000, 0x00018000, 0x807FFFFF,  # subnormals and their ties
        0x7F800000, 0xFF800000, 0x00000000, 0x80000000,  # infinities, zeros
        0x7FC00000, 0xFFC00001, 0x7F800001,  # NaNs
    ]
    rng = np.random.default_rng(7)
    patterns = np.concatenate([np.array(edge, np.uint32), rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)])
    values = patterns.view(np.float32)
    got = bfloat16.from_float32(values)
    want = np.array([_nearest_even_reference(v) for v in values], np.uint16)
    assert_equal_bits(got, want)
    assert got[:9].tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F80, 0x3F81, 0x7F7F, 0x7F80, 0x7F80, 0xFF80]
    # Widening back is exact, and every bfloat16 value round-trips.
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    finite = ~np.isnan(bfloat16.to_float32(every))
    assert_equal_bits(bfloat16.from_float32(bfloat16.to_float32(every))[finite], every[finite])
    # Any shape and memory order; the result is C-contiguous.
    a = values[:24].reshape(2, 3, 4).transpose(2, 0, 1)
    assert bfloat16.from_float32(a).flags.c_contiguous
    assert_equal_bits(bfloat16.from_float32(a), want[:24].reshape(2, 3, 4).transpose(2, 0, 1))


def assert_equal_bits(got: np.ndarray, want: np.ndarray) -> None:
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} patterns differ, first at {bad[0]}: {got.flat[bad[0]]:#06x} != {want.flat[bad[0]]:#06x}"


def test_dlpack_capsules_keep_their_array_until_released():
    from vserve_client import dlpack

    before = dlpack.live_tensors()
    arr = np.arange(6, dtype=np.uint16).reshape(2, 3)
    cap = dlpack.capsule(arr[:, ::2])
    assert dlpack.live_tensors() == before + 1
    del cap  # never consumed: the capsule's destructor frees it
    assert dlpack.live_tensors() == before
    with pytest.raises(BufferError):
        dlpack.capsule(np.zeros(3, np.float32))


def test_batch_finish_bfloat16_and_cthw():
    h = pb.BatchHeader(shape=[1, 2, 2, 3, 3], dtype=pb.DTYPE_FLOAT32, layout=pb.LAYOUT_THWC, nbytes=1 * 2 * 2 * 3 * 3 * 4)
    h.clips.add(video="a.mp4", frame_indices=[0, 1], pts=[0, 1], pts_seconds=[0.0, 0.5], duration_seconds=[0.5, 0.25])
    f32 = np.linspace(-2, 2, 36, dtype=np.float32).reshape(1, 2, 2, 3, 3)
    b = Batch(h, f32.copy())._finish(rq.finish_of("bfloat16", "CTHW"))
    assert (b.dtype, b.layout, b.array.shape) == ("bfloat16", "CTHW", (1, 3, 2, 2, 3))
    assert_equal_bits(b.array, bfloat16.from_float32(f32).transpose(0, 4, 1, 2, 3))
    assert b.duration_seconds.tolist() == [[0.5, 0.25]]
    assert "bfloat16" in repr(b) and "CTHW" in repr(b)
    plain = Batch(h, f32.copy())._finish(rq.finish_of("float32", "THWC"))
    assert plain.dtype == "float32" and plain.layout == "THWC"
    with pytest.raises(vserve_client.ProtocolError, match="expected float32"):
        Batch(pb.BatchHeader(shape=[1], nbytes=1), np.zeros(1, np.uint8))._finish(rq.finish_of("bfloat16"))


def test_sizes_are_height_width():
    assert rq.size_hw("size", (48, 80)) == (48, 80)
    assert rq.size_hw("size", {"width": 80, "height": 48}) == (48, 80)
    assert rq.size_hw("size", 7) == (7, 7)
    s = rq.size_msg("size", (48, 80))
    assert (s.height, s.width) == (48, 80)
    t = rq.transform_msg(height=48, width=80, crop=(20, 40))
    assert (t.size.height, t.size.width, t.center_crop.height, t.center_crop.width) == (48, 80, 20, 40)
    r = rq.stream_request("kin", batch_size=1, random_resized_crop={"size": (20, 36), "ratio": (0.5, 2.0)})
    assert (r.augment.random_resized_crop.size.height, r.augment.random_resized_crop.size.width) == (20, 36)
    assert rq.finish_of("bfloat16", "cthw") == rq.Finish("bfloat16", "CTHW") and rq.finish_of().needed is False
    assert rq.transform_msg(dtype="bfloat16", layout="CTHW").dtype == pb.DTYPE_FLOAT32
    assert rq.transform_msg(dtype="bfloat16", layout="CTHW").layout == pb.LAYOUT_THWC


def test_message_to_dict_maps():
    from vserve_client.batch import message_to_dict

    d = message_to_dict(pb.DatasetInfo(name="k", samples=3, class_to_idx={"cat": 0, "dog": 1}))
    assert d == {
        "name": "k",
        "root": "",
        "video_count": 0,
        "samples": 3,
        "class_to_idx": {"cat": 0, "dog": 1},
        "building": False,
        "samples_fingerprint": 0,
    }


def test_epoch_arithmetic():
    from vserve_client.workers import batches_in_epoch, global_offset, shard_size

    assert [shard_size(5, r, 2) for r in range(2)] == [3, 2]
    assert [shard_size(5, r, 3, "pad") for r in range(3)] == [2, 2, 2]
    assert [shard_size(5, r, 3, "drop") for r in range(3)] == [1, 1, 1]
    assert batches_in_epoch(10, batch_size=4, num_clips=3, rank=1, world_size=3) == 3  # 3 samples, 9 clips
    assert batches_in_epoch(10, batch_size=4, num_clips=3, rank=1, world_size=3, drop_last=True) == 2
    assert batches_in_epoch(10, batch_size=4, start_sample=8) == 1 and batches_in_epoch(3, batch_size=4, start_sample=8) == 0
    # Two ranks each took 3 batches of 4 clips, 2 clips a sample: 6 samples each, 12 of the order.
    assert global_offset(3, batch_size=4, num_clips=2, world_size=2, start_sample=5) == 17
    # A batch boundary inside a sample: that sample is not counted (it is read again).
    assert global_offset(1, batch_size=3, num_clips=2, world_size=2) == 2
    with pytest.raises(ValueError):
        shard_size(5, 0, 1, "even")


def test_kept_mappings_of_removed_arenas_are_dropped_without_another_call(tmp_path, monkeypatch):
    # The daemon removes spare arenas after a minute unused; a client that makes no further call must not
    # keep their memory mapped.
    import threading
    import time
    import types

    from vserve_client import transport

    monkeypatch.setattr(transport, "PRUNE_PERIOD", 0.05)
    t = transport.ShmTransport(lambda arena, slots: None)
    gone, kept = tmp_path / "vserve-gone", tmp_path / "vserve-kept"
    for f in (gone, kept):
        f.write_bytes(b"\x01" * 8192)
    shm = {f: types.SimpleNamespace(path=str(f), arena_bytes=8192) for f in (gone, kept)}
    m = t._mapping(shm[gone])
    t._mapping(shm[kept])
    assert set(t._maps) == {(str(gone), 8192), (str(kept), 8192)}
    gone.unlink()
    deadline = time.monotonic() + 10
    while (str(gone), 8192) in t._maps and time.monotonic() < deadline:
        time.sleep(0.02)
    assert set(t._maps) == {(str(kept), 8192)}, "the removed arena's mapping was dropped, the other kept"
    assert m.base[:4].tolist() == [1, 1, 1, 1], "a mapping still viewed stays valid"
    # With nothing left to watch the thread ends; the next mapping starts another.
    kept.unlink()
    while t._maps and time.monotonic() < deadline:
        time.sleep(0.02)
    assert t._maps == {}
    while any(th.name == "vserve-shm-prune" for th in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(th.name == "vserve-shm-prune" for th in threading.enumerate())
    again = tmp_path / "vserve-again"
    again.write_bytes(b"\x02" * 8192)
    t._mapping(types.SimpleNamespace(path=str(again), arena_bytes=8192))
    again.unlink()
    while t._maps and time.monotonic() < deadline:
        time.sleep(0.02)
    assert t._maps == {}


def test_rotation_is_torchcodecs_for_every_display_matrix():
    """TorchCodec 0.17's ``metadata.rotation`` for the four rotations, alone and mirrored left-right after
    them (measured on files whose MP4 display matrices were set so: mirrors of 0, 180, 90 and 270 gave
    -180.0, -0.0, -90.0 and 90.0, ffprobe the same), from vserve's clockwise rotation and mirror flag."""
    from vserve_client.decoder import _counter_clockwise

    cases = [(0, False, None), (90, False, -90.0), (180, False, -180.0), (270, False, 90.0),
             (0, True, -180.0), (180, True, 0.0), (90, True, -90.0), (270, True, 90.0)]
    for clockwise, mirrored, torchcodec in cases:
        assert _counter_clockwise(clockwise, mirrored) == torchcodec, (clockwise, mirrored)


def test_classes_are_indexed_by_label_index():
    from vserve_client.client import _classes

    # Names: ranked by the daemon, dense.
    assert _classes("d", {"bird": 0, "cat": 1, "dog": 2}) == ["bird", "cat", "dog"]
    # Integer labels with gaps: each at its own index, a gap named as its integer.
    assert _classes("d", {"0": 0, "2": 2, "5": 5}) == ["0", "1", "2", "3", "4", "5"]
    assert _classes("d", {}) == []
    # Integers spread far wider than the labels: listed in index order, with a warning (a list of a
    # billion names is no answer).
    with pytest.warns(UserWarning, match="run up to 1000000000"):
        assert _classes("d", {"0": 0, "1000000000": 1000000000}) == ["0", "1000000000"]
