"""Python arguments -> request messages. Pure (no I/O), so every mapping is unit-tested without a daemon.

Sizes are ``(height, width)``, as in torchvision, TorchCodec and NumPy's shapes (arrays come back
``[..., H, W, 3]``), a single int for a square, or a mapping ``{"height": h, "width": w}``. The wire
(:class:`Size`) and the CLI (``WxH``, as ffmpeg) name width first; this module is the one place that
turns one order into the other. Argument errors (a wrong type, an int outside its wire field's range, a
name UTF-8 cannot carry) raise :class:`~vserve_client.errors.InvalidArgument` naming the argument and the
bad value, before anything is sent.

Sampler arguments carry TorchCodec's names (``num_clips``, ``num_frames_per_clip``,
``num_indices_between_frames``, ``sampling_range_start``/``sampling_range_end``, ``policy``); the names of
vserve 0.1 (``clips_per_video``, ``frames_per_clip``, ``frame_stride``, ``range_start``/``range_end``,
``short_video``) still work with a :class:`DeprecationWarning` (:data:`DEPRECATED_NAMES`).

Some outputs are finished on the client, exactly, from what the daemon sends (:class:`Finish`):
``dtype="bfloat16"`` is float32 on the wire rounded to nearest-even here; ``layout="CTHW"`` is THWC on
the wire permuted per clip (a view, no copy).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._proto import vserve_pb2 as pb
from .errors import InvalidArgument

#: The largest values of the wire's unsigned int fields (``uint32``: sizes, stream indices, counts;
#: ``uint64``: frame indices, seeds, epochs, offsets). A larger (or negative) value is refused here, naming
#: the argument, rather than by protobuf ("Value out of range") as the message is built.
UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1

#: A size: ``(height, width)``, an int for a square, or ``{"height": h, "width": w}``.
SizeArg = Union[int, Sequence[int], Mapping[str, int]]

#: Wire dtypes by name. ``bfloat16`` travels as float32 and is rounded here (see :class:`Finish`).
DTYPES = {
    "uint8": pb.DTYPE_UINT8,
    "float16": pb.DTYPE_FLOAT16,
    "float32": pb.DTYPE_FLOAT32,
    "bfloat16": pb.DTYPE_FLOAT32,
}
#: Layouts by name: per clip, the axes of ``batch.array[i]``. ``CTHW`` travels as THWC and is a permuted
#: view here.
LAYOUTS = {"THWC": pb.LAYOUT_THWC, "TCHW": pb.LAYOUT_TCHW, "CTHW": pb.LAYOUT_THWC}
SAMPLERS = {
    "random-indices": pb.SAMPLER_RANDOM_INDICES,
    "regular-indices": pb.SAMPLER_REGULAR_INDICES,
    "random-timestamps": pb.SAMPLER_RANDOM_TIMESTAMPS,
    "regular-timestamps": pb.SAMPLER_REGULAR_TIMESTAMPS,
}
#: TorchCodec's ``policy`` values, plus vserve's ``skip`` (replace the sample, as an unreadable one).
#: ``error`` is ``skip`` on the wire: the client raises :class:`~vserve_client.errors.OutOfRange` at the
#: batch that reports the too-short sample, instead of yielding it.
POLICIES = {
    "repeat_last": pb.SHORT_VIDEO_REPEAT_LAST,
    "wrap": pb.SHORT_VIDEO_WRAP,
    "skip": pb.SHORT_VIDEO_SKIP,
    "error": pb.SHORT_VIDEO_SKIP,
}
SHORT_VIDEO = POLICIES  # the 0.1 name of this table
SHARD_REMAINDER = {
    "uneven": pb.SHARD_REMAINDER_UNEVEN,
    "pad": pb.SHARD_REMAINDER_PAD,
    "drop": pb.SHARD_REMAINDER_DROP,
}
ON_ERROR = {"skip": pb.ON_ERROR_SKIP, "fail": pb.ON_ERROR_FAIL}
#: ``cache_policy``: whether the decoded frames may enter the daemon's frame cache. ``auto``: unless a
#: request's frames of one video are a scan (more than the daemon's ``--cache-admit-fraction`` of its
#: cache); ``one_pass``: never (frames read once: they do not displace other jobs' cached frames);
#: ``keep``: always.
CACHE_POLICIES = {
    "auto": pb.CACHE_POLICY_AUTO,
    "one_pass": pb.CACHE_POLICY_ONE_PASS,
    "keep": pb.CACHE_POLICY_KEEP,
}

#: Sampler arguments of vserve 0.1 -> TorchCodec's names, which replace them.
DEPRECATED_NAMES: Dict[str, str] = {
    "clips_per_video": "num_clips",
    "frames_per_clip": "num_frames_per_clip",
    "frame_stride": "num_indices_between_frames",
    "range_start": "sampling_range_start",
    "range_end": "sampling_range_end",
    "short_video": "policy",
}


def rename_deprecated(kwargs: Dict[str, Any], stacklevel: int = 3) -> Dict[str, Any]:
    """``kwargs`` with vserve 0.1's sampler names replaced by TorchCodec's, warning once per old name
    (:class:`DeprecationWarning`). Giving both names of one argument is an error."""
    out = dict(kwargs)
    for old, new in DEPRECATED_NAMES.items():
        if old not in out:
            continue
        if new in out:
            raise InvalidArgument(f"{old}={out[old]!r} and {new}={out[new]!r}: {old} is the old name of {new}; give {new}")
        warnings.warn(
            f"vserve_client: {old}= is deprecated, use TorchCodec's name {new}=",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        out[new] = out.pop(old)
    return out


def _choice(arg: str, value: Any, table: Mapping[str, Any]) -> Any:
    key = value
    if isinstance(value, str):
        # Accept either spelling of word separators: "random_indices", "repeat-last".
        key = value.strip()
        for cand in (key, key.replace("_", "-"), key.replace("-", "_")):
            if cand in table:
                return table[cand]
    raise InvalidArgument(f"{arg}={value!r}: expected one of {', '.join(repr(k) for k in table)}")


def _canonical(arg: str, value: Any, table: Mapping[str, Any]) -> str:
    """The table's spelling of a choice (``"repeat-last"`` -> ``"repeat_last"``)."""
    _choice(arg, value, table)
    key = value.strip()
    for cand in (key, key.replace("_", "-"), key.replace("-", "_")):
        if cand in table:
            return cand
    raise AssertionError("unreachable: _choice accepted it")


def text(arg: str, value: Any) -> str:
    """A string field's value (a dataset or video name): a ``str`` that UTF-8, the wire's encoding, can
    carry; a video may also be a ``pathlib`` path (relative to its dataset, as TorchCodec takes paths).
    ``None`` (which protobuf would send as ``""``), bytes and strings holding a lone surrogate (what
    ``os.fsdecode`` makes of a file name that is not UTF-8) are refused naming the argument."""
    if arg == "video" and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise InvalidArgument(f"{arg}={value!r}: expected a str")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(
            f"{arg}={value!r}: character {e.start} ({value[e.start]!r}) is a lone surrogate, which UTF-8 (the "
            "wire's encoding) cannot carry (os.fsdecode gives them for file names that are not UTF-8)"
        ) from None
    return value


def _positive_seconds(arg: str, value: Any) -> float:
    """``value`` as a step in seconds: a finite number above 0, else InvalidArgument."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{arg}={value!r}: expected a number of seconds") from None
    if not (x > 0 and math.isfinite(x)):
        raise InvalidArgument(f"{arg}={value!r}: must be a finite number of seconds above 0")
    return x


def uint(arg: str, value: Any, minimum: int = 0, maximum: int = UINT32_MAX) -> int:
    """An unsigned int field's value: an int (not a bool) from ``minimum`` to ``maximum`` (the field's
    range: :data:`UINT32_MAX` or :data:`UINT64_MAX`)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not minimum <= int(value) <= maximum:
        raise InvalidArgument(f"{arg}={value!r}: expected an int from {minimum} to {maximum}")
    return int(value)


def dtype_name(dtype: Any) -> str:
    """``"uint8" | "float16" | "float32" | "bfloat16"`` from a name, a numpy dtype or a torch dtype."""
    if isinstance(dtype, str):
        name = dtype.strip()
    else:
        name = str(dtype)
        if name.startswith("torch."):  # torch.bfloat16 and friends, without importing torch
            name = name[len("torch.") :]
        else:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = str(dtype)
    if name not in DTYPES:
        raise InvalidArgument(f"dtype={dtype!r}: expected one of {', '.join(repr(k) for k in DTYPES)}")
    return name


def dtype_code(dtype: Any) -> Any:
    """The wire enum for a dtype (bfloat16 travels as float32)."""
    return DTYPES[dtype_name(dtype)]


def layout_name(layout: Any) -> str:
    name = layout.strip().upper() if isinstance(layout, str) else layout
    if name not in LAYOUTS:
        raise InvalidArgument(f"layout={layout!r}: expected one of {', '.join(repr(k) for k in LAYOUTS)}")
    return name


@dataclass(frozen=True)
class Finish:
    """What the client does to a batch after receiving it: nothing for the daemon's own dtypes and
    layouts; round float32 to bfloat16 (nearest-even) and/or permute THWC to CTHW."""

    dtype: str = "uint8"
    layout: str = "THWC"

    @property
    def needed(self) -> bool:
        return self.dtype == "bfloat16" or self.layout == "CTHW"


def finish_of(dtype: Any = "uint8", layout: Any = "THWC") -> Finish:
    return Finish(dtype_name(dtype), layout_name(layout))


def size_hw(arg: str, value: SizeArg) -> Tuple[int, int]:
    """``(height, width)`` of a size argument."""
    if isinstance(value, Mapping):
        unknown = set(value) - {"height", "width"}
        if unknown or len(value) != 2:
            raise InvalidArgument(f"{arg}={value!r}: expected keys 'height' and 'width'")
        h, w = value["height"], value["width"]
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        h = w = int(value)
    else:
        try:
            h, w = value  # type: ignore[misc]
        except (TypeError, ValueError):
            raise InvalidArgument(f"{arg}={value!r}: expected (height, width) or an int") from None
    for v in (h, w):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 < int(v) <= UINT32_MAX:
            raise InvalidArgument(f"{arg}={value!r}: height and width must be positive ints up to {UINT32_MAX}")
    return int(h), int(w)


def size_msg(arg: str, value: SizeArg) -> "pb.Size":
    """The wire's Size (width first) of a ``(height, width)`` argument."""
    h, w = size_hw(arg, value)
    return pb.Size(width=w, height=h)


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
    height: Optional[int] = None,
    width: Optional[int] = None,
) -> "pb.Transform":
    """The Transform both RPCs take: rotate, resize, centre crop, flip, dtype, layout (in that order).

    ``size=(height, width)`` (or ``height=``, ``width=`` together) resizes to exactly that;
    ``crop=(height, width)`` centre-crops after the resize."""
    t = pb.Transform()
    if height is not None or width is not None:
        if height is None or width is None:
            raise InvalidArgument(f"height={height!r} width={width!r}: give both (or size=(height, width))")
        if size is not None:
            raise InvalidArgument(f"size={size!r} and height/width: give one of them")
        size = (height, width)
    if size is not None and short_side is not None:
        raise InvalidArgument(f"size={size!r} and short_side={short_side!r}: give one of them")
    if size is not None:
        t.size.CopyFrom(size_msg("size", size))
    if short_side is not None:
        try:
            side = None if isinstance(short_side, bool) else int(short_side)
        except (TypeError, ValueError):
            side = None
        if side is None or not 0 < side <= UINT32_MAX:
            raise InvalidArgument(f"short_side={short_side!r}: must be a positive int up to {UINT32_MAX}")
        t.short_side = side
    if crop is not None:
        t.center_crop.CopyFrom(size_msg("crop", crop))
    t.hflip = bool(flip)
    t.dtype = dtype_code(dtype)
    t.mean.extend(_channels("mean", mean))
    t.std.extend(_channels("std", std))
    if (t.mean or t.std) and t.dtype == pb.DTYPE_UINT8:
        # (The daemon's own refusal names only its wire types, not bfloat16, which this client makes.)
        raise InvalidArgument(f"mean/std need a float dtype (float16, bfloat16 or float32), not dtype={dtype!r}")
    t.layout = LAYOUTS[layout_name(layout)]
    t.no_rotate = not rotate
    return t


ClipArg = Union[Tuple[str, Any], Tuple[str, Any, int]]


def clip_msg(clip: Any) -> "pb.ClipSpec":
    """``(video, [frame indices])``, ``(video, {"times": [seconds]})`` or ``(video, {"frames": [...]})``;
    a dict may add ``"stream": N`` (container stream index), as may a third tuple item. A whole dict
    ``{"video": path, "frames": [...]}`` (or ``"times"``, and optionally ``"stream"``) is the same clip."""
    if isinstance(clip, pb.ClipSpec):
        return clip
    if isinstance(clip, Mapping):
        # Unpacked as a tuple, a dict gives its keys: ("video", "frames") read as a video named "video"
        # with the frame indices "frames", refused with a message that hid the mistake.
        odd = sorted(map(str, set(clip) - {"video", "frames", "times", "stream"}))
        if "video" not in clip or odd or ("frames" in clip) == ("times" in clip):
            extra = f" (unknown: {', '.join(odd)})" if odd else ""
            raise InvalidArgument(
                f"clip {clip!r}: a dict clip needs 'video' and one of 'frames' or 'times' (and optionally 'stream'){extra}"
            )
        where = {k: v for k, v in clip.items() if k != "video"}
        clip = (clip["video"], where)
    try:
        video, where, *rest = clip
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"clip {clip!r}: expected (video, frame_indices) or (video, {{'times': [...]}})"
        ) from None
    try:
        spec = pb.ClipSpec(video=text("video", video))
    except InvalidArgument as e:
        raise InvalidArgument(f"clip {clip!r}: {e.message}") from None
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
        spec.stream = uint("stream", stream)
    return spec


def _indices(clip: Any, frames: Any) -> Iterable[int]:
    arr = np.asarray(frames).reshape(-1)
    if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0):
        # (Negative indices count from the end in VideoDecoder, which knows the frame count; here the
        # daemon resolves them.)
        raise InvalidArgument(
            f"clip {clip!r}: frame indices must be ints of at least 0 (no negative ones: the frame count is "
            "the daemon's; VideoDecoder takes them)"
        )
    return (int(i) for i in arr)


def get_clips_request(
    dataset: str, clips: Iterable[Any], cache_policy: str = "auto", **transform: Any
) -> "pb.GetClipsRequest":
    req = pb.GetClipsRequest(
        dataset=text("dataset", dataset),
        transform=transform_msg(**transform),
        cache_policy=_choice("cache_policy", cache_policy, CACHE_POLICIES),
    )
    req.clips.extend(clip_msg(c) for c in clips)
    return req


def _random_resized_crop(value: Any) -> "pb.RandomResizedCrop":
    """``size`` or ``{"size": ..., "scale": (min, max), "ratio": (min, max)}`` (torchvision's names; the
    size is ``(height, width)`` and the ratio width / height, as torchvision's)."""
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


def stream_request(
    dataset: str,
    *,
    batch_size: int,
    sampler: str = "random-indices",
    num_clips: int = 1,
    num_frames_per_clip: int = 1,
    num_indices_between_frames: int = 1,
    seconds_between_frames: Optional[float] = None,
    seconds_between_clip_starts: Optional[float] = None,
    sampling_range_start: Optional[float] = None,
    sampling_range_end: Optional[float] = None,
    policy: str = "repeat_last",
    size: Optional[SizeArg] = None,
    short_side: Optional[int] = None,
    crop: Optional[SizeArg] = None,
    flip: bool = False,
    dtype: Any = "uint8",
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    layout: str = "THWC",
    rotate: bool = True,
    height: Optional[int] = None,
    width: Optional[int] = None,
    random_crop: Optional[SizeArg] = None,
    random_resized_crop: Any = None,
    random_hflip: bool = False,
    drop_last: bool = False,
    seed: int = 0,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    start_batch: int = 0,
    start_sample: int = 0,
    prefetch: int = 2,
    shuffle: bool = True,
    shard_remainder: str = "uneven",
    on_error: str = "skip",
    cache_policy: str = "auto",
    samples_fingerprint: Optional[int] = None,
    **deprecated: Any,
) -> "pb.StreamBatchesRequest":
    """A StreamBatchesRequest. Sampler arguments are TorchCodec's (``clips_at_random_indices`` and
    friends: same names, meanings and defaults), transforms torchvision's (sizes ``(height, width)``).

    ``start_sample``: leave out the first ``start_sample`` samples of the epoch's order (all ranks
    together) and shard the rest over ``world_size``: a resume after the world size changed.
    ``samples_fingerprint``: plan over the sample list with this fingerprint (``dataset_info``'s, or
    another stream's ``Batch.samples_fingerprint``) even if the dataset has been reloaded since, so that
    every worker and rank of an epoch plans over the same samples (FailedPrecondition once the daemon no
    longer holds that list). The old
    sampler names are accepted with a DeprecationWarning (see :data:`DEPRECATED_NAMES`).
    """
    if deprecated:
        unknown = set(deprecated) - set(DEPRECATED_NAMES)
        if unknown:
            raise TypeError(f"stream_request() got unexpected keyword arguments {sorted(unknown)}")
        renamed = rename_deprecated(deprecated)
        given = dict(
            num_clips=num_clips,
            num_frames_per_clip=num_frames_per_clip,
            num_indices_between_frames=num_indices_between_frames,
            sampling_range_start=sampling_range_start,
            sampling_range_end=sampling_range_end,
            policy=policy,
        )
        defaults = dict(
            num_clips=1,
            num_frames_per_clip=1,
            num_indices_between_frames=1,
            sampling_range_start=None,
            sampling_range_end=None,
            policy="repeat_last",
        )
        for new, value in renamed.items():
            if given[new] != defaults[new]:
                raise InvalidArgument(f"{new}={given[new]!r} given with its old name too: give {new} only")
        num_clips = renamed.get("num_clips", num_clips)
        num_frames_per_clip = renamed.get("num_frames_per_clip", num_frames_per_clip)
        num_indices_between_frames = renamed.get("num_indices_between_frames", num_indices_between_frames)
        sampling_range_start = renamed.get("sampling_range_start", sampling_range_start)
        sampling_range_end = renamed.get("sampling_range_end", sampling_range_end)
        policy = renamed.get("policy", policy)
    batch_size = uint("batch_size", batch_size, 1)
    world_size = uint("world_size", world_size, 1)
    rank = uint("rank", rank)
    if rank >= world_size:
        raise InvalidArgument(f"rank={rank}: must be below world_size={world_size}")
    if random_crop is not None and random_resized_crop is not None:
        raise InvalidArgument("random_crop and random_resized_crop: give one of them")
    s = pb.ClipSampler(
        kind=_choice("sampler", sampler, SAMPLERS),
        num_clips=uint("num_clips", num_clips, 1),
        frames_per_clip=uint("num_frames_per_clip", num_frames_per_clip, 1),
        frame_stride=uint("num_indices_between_frames", num_indices_between_frames, 1),
        short_video=_choice("policy", policy, POLICIES),
    )
    # On the wire 0 means unset (the daemon's default): a 0 given here would be taken as that default,
    # so it is refused, as TorchCodec refuses any step that is not positive.
    if seconds_between_frames is not None:
        s.seconds_between_frames = _positive_seconds("seconds_between_frames", seconds_between_frames)
    if seconds_between_clip_starts is not None:
        s.seconds_between_clip_starts = _positive_seconds("seconds_between_clip_starts", seconds_between_clip_starts)
    # (A negative bound counts from the end: only two from the start can be compared here; the daemon
    # checks the others, by its wire names.)
    if (
        sampling_range_start is not None
        and sampling_range_end is not None
        and 0 <= float(sampling_range_start) >= float(sampling_range_end) >= 0
    ):
        raise InvalidArgument(
            f"sampling_range_start={sampling_range_start!r} must be before sampling_range_end={sampling_range_end!r}"
        )
    if sampling_range_start is not None:
        s.range_start = float(sampling_range_start)
    if sampling_range_end is not None:
        s.range_end = float(sampling_range_end)
    aug = pb.Augment(random_hflip=bool(random_hflip))
    if random_crop is not None:
        aug.random_crop.CopyFrom(size_msg("random_crop", random_crop))
    if random_resized_crop is not None:
        aug.random_resized_crop.CopyFrom(_random_resized_crop(random_resized_crop))
    req = pb.StreamBatchesRequest(
        dataset=text("dataset", dataset),
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
            height=height,
            width=width,
        ),
        augment=aug,
        batch_size=batch_size,
        drop_last=bool(drop_last),
        seed=uint("seed", seed, 0, UINT64_MAX),
        epoch=uint("epoch", epoch, 0, UINT64_MAX),
        rank=rank,
        world_size=world_size,
        start_batch=uint("start_batch", start_batch, 0, UINT64_MAX),
        prefetch=uint("prefetch", prefetch),
        no_shuffle=not shuffle,
        shard_remainder=_choice("shard_remainder", shard_remainder, SHARD_REMAINDER),
        on_error=_choice("on_error", on_error, ON_ERROR),
        cache_policy=_choice("cache_policy", cache_policy, CACHE_POLICIES),
    )
    start_sample = uint("start_sample", start_sample, 0, UINT64_MAX)
    if start_sample:
        req.start_sample = start_sample
    if samples_fingerprint is not None:
        req.samples_fingerprint = uint("samples_fingerprint", samples_fingerprint, 0, UINT64_MAX)
    return req


def stream_kwargs_names() -> Tuple[str, ...]:
    """The keyword arguments :func:`stream_request` accepts, old names included (the torch dataset
    validates against them)."""
    code = stream_request.__code__
    return code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount] + tuple(DEPRECATED_NAMES)


def policy_of(kwargs: Mapping[str, Any]) -> str:
    """The short-video policy a set of stream arguments asks for (old or new name), canonically spelled."""
    value = kwargs.get("policy", kwargs.get("short_video", "repeat_last"))
    return _canonical("policy", value, POLICIES)


__all__ = [
    "DEPRECATED_NAMES",
    "Finish",
    "UINT32_MAX",
    "UINT64_MAX",
    "clip_msg",
    "dtype_code",
    "dtype_name",
    "finish_of",
    "get_clips_request",
    "layout_name",
    "rename_deprecated",
    "size_hw",
    "size_msg",
    "stream_request",
    "text",
    "transform_msg",
    "uint",
]
