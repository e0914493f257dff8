"""Python arguments -> request messages. Pure (no I/O), so every mapping is unit-tested without a daemon.

Sizes are ``(width, height)`` (the proto's order, and the CLI's ``WxH``), a single int for a square, or a
dict with ``width`` and ``height``. Argument errors raise :class:`~vserve_client.errors.InvalidArgument`
naming the argument and the bad value, before anything is sent.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._proto import vserve_pb2 as pb
from .errors import InvalidArgument

SizeArg = Union[int, Sequence[int], Mapping[str, int]]

DTYPES = {
    "uint8": pb.DTYPE_UINT8,
    "float16": pb.DTYPE_FLOAT16,
    "float32": pb.DTYPE_FLOAT32,
}
LAYOUTS = {"THWC": pb.LAYOUT_THWC, "TCHW": pb.LAYOUT_TCHW}
SAMPLERS = {
    "random-indices": pb.SAMPLER_RANDOM_INDICES,
    "regular-indices": pb.SAMPLER_REGULAR_INDICES,
    "random-timestamps": pb.SAMPLER_RANDOM_TIMESTAMPS,
    "regular-timestamps": pb.SAMPLER_REGULAR_TIMESTAMPS,
}
SHORT_VIDEO = {
    "repeat_last": pb.SHORT_VIDEO_REPEAT_LAST,
    "wrap": pb.SHORT_VIDEO_WRAP,
    "skip": pb.SHORT_VIDEO_SKIP,
}
SHARD_REMAINDER = {
    "uneven": pb.SHARD_REMAINDER_UNEVEN,
    "pad": pb.SHARD_REMAINDER_PAD,
    "drop": pb.SHARD_REMAINDER_DROP,
}
ON_ERROR = {"skip": pb.ON_ERROR_SKIP, "fail": pb.ON_ERROR_FAIL}


def _choice(arg: str, value: Any, table: Mapping[str, int]) -> int:
    key = value
    if isinstance(value, str):
        # Accept either spelling of word separators: "random_indices", "repeat-last".
        key = value.strip()
        for cand in (key, key.replace("_", "-"), key.replace("-", "_")):
            if cand in table:
                return table[cand]
    raise InvalidArgument(f"{arg}={value!r}: expected one of {', '.join(repr(k) for k in table)}")


def dtype_code(dtype: Any) -> int:
    """``"uint8" | "float16" | "float32"`` (or the numpy dtype) -> the wire enum."""
    name = dtype
    if not isinstance(dtype, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = dtype
    return _choice("dtype", name, DTYPES)


def size_msg(arg: str, value: SizeArg) -> "pb.Size":
    if isinstance(value, Mapping):
        try:
            w, h = value["width"], value["height"]
        except KeyError:
            raise InvalidArgument(f"{arg}={value!r}: expected keys 'width' and 'height'") from None
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        w = h = int(value)
    else:
        try:
            w, h = value  # type: ignore[misc]
        except (TypeError, ValueError):
            raise InvalidArgument(f"{arg}={value!r}: expected (width, height) or an int") from None
    for v in (w, h):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise InvalidArgument(f"{arg}={value!r}: width and height must be positive ints")
    return pb.Size(width=int(w), height=int(h))


def _channels(arg: str, value: Optional[Sequence[float]]) -> Sequence[float]:
    if value is None:
        return []
    vals = [float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1)]
    if len(vals) not in (1, 3):
        raise InvalidArgument(f"{arg}={list(value)!r}: expected 3 per-channel values (R, G, B) or one")
    return vals * 3 if len(vals) == 1 else vals


def transform_msg(
    *,
    size: Optional[SizeArg] = None,
    short_side: Optional[int] = None,
    crop: Optional[SizeArg] = None,
    flip: bool = False,
    dtype: Any = "uint8",
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    layout: str = "THWC",
    rotate: bool = True,
) -> "pb.Transform":
    """The Transform both RPCs take: rotate, resize, centre crop, flip, dtype, layout (in that order)."""
    t = pb.Transform()
    if size is not None and short_side is not None:
        raise InvalidArgument(f"size={size!r} and short_side={short_side!r}: give one of them")
    if size is not None:
        t.size.CopyFrom(size_msg("size", size))
    if short_side is not None:
        if isinstance(short_side, bool) or int(short_side) <= 0:
            raise InvalidArgument(f"short_side={short_side!r}: must be a positive int")
        t.short_side = int(short_side)
    if crop is not None:
        t.center_crop.CopyFrom(size_msg("crop", crop))
    t.hflip = bool(flip)
    t.dtype = dtype_code(dtype)
    t.mean.extend(_channels("mean", mean))
    t.std.extend(_channels("std", std))
    t.layout = _choice("layout", layout.upper() if isinstance(layout, str) else layout, LAYOUTS)
    t.no_rotate = not rotate
    return t


ClipArg = Union[Tuple[str, Any], Tuple[str, Any, int]]


def clip_msg(clip: Any) -> "pb.ClipSpec":
    """``(video, [frame indices])``, ``(video, {"times": [seconds]})`` or ``(video, {"frames": [...]})``;
    a dict may add ``"stream": N`` (container stream index), as may a third tuple item."""
    if isinstance(clip, pb.ClipSpec):
        return clip
    try:
        video, where, *rest = clip
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"clip {clip!r}: expected (video, frame_indices) or (video, {{'times': [...]}})"
        ) from None
    if not isinstance(video, str):
        raise InvalidArgument(f"clip {clip!r}: the video must be a path string")
    spec = pb.ClipSpec(video=video)
    stream = rest[0] if rest else None
    if isinstance(where, Mapping):
        unknown = set(where) - {"frames", "times", "stream"}
        if unknown or ("frames" in where) == ("times" in where):
            raise InvalidArgument(f"clip {clip!r}: give exactly one of 'frames' or 'times' (and optionally 'stream')")
        if "frames" in where:
            spec.frames.indices.extend(_indices(clip, where["frames"]))
        else:
            spec.times.seconds.extend(float(s) for s in np.asarray(where["times"], dtype=np.float64).reshape(-1))
        stream = where.get("stream", stream)
    else:
        spec.frames.indices.extend(_indices(clip, where))
    if stream is not None:
        spec.stream = int(stream)
    return spec


def _indices(clip: Any, frames: Any) -> Iterable[int]:
    arr = np.asarray(frames).reshape(-1)
    if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0):
        raise InvalidArgument(f"clip {clip!r}: frame indices must be non-negative ints")
    return (int(i) for i in arr)


def get_clips_request(dataset: str, clips: Iterable[Any], **transform: Any) -> "pb.GetClipsRequest":
    req = pb.GetClipsRequest(dataset=dataset, transform=transform_msg(**transform))
    req.clips.extend(clip_msg(c) for c in clips)
    return req


def _random_resized_crop(value: Any) -> "pb.RandomResizedCrop":
    """``size`` or ``{"size": ..., "scale": (min, max), "ratio": (min, max)}`` (torchvision's names)."""
    rrc = pb.RandomResizedCrop()
    if isinstance(value, Mapping) and "size" in value:
        unknown = set(value) - {"size", "scale", "ratio"}
        if unknown:
            raise InvalidArgument(f"random_resized_crop={value!r}: unknown keys {sorted(unknown)}")
        rrc.size.CopyFrom(size_msg("random_resized_crop.size", value["size"]))
        for key in ("scale", "ratio"):
            if value.get(key) is not None:
                try:
                    lo, hi = (float(v) for v in value[key])
                except (TypeError, ValueError):
                    raise InvalidArgument(f"random_resized_crop.{key}={value[key]!r}: expected (min, max)") from None
                setattr(rrc, f"{key}_min", lo)
                setattr(rrc, f"{key}_max", hi)
    else:
        rrc.size.CopyFrom(size_msg("random_resized_crop", value))
    return rrc


def _uint(arg: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidArgument(f"{arg}={value!r}: expected an int >= {minimum}")
    return int(value)


def stream_request(
    dataset: str,
    *,
    batch_size: int,
    sampler: str = "random-indices",
    clips_per_video: int = 1,
    frames_per_clip: int = 1,
    frame_stride: int = 1,
    seconds_between_frames: Optional[float] = None,
    seconds_between_clip_starts: Optional[float] = None,
    range_start: Optional[float] = None,
    range_end: Optional[float] = None,
    short_video: str = "repeat_last",
    size: Optional[SizeArg] = None,
    short_side: Optional[int] = None,
    crop: Optional[SizeArg] = None,
    flip: bool = False,
    dtype: Any = "uint8",
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    layout: str = "THWC",
    rotate: bool = True,
    random_crop: Optional[SizeArg] = None,
    random_resized_crop: Any = None,
    random_hflip: bool = False,
    drop_last: bool = False,
    seed: int = 0,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    start_batch: int = 0,
    prefetch: int = 2,
    shuffle: bool = True,
    shard_remainder: str = "uneven",
    on_error: str = "skip",
) -> "pb.StreamBatchesRequest":
    """A StreamBatchesRequest; argument names follow TorchCodec's samplers and torchvision's transforms."""
    batch_size = _uint("batch_size", batch_size, 1)
    world_size = _uint("world_size", world_size, 1)
    rank = _uint("rank", rank)
    if rank >= world_size:
        raise InvalidArgument(f"rank={rank}: must be below world_size={world_size}")
    if random_crop is not None and random_resized_crop is not None:
        raise InvalidArgument("random_crop and random_resized_crop: give one of them")
    s = pb.ClipSampler(
        kind=_choice("sampler", sampler, SAMPLERS),
        num_clips=_uint("clips_per_video", clips_per_video, 1),
        frames_per_clip=_uint("frames_per_clip", frames_per_clip, 1),
        frame_stride=_uint("frame_stride", frame_stride, 1),
        short_video=_choice("short_video", short_video, SHORT_VIDEO),
    )
    if seconds_between_frames is not None:
        s.seconds_between_frames = float(seconds_between_frames)
    if seconds_between_clip_starts is not None:
        s.seconds_between_clip_starts = float(seconds_between_clip_starts)
    if range_start is not None:
        s.range_start = float(range_start)
    if range_end is not None:
        s.range_end = float(range_end)
    aug = pb.Augment(random_hflip=bool(random_hflip))
    if random_crop is not None:
        aug.random_crop.CopyFrom(size_msg("random_crop", random_crop))
    if random_resized_crop is not None:
        aug.random_resized_crop.CopyFrom(_random_resized_crop(random_resized_crop))
    return pb.StreamBatchesRequest(
        dataset=dataset,
        sampler=s,
        transform=transform_msg(
            size=size,
            short_side=short_side,
            crop=crop,
            flip=flip,
            dtype=dtype,
            mean=mean,
            std=std,
            layout=layout,
            rotate=rotate,
        ),
        augment=aug,
        batch_size=batch_size,
        drop_last=bool(drop_last),
        seed=_uint("seed", seed),
        epoch=_uint("epoch", epoch),
        rank=rank,
        world_size=world_size,
        start_batch=_uint("start_batch", start_batch),
        prefetch=_uint("prefetch", prefetch),
        no_shuffle=not shuffle,
        shard_remainder=_choice("shard_remainder", shard_remainder, SHARD_REMAINDER),
        on_error=_choice("on_error", on_error, ON_ERROR),
    )


def stream_kwargs_names() -> Tuple[str, ...]:
    """The keyword arguments :func:`stream_request` accepts (the torch dataset validates against them)."""
    code = stream_request.__code__
    return code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount]


__all__ = [
    "clip_msg",
    "dtype_code",
    "get_clips_request",
    "size_msg",
    "stream_request",
    "transform_msg",
]
