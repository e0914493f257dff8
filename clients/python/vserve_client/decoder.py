"""TorchCodec's ``VideoDecoder`` API over a vserve daemon: one video of a dataset, decoded frame-exactly
by the daemon (and its shared cache) instead of in this process.

    from vserve_client import Client, VideoDecoder
    decoder = VideoDecoder(Client("unix:/run/vserve/vserve.sock"), "kin", "a/b.mp4")
    decoder.metadata.num_frames, decoder.metadata.average_fps
    frame = decoder[0]                                   # [3, H, W] uint8
    batch = decoder.get_frames_at([0, 10, 20])           # FrameBatch: data [3, 3, H, W], pts_seconds, duration_seconds
    batch = decoder.get_frames_played_at([0.5, 1.25])    # the frames displayed at those times

Semantics are TorchCodec's (exact seek mode): frame i is the i-th frame FFmpeg's decoder outputs in
presentation order; the frame played at t is the last frame whose pts <= t, for begin_stream_seconds <= t
< end_stream_seconds; ``get_frames_played_in_range(a, b)`` gives the frames played during [a, b): from the
one played at a to the last one whose pts is before b. A frame's ``duration_seconds`` is the duration
the stream states for it (FFmpeg's frame duration, as TorchCodec and ffprobe report it; 0 when none).

Outputs: ``data`` is ``[N, 3, H, W]`` (``dimension_order="NCHW"``, the default) or ``[N, H, W, 3]``
("NHWC"), uint8; ``pts_seconds`` and ``duration_seconds`` are float64 ``[N]``. They are torch tensors when
torch is installed (``tensors=None``, the default), numpy arrays otherwise or with ``tensors=False``.
Frames arrive through the client's transport: with shared memory, ``data`` views the daemon's reply slot,
which stays valid while referenced (no copy).
"""

from __future__ import annotations

import math
import numbers
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import request as rq
from .errors import FailedPrecondition, InvalidArgument, OutOfRange

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

ArrayLike = Any  # numpy.ndarray or torch.Tensor


def _seconds(ticks: Any, num: int, den: int) -> np.ndarray:
    """Time-base ticks in seconds, computed as the daemon does (f64(ticks) * f64(num) / f64(den)), so the
    values compare equal to the daemon's ``pts_seconds``."""
    return np.asarray(ticks, dtype=np.int64).astype(np.float64) * float(num) / float(den)


@dataclass(frozen=True)
class VideoStreamMetadata:
    """A video stream's facts, named as TorchCodec's ``VideoStreamMetadata`` (exact seek mode, where
    the values come from the frame table: ``*_from_content``).

    Attributes:
        num_frames: frames FFmpeg's decoder outputs (``len(decoder)``).
        begin_stream_seconds: the smallest pts; end_stream_seconds: the largest pts plus that frame's
            stated duration (TorchCodec's ``*_from_content``); duration_seconds: end minus begin.
        average_fps: num_frames / duration_seconds (TorchCodec's definition); average_fps_from_header:
            the container's average frame rate.
        width, height: of the decoded frames (after display rotation, as returned); coded_width,
            coded_height: as stored. rotation: TorchCodec's value, the display matrix's angle in degrees
            counter-clockwise in [-180, 180) (a quarter turn clockwise is -90.0), None for a video
            shown as stored; rotation_clockwise: the same as vserve's Probe states it, 0, 90, 180 or 270
            degrees clockwise; mirrored: the display matrix also flips the picture left-right after that
            rotation (as the FFmpeg CLI applies it; ``rotation`` is then the mirrored matrix's angle, as
            TorchCodec reports it).
        codec, pixel_format, stream_index, time_base (num, den).
        pts_seconds, duration_seconds_per_frame: float64 [num_frames], each frame's pts and stated
            duration (:meth:`Client.probe`'s ``pts`` and ``durations`` in seconds); pts: int64
            [num_frames], the same pts in the stream's time base. Left out of the repr.
    """

    num_frames: int
    begin_stream_seconds: float
    end_stream_seconds: float
    duration_seconds: float
    average_fps: float
    average_fps_from_header: float
    width: int
    height: int
    coded_width: int
    coded_height: int
    rotation: Optional[float]
    rotation_clockwise: int
    mirrored: bool
    codec: str
    pixel_format: str
    stream_index: int
    time_base: tuple
    pts_seconds: np.ndarray = field(repr=False)
    duration_seconds_per_frame: np.ndarray = field(repr=False)
    pts: np.ndarray = field(repr=False)
    # The file's version the table was read from (Probe's ``version``; 0 from a daemon without it):
    # reads ask for it, and the daemon refuses them once another file is at the path.
    version: int = field(default=0, repr=False)

    # TorchCodec's names for the same values (its exact mode reads them from the content).
    @property
    def num_frames_from_content(self) -> int:
        return self.num_frames

    @property
    def begin_stream_seconds_from_content(self) -> float:
        return self.begin_stream_seconds

    @property
    def end_stream_seconds_from_content(self) -> float:
        return self.end_stream_seconds

    @classmethod
    def from_probe(cls, p: Dict[str, Any]) -> "VideoStreamMetadata":
        """From :meth:`Client.probe` with ``include_pts=True``."""
        num, den = p["time_base"]["num"], p["time_base"]["den"]
        pts = np.asarray(p["pts"], dtype=np.int64)
        durations = np.asarray(p.get("durations") or [], dtype=np.int64)
        n = int(p["frame_count"])
        if len(pts) != n:
            raise InvalidArgument("metadata needs the frame table: probe with include_pts=True")
        if len(durations) != n:
            raise InvalidArgument(
                "the daemon's Probe has no per-frame durations (ProbeResponse.durations): it predates this client"
            )
        pts_s = _seconds(pts, num, den)
        dur_s = _seconds(durations, num, den)
        if n:
            # As TorchCodec's scan: the smallest pts, and the largest pts + stated duration.
            begin = float(_seconds([pts.min()], num, den)[0])
            end = float(_seconds([(pts + durations).max()], num, den)[0])
        else:
            begin = end = 0.0
        duration = end - begin
        return cls(
            num_frames=n,
            begin_stream_seconds=begin,
            end_stream_seconds=end,
            duration_seconds=duration,
            average_fps=n / duration if duration > 0 else float(p["avg_fps"]),
            average_fps_from_header=float(p["avg_fps"]),
            width=int(p["display_width"]),
            height=int(p["display_height"]),
            coded_width=int(p["width"]),
            coded_height=int(p["height"]),
            rotation=_counter_clockwise(int(p["rotation"]), bool(p.get("mirrored", False))),
            rotation_clockwise=int(p["rotation"]),
            mirrored=bool(p.get("mirrored", False)),
            codec=p["codec"],
            pixel_format=p["pixel_format"],
            stream_index=int(p["stream"]),
            time_base=(num, den),
            pts_seconds=pts_s,
            duration_seconds_per_frame=dur_s,
            pts=pts,
            version=int(p.get("version") or 0),
        )


def _sequence(values: Any, what: str) -> np.ndarray:
    """``values`` as a one-dimensional array: a list, tuple, range, numpy array, tensor or other iterable
    (a generator). One value, a string or a nested sequence is a TypeError, as TorchCodec refuses them
    (they were flattened or taken as one: probe B)."""
    one = isinstance(values, (str, bytes, numbers.Number)) or getattr(values, "ndim", None) == 0
    if one or not hasattr(values, "__iter__"):
        raise TypeError(f"{what}={values!r}: expected a sequence (a list, array or tensor), not one value")
    if not hasattr(values, "__len__"):
        values = list(values)  # a generator
    try:
        arr = np.asarray(values)
    except ValueError:
        arr = None  # sequences of different lengths
    if arr is None or (arr.ndim != 1 and arr.size):
        raise TypeError(f"{what}: expected one dimension of values, not nested sequences")
    return arr.reshape(-1)


#: Most frames, and bytes, one GetClips of a :class:`VideoDecoder` asks for; longer reads are split.
_CHUNK_FRAMES = 4096
_CHUNK_BYTES = 512 << 20


def _counter_clockwise(clockwise: int, mirrored: bool = False) -> Optional[float]:
    """TorchCodec's rotation for a clockwise display rotation (then a left-right mirror, if ``mirrored``):
    the display matrix's counter-clockwise angle in [-180, 180) (FFmpeg's av_display_rotation_get), None
    when there is nothing to apply. av_display_rotation_get reads the angle of the matrix's first row,
    which the mirror turns half round when the rotation is 0 or 180 (TorchCodec 0.17 reports -180.0 for
    a mirror alone and 0.0 for a mirror of 180; -90.0 and 90.0 for mirrors of 90 and 270, as unmirrored)."""
    if mirrored and clockwise % 180 == 0:
        clockwise += 180
    elif clockwise % 360 == 0:
        return None
    return float((180 - clockwise) % 360 - 180)


@dataclass
class Frame:
    """One frame: ``data`` [3, H, W] (NCHW order) or [H, W, 3], its pts and duration in seconds."""

    data: ArrayLike
    pts_seconds: float
    duration_seconds: float

    def __iter__(self) -> Iterator[Any]:
        # TorchCodec's Frame unpacks as (data, pts_seconds, duration_seconds).
        return iter((self.data, self.pts_seconds, self.duration_seconds))


@dataclass
class FrameBatch:
    """Frames: ``data`` [N, 3, H, W] (or [N, H, W, 3]), ``pts_seconds`` and ``duration_seconds`` [N]."""

    data: ArrayLike
    pts_seconds: ArrayLike
    duration_seconds: ArrayLike

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: Any) -> Union[Frame, "FrameBatch"]:
        if isinstance(key, numbers.Integral):
            return Frame(self.data[key], float(self.pts_seconds[key]), float(self.duration_seconds[key]))
        return FrameBatch(self.data[key], self.pts_seconds[key], self.duration_seconds[key])

    def __iter__(self) -> Iterator[Frame]:
        for i in range(len(self)):
            yield self[i]  # type: ignore[misc]


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# The client of each (address, process) that VideoDecoder(address) uses.
_CLIENTS: Dict[Tuple[str, int], "Client"] = {}
_CLIENTS_LOCK = threading.Lock()


def _process_client(addr: str) -> "Client":
    """This process's client for ``addr``, shared by every decoder given that address."""
    from .client import Client

    key = (addr, os.getpid())
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None or client.closed:
            client = _CLIENTS[key] = Client(addr)
        return client


class VideoDecoder:
    """TorchCodec's ``VideoDecoder`` for one video of a dataset served by a vserve daemon.

    Args:
        client: a :class:`~vserve_client.Client`, or the daemon's address: every decoder given the same
            address in a process shares one client of that process (opened at the first, kept until the
            process exits), so decoders need no ``close()``, as TorchCodec's, and one built before a fork
            (a DataLoader's workers) reads through its own process's client after it.
        dataset, video: which video (path relative to the dataset root).
        stream_index: container stream index (None: FFmpeg's best video stream, as TorchCodec's default).
        dimension_order: "NCHW" (default) or "NHWC".
        size, short_side, height, width, rotate: the daemon's resize (bilinear; ``size=(height, width)``)
            and display rotation (on by default), as :meth:`Client.get_clips`. ``metadata`` describes the
            video itself, before any resize.
        tensors: torch tensors (True), numpy arrays (False), or torch when installed (None).
        seek_mode: "exact" or "approximate", accepted for TorchCodec's callers; both are exact (the daemon
            indexes each video once and shares the table).
        device, num_ffmpeg_threads: accepted for TorchCodec's callers: ``device`` must be "cpu" (frames
            arrive in host memory; the daemon's ``--gpus`` decides NVDEC), the thread count is the
            daemon's (``--decode-threads``).
    """

    def __init__(
        self,
        client: Union["Client", str],
        dataset: str,
        video: str,
        *,
        stream_index: Optional[int] = None,
        dimension_order: str = "NCHW",
        size: Any = None,
        short_side: Optional[int] = None,
        height: Optional[int] = None,
        width: Optional[int] = None,
        rotate: bool = True,
        tensors: Optional[bool] = None,
        seek_mode: str = "exact",
        device: Any = "cpu",
        num_ffmpeg_threads: Optional[int] = None,
    ):
        # TorchCodec's device and decoder threads: frames arrive in host memory, decoded by the daemon's
        # threads (--decode-threads, --gpus); "cpu" and any thread count are accepted, so that TorchCodec
        # code runs unchanged, another device is refused by name.
        if str(device) not in ("cpu", "cpu:0"):
            raise InvalidArgument(
                f"device={device!r}: vserve's frames arrive in host memory (the daemon decodes, on NVDEC "
                "with --gpus); use device='cpu' and move them with .to(device)"
            )
        if num_ffmpeg_threads is not None and (isinstance(num_ffmpeg_threads, bool) or int(num_ffmpeg_threads) < 0):
            raise InvalidArgument(f"num_ffmpeg_threads={num_ffmpeg_threads!r}: expected an int >= 0")
        if dimension_order not in ("NCHW", "NHWC"):
            raise InvalidArgument(f"dimension_order={dimension_order!r}: expected 'NCHW' or 'NHWC'")
        if seek_mode not in ("exact", "approximate"):
            raise InvalidArgument(f"seek_mode={seek_mode!r}: expected 'exact' or 'approximate'")
        # Both are exact here: the daemon indexes each video once and shares its table.
        self.seek_mode = seek_mode
        self._address = client if isinstance(client, str) else None
        self._given = None if isinstance(client, str) else client
        self.dataset = dataset
        self.video = os.fspath(video) if isinstance(video, os.PathLike) else video
        if stream_index == -1:
            stream_index = None  # TorchCodec's "the best video stream"
        self.dimension_order = dimension_order
        self._transform = dict(size=size, short_side=short_side, height=height, width=width, rotate=rotate)
        # Validate the transform now rather than at the first read.
        from .request import transform_msg

        transform_msg(**self._transform)
        self._tensors = _torch_available() if tensors is None else bool(tensors)
        self.metadata = self._client.metadata(dataset, video, stream=stream_index)
        # As TorchCodec's attribute: the stream read, the best video stream's index when none was named.
        self.stream_index: int = self.metadata.stream_index

    @property
    def _client(self) -> "Client":
        if self._given is not None:
            return self._given
        assert self._address is not None
        return _process_client(self._address)

    def close(self) -> None:
        """Hands the shared-memory replies nothing views any more back to the daemon now. The client is
        left open: a given one is its owner's, and an address's is shared by this process's decoders."""
        client = self._client
        if not client.closed:
            client.flush()

    def __enter__(self) -> "VideoDecoder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __len__(self) -> int:
        return self.metadata.num_frames

    # -- indices -------------------------------------------------------------------------------------

    def _index(self, i: Any) -> int:
        if not isinstance(i, numbers.Integral):
            # A TypeError, as TorchCodec's (and a list's): `except TypeError` callers see it.
            raise TypeError(f"frame index {i!r}: expected an int")
        n = len(self)
        k = int(i) + n if i < 0 else int(i)
        if not 0 <= k < n:
            raise OutOfRange(f"frame index {int(i)} is out of bounds: the video has {n} frames")
        return k

    def __getitem__(self, key: Any) -> ArrayLike:
        """``decoder[i]``: one frame's data [3, H, W]; ``decoder[a:b:c]``: [N, 3, H, W] (TorchCodec: data
        only; use :meth:`get_frames_at` for pts and durations)."""
        if isinstance(key, slice):
            return self._frames(list(range(*key.indices(len(self))))).data
        if isinstance(key, numbers.Integral):
            return self._frames([self._index(key)]).data[0]
        raise TypeError(f"decoder[{key!r}]: expected an int or a slice")

    def get_frame_at(self, index: int) -> Frame:
        return self.get_frames_at([index])[0]  # type: ignore[return-value]

    def get_frames_at(self, indices: Sequence[int]) -> FrameBatch:
        """The frames at these indices (negative ones count from the end), in the order given."""
        return self._frames([self._index(i) for i in _sequence(indices, "indices").tolist()])

    def get_frames_in_range(self, start: int, stop: int, step: int = 1) -> FrameBatch:
        """Frames ``start, start + step, ...`` before ``stop``, read as a Python slice as TorchCodec 0.17
        does: negative bounds count from the end and bounds past either end are clamped
        (``(-10, 1000)`` gives the last 10 frames, an empty range no frames). ``step`` > 0."""
        for name, v in (("start", start), ("stop", stop), ("step", step)):
            if not isinstance(v, numbers.Integral):
                raise TypeError(f"{name}={v!r}: expected an int")
        if step <= 0:
            raise InvalidArgument(f"step={step!r}: must be a positive int")
        return self._frames(list(range(*slice(int(start), int(stop), int(step)).indices(len(self)))))

    # -- times ---------------------------------------------------------------------------------------

    def _check_time(self, t: float, what: str = "seconds") -> None:
        m = self.metadata
        if not m.begin_stream_seconds <= t < m.end_stream_seconds:
            raise OutOfRange(
                f"{what}={t} is outside the stream's [{m.begin_stream_seconds}, {m.end_stream_seconds}) seconds"
            )

    def get_frame_played_at(self, seconds: float) -> Frame:
        return self.get_frames_played_at([seconds])[0]  # type: ignore[return-value]

    def get_frames_played_at(self, seconds: Sequence[float]) -> FrameBatch:
        """The frames displayed at these times: for each t, the last frame whose pts <= t (the daemon
        resolves them; t must lie in [begin_stream_seconds, end_stream_seconds))."""
        given = _sequence(seconds, "seconds")
        if given.size and given.dtype.kind not in "iuf":
            raise TypeError(f"seconds={seconds!r}: expected numbers")
        times = [float(t) for t in given]
        for t in times:
            self._check_time(t)
        if not times:
            return self._frames([])
        return self._fetch({"times": times})

    def get_frames_played_in_range(
        self, start_seconds: float, stop_seconds: float, fps: Optional[float] = None
    ) -> FrameBatch:
        """The frames played during [start_seconds, stop_seconds): from the frame played at start_seconds
        to the last frame whose pts is before stop_seconds (empty when they are equal). With ``fps``,
        resampled to that rate as TorchCodec 0.17 does: ``round((stop - start) * fps)`` frames, the i-th
        the one played at ``start_seconds + i / fps``, reported with that time as its pts and ``1 / fps``
        as its duration. Bounds outside the stream raise :class:`InvalidArgument` (a ``ValueError``, as
        TorchCodec's)."""
        m = self.metadata
        a, b = float(start_seconds), float(stop_seconds)
        if a > b:
            raise InvalidArgument(f"start_seconds={a} is after stop_seconds={b}")
        if not m.begin_stream_seconds <= a < m.end_stream_seconds:
            raise InvalidArgument(
                f"start_seconds={a} is outside the stream's [{m.begin_stream_seconds}, {m.end_stream_seconds}) seconds"
            )
        if b > m.end_stream_seconds:
            raise InvalidArgument(f"stop_seconds={b} is after the stream's end at {m.end_stream_seconds} seconds")
        if fps is not None:
            rate = float(fps)
            if not rate > 0 or not np.isfinite(rate):
                raise InvalidArgument(f"fps={fps!r}: must be a positive number")
            # As TorchCodec 0.17: round((stop - start) * fps) frames, halves away from zero (C++'s
            # std::round, not numpy's halves to even), at start + i * (1 / fps) (one rounding of the
            # step, then one of each product: `i / fps` can differ from it by an ulp, and a time that
            # lands on a pts then picks the frame before or after).
            span = (b - a) * rate
            count = int(math.floor(span)) + (1 if span - math.floor(span) >= 0.5 else 0)
            step = 1.0 / rate
            times = [a + i * step for i in range(count)]
            if not times:
                return self._frames([])
            fb = self.get_frames_played_at(times)
            return self._wrap(np.asarray(fb.data), times, np.full(len(times), step))
        if a == b:
            return self._frames([])
        first = int(np.searchsorted(m.pts_seconds, a, side="right")) - 1
        stop = int(np.searchsorted(m.pts_seconds, b, side="left"))
        return self._frames(list(range(max(first, 0), stop)))

    def get_all_frames(self, fps: Optional[float] = None) -> FrameBatch:
        """Every frame (with ``fps``: the frames played at that rate from the stream's start)."""
        m = self.metadata
        if fps is None:
            return self._frames(list(range(len(self))))
        return self.get_frames_played_in_range(m.begin_stream_seconds, m.end_stream_seconds, fps)

    # -- fetching ------------------------------------------------------------------------------------

    def _frames(self, indices: List[int]) -> FrameBatch:
        if not indices:
            return self._empty()
        return self._fetch({"frames": indices})

    def _fetch(self, where: Dict[str, Any]) -> FrameBatch:
        """One GetClips, or several for more frames than one request may ask (the daemon's
        ``--max-frames``, 16384 by default, and ``--max-output-bytes``): each at most
        :data:`_CHUNK_FRAMES` frames and :data:`_CHUNK_BYTES` bytes, copied into one array."""
        where = dict(where, stream=self.stream_index)
        layout = "TCHW" if self.dimension_order == "NCHW" else "THWC"
        (key, wanted), = ((k, v) for k, v in where.items() if k in ("frames", "times"))
        h, w = self._output_size()
        per_chunk = max(1, min(_CHUNK_FRAMES, _CHUNK_BYTES // max(1, 3 * h * w)))
        if len(wanted) <= per_chunk:
            batch = self._read(where, layout)
            return self._wrap(batch.array[0], batch.pts_seconds[0], batch.duration_seconds[0])
        data: Optional[np.ndarray] = None
        pts = np.empty(len(wanted), np.float64)
        dur = np.empty(len(wanted), np.float64)
        for at in range(0, len(wanted), per_chunk):
            part = dict(where, **{key: wanted[at : at + per_chunk]})
            batch = self._read(part, layout)
            got = batch.array[0]
            if data is None:
                data = np.empty((len(wanted),) + got.shape[1:], got.dtype)
            data[at : at + len(got)] = got
            pts[at : at + len(got)] = batch.pts_seconds[0]
            dur[at : at + len(got)] = batch.duration_seconds[0]
        assert data is not None
        return self._wrap(data, pts, dur)

    def _read(self, where: Dict[str, Any], layout: str) -> Any:
        """One GetClips of this video. The daemon reads the file its path names now: one replaced since
        this decoder read its frame table (copied or renamed over) would give another video's frames under
        this one's metadata, so a reply whose frames are not the ones the table names, or a frame the table
        has and the file does not, raises :class:`FailedPrecondition` saying so."""
        changed = FailedPrecondition(
            f"video {self.video!r} of dataset {self.dataset!r} changed since this VideoDecoder read its frame "
            "table (the file was replaced): open a new VideoDecoder"
        )
        clip = rq.clip_msg((self.video, where))
        if self.metadata.version:
            clip.expect_version = self.metadata.version
        try:
            batch = self._client.get_clips(self.dataset, [clip], layout=layout, **self._transform)
        except FailedPrecondition:
            raise changed from None  # the daemon's check of the file's version
        except OutOfRange:
            if "frames" in where:
                raise changed from None  # every index was checked against the table
            raise
        frames = batch.array[0]
        size = frames.shape[-3:-1] if layout == "THWC" else frames.shape[-2:]
        if tuple(size) != tuple(self._output_size()):
            raise changed
        if "frames" in where and not np.array_equal(batch.pts[0], self.metadata.pts[where["frames"]]):
            raise changed
        return batch

    def _empty(self) -> FrameBatch:
        h, w = self._output_size()
        shape = (0, 3, h, w) if self.dimension_order == "NCHW" else (0, h, w, 3)
        return self._wrap(np.empty(shape, np.uint8), np.empty(0, np.float64), np.empty(0, np.float64))

    def _output_size(self) -> tuple:
        from .request import size_hw

        t = self._transform
        m = self.metadata
        h, w = (m.height, m.width) if t["rotate"] else (m.coded_height, m.coded_width)
        if t["height"] is not None:
            return int(t["height"]), int(t["width"])
        if t["size"] is not None:
            return size_hw("size", t["size"])
        if t["short_side"] is not None:
            s = int(t["short_side"])
            # The daemon rounds the long side to the nearest pixel.
            return (s, int(w * s / h + 0.5)) if h <= w else (int(h * s / w + 0.5), s)
        return h, w

    def _wrap(self, data: np.ndarray, pts: Any, dur: Any) -> FrameBatch:
        pts = np.asarray(pts, dtype=np.float64)
        dur = np.asarray(dur, dtype=np.float64)
        if self._tensors:
            import torch

            return FrameBatch(torch.from_numpy(data), torch.from_numpy(pts), torch.from_numpy(dur))
        return FrameBatch(data, pts, dur)

    def __repr__(self) -> str:
        m = self.metadata
        return (
            f"VideoDecoder({self.dataset!r}, {self.video!r}, frames={m.num_frames}, {m.width}x{m.height}, "
            f"{m.average_fps:.3f} fps, dimension_order={self.dimension_order!r})"
        )


__all__ = ["Frame", "FrameBatch", "VideoDecoder", "VideoStreamMetadata"]
