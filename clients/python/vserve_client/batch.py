"""Batches: one reply of GetClips, or one batch of StreamBatches, as a numpy array plus its clip facts.

Input: the reply messages of either RPC (``GetClipsResponse`` and ``StreamBatchesResponse`` have the same
fields: ``header``, ``offset``, ``data``). Output: :class:`Batch` objects.

Wire rules enforced here (proto/vserve/v1/vserve.proto):
- a batch starts with a message carrying its ``header`` (which may also carry the first bytes);
- the batch's bytes follow in order: each chunk's ``offset`` equals the bytes received so far;
- a batch is complete when ``nbytes`` bytes arrived; the next header starts the next batch;
- the array is ``header.shape`` of ``header.dtype``, little-endian, C order.

Each batch's bytes are copied once, into one array allocated from the header's ``nbytes`` (no
concatenation of chunks). Violations raise :class:`~vserve_client.errors.ProtocolError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from . import bfloat16, dlpack
from ._proto import vserve_pb2 as pb
from .errors import ProtocolError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .request import Finish

#: Wire dtype -> numpy dtype (explicitly little-endian: the wire is little-endian on every host).
WIRE_DTYPES: Dict[int, "np.dtype[Any]"] = {
    pb.DTYPE_UINT8: np.dtype("u1"),
    pb.DTYPE_FLOAT16: np.dtype("<f2"),
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
}

LAYOUT_NAMES = {pb.LAYOUT_THWC: "THWC", pb.LAYOUT_TCHW: "TCHW"}


def message_to_dict(msg: Any) -> Dict[str, Any]:
    """A protobuf message as a plain dict keyed by proto field names.

    Integers stay ints (unlike ``json_format``, which turns 64-bit ones into strings), repeated fields become
    lists, unset ``optional`` fields and unset sub-messages become ``None``, enums their value names. Fields
    added to the proto later appear without changes here.
    """
    out: Dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            if entry.message_type is not None:
                out[field.name] = {k: message_to_dict(v) for k, v in value.items()}
            else:
                out[field.name] = dict(value)
        elif field.is_repeated:
            if field.message_type is not None:
                out[field.name] = [message_to_dict(v) for v in value]
            elif field.enum_type is not None:
                out[field.name] = [field.enum_type.values_by_number[v].name for v in value]
            else:
                out[field.name] = list(value)
        elif field.has_presence and not msg.HasField(field.name):
            out[field.name] = None
        elif field.message_type is not None:
            out[field.name] = message_to_dict(value)
        elif field.enum_type is not None:
            known = field.enum_type.values_by_number.get(value)
            out[field.name] = known.name if known is not None else value
        else:
            out[field.name] = value
    return out


def _per_clip(rows: List[List[Any]], dtype: Any) -> Any:
    """Per-clip lists as one [clips, T] array when they have one length (they do: every clip of a batch has
    T frames), else a list of 1-D arrays."""
    if len({len(r) for r in rows}) <= 1:
        width = len(rows[0]) if rows else 0
        return np.array(rows, dtype=dtype).reshape(len(rows), width)
    return [np.array(r, dtype=dtype) for r in rows]


class Batch:
    """Clips as one array ``[clips, T, H, W, C]`` (layout THWC), ``[clips, T, C, H, W]`` (TCHW) or
    ``[clips, C, T, H, W]`` (CTHW, torchvision's video models), and what the daemon says about them.

    Attributes:
        array: the pixels (uint8, float16 or float32; writable). bfloat16 batches hold the values' bit
            patterns as uint16 (NumPy has no bfloat16): :meth:`to_torch` or ``torch.from_dlpack(batch)``
            gives a ``torch.bfloat16`` tensor on the same memory, :func:`vserve_client.bfloat16.to_float32`
            widens them. CTHW arrays are a permuted view of THWC memory (not C-contiguous).
        dtype: "uint8", "float16", "float32" or "bfloat16".
        videos: per clip, its path in the dataset.
        labels: per clip, its manifest label ("" without one; StreamBatches only).
        label_indices: int64 [clips], the label's index in the dataset's sorted label set (-1 without).
        frames: int64 [clips, T], the frame indices decoded (frame k = FFmpeg's k-th output frame).
        pts: int64 [clips, T] in the stream's time base; pts_seconds: float64 [clips, T].
        duration_seconds: float64 [clips, T], each frame's duration as the stream states it (FFmpeg's
            frame duration; 0 when none is stated), as TorchCodec's ``FrameBatch.duration_seconds``.
        clips: per clip, every ClipInfo field as a dict (sample, clip, replaced_by, crop, flipped, ...).
        skipped: samples replaced in this batch, dicts with sample, video, code, message.
        batch, batches_total: this batch's number in the rank's epoch and how many it has (StreamBatches;
            batches_total is None where the daemon cannot know it ahead, with regular-timestamp sampling).
        stats: what serving it cost (frames_decoded, cache_hits, gop_runs, ...).
        layout: "THWC", "TCHW" or "CTHW". header: the raw ``BatchHeader`` message.
    """

    __slots__ = (
        "array",
        "header",
        "videos",
        "labels",
        "label_indices",
        "frames",
        "pts",
        "pts_seconds",
        "duration_seconds",
        "dtype",
        "_clips",
        "_skipped",
        "batch",
        "batches_total",
        "_stats",
        "layout",
        "_releaser",
        "_kept",
    )

    def __init__(self, header: "pb.BatchHeader", array: np.ndarray, releaser: Any = None):
        self.header = header
        self.array = array
        # Shared memory: gives the arena slot under ``array`` back to the daemon (once).
        self._releaser = releaser
        self._kept = False
        infos = list(header.clips)
        self.videos: List[str] = [c.video for c in infos]
        self.labels: List[str] = [c.label for c in infos]
        self.label_indices = np.array([c.label_index for c in infos], dtype=np.int64)
        self.frames = _per_clip([list(c.frame_indices) for c in infos], np.int64)
        self.pts = _per_clip([list(c.pts) for c in infos], np.int64)
        self.pts_seconds = _per_clip([list(c.pts_seconds) for c in infos], np.float64)
        self.duration_seconds = _per_clip([list(c.duration_seconds) for c in infos], np.float64)
        self.dtype: str = array.dtype.name
        # clips, skipped and stats are dicts made on first use (a millisecond per 32 clips otherwise).
        self._clips: Optional[List[Dict[str, Any]]] = None
        self._skipped: Optional[List[Dict[str, Any]]] = None
        self._stats: Optional[Dict[str, Any]] = None
        self.batch: int = header.batch
        # 0 on the wire: not a stream, or a count the daemon cannot know ahead (regular-timestamp sampling,
        # where the clip count depends on each video's duration). A received batch never belongs to an
        # epoch of 0 batches, so 0 always means "unknown".
        self.batches_total: Optional[int] = header.batches_total or None
        self.layout: str = LAYOUT_NAMES.get(header.layout, str(header.layout))

    def __len__(self) -> int:
        return len(self.videos)

    @property
    def samples_fingerprint(self) -> int:
        """StreamBatches: the fingerprint of the sample list the epoch is planned over (0 otherwise)."""
        return int(getattr(self.header, "samples_fingerprint", 0))

    @property
    def clips(self) -> List[Dict[str, Any]]:
        if self._clips is None:
            self._clips = [message_to_dict(c) for c in self.header.clips]
        return self._clips

    @clips.setter
    def clips(self, value: List[Dict[str, Any]]) -> None:
        self._clips = value

    @property
    def skipped(self) -> List[Dict[str, Any]]:
        if self._skipped is None:
            self._skipped = [message_to_dict(s) for s in self.header.skipped]
        return self._skipped

    @skipped.setter
    def skipped(self, value: List[Dict[str, Any]]) -> None:
        self._skipped = value

    @property
    def stats(self) -> Dict[str, Any]:
        if self._stats is None:
            self._stats = message_to_dict(self.header.stats)
        return self._stats

    @stats.setter
    def stats(self, value: Dict[str, Any]) -> None:
        self._stats = value

    def _finish(self, finish: "Finish") -> "Batch":
        """Applies the client-side part of the request's output: bfloat16 rounding (a new array, so the
        shared-memory slot is released at once) and the CTHW view."""
        if finish.dtype == "bfloat16":
            if self.array.dtype != np.float32:
                raise ProtocolError(f"bfloat16 asked, but the daemon sent {self.array.dtype} (expected float32)")
            self.array = bfloat16.from_float32(self.array)
            self.dtype = "bfloat16"
            self.release()
        if finish.layout == "CTHW":
            if self.layout != "THWC" or self.array.ndim != 5:
                raise ProtocolError(f"CTHW asked, but the daemon sent {self.layout} {self.array.shape}")
            self.array = self.array.transpose(0, 4, 1, 2, 3)
            self.layout = "CTHW"
        return self

    def to_torch(self) -> "torch.Tensor":
        """The pixels as a torch tensor on the same memory (no copy; a shared-memory batch's tensor is valid
        while the slot is: see :meth:`keep`). bfloat16 batches give ``torch.bfloat16``."""
        import torch

        if self.dtype == "bfloat16":
            return torch.from_numpy(self.array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(self.array)

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        """DLPack export of ``array`` (``torch.from_dlpack(batch)``, ``jax.dlpack``, ...), zero-copy: the
        consumer's tensor views this batch's memory (for shared memory: the slot, valid while kept).
        bfloat16 batches export ``kDLBfloat`` 16-bit tensors."""
        if stream is not None and stream != -1:
            raise BufferError(f"stream={stream!r}: batches are host memory (no stream)")
        if self.dtype == "bfloat16":
            dl_device = kwargs.get("dl_device")
            if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
                raise BufferError(f"dl_device={dl_device!r}: batches are on the CPU")
            if kwargs.get("copy"):
                return dlpack.capsule(self.array.copy())
            return dlpack.capsule(self.array)
        return self.array.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (dlpack.KDL_CPU, 0)

    @property
    def shared(self) -> bool:
        """Whether ``array`` is a view of a shared-memory slot the daemon will reuse once released."""
        return self._releaser is not None

    def keep(self) -> "Batch":
        """Keeps this batch's shared-memory slot past the next read of its stream (which otherwise releases
        it): call :meth:`release` when done with ``array``, or take ``array.copy()`` and release. A stream
        whose slots are all kept has nowhere to put its next batch: reading on raises ResourceExhausted."""
        self._kept = True
        return self

    def detach(self) -> "Batch":
        """Makes ``array`` this batch's own copy and releases its shared-memory slot (a no-op for inline
        batches): for code that collects batches, e.g. ``[b.detach() for b in client.stream(...)]``."""
        if self._releaser is not None:
            self.array = self.array.copy()
            self.release()
        return self

    def release(self) -> None:
        """Gives the batch's memory back. A no-op for inline batches (the array is owned by this object);
        with shared memory the array is a view of an arena slot that the daemon may overwrite afterwards, so
        do not use ``array`` after releasing (copy it first if needed). A stream's next read releases the
        previous batch unless it was kept."""
        r, self._releaser = self._releaser, None
        if r is not None:
            r()

    def __repr__(self) -> str:
        return (
            f"Batch(batch={self.batch}/{self.batches_total}, shape={tuple(self.array.shape)}, "
            f"dtype={self.dtype}, layout={self.layout}, videos={len(self.videos)}, skipped={len(self.skipped)})"
        )


class ArrayAssembler:
    """Collects one batch's chunks into a preallocated array."""

    def __init__(self, header: "pb.BatchHeader"):
        dtype = WIRE_DTYPES.get(header.dtype)
        if dtype is None:
            raise ProtocolError(f"unknown dtype {header.dtype} in batch header")
        shape = tuple(int(d) for d in header.shape)
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else 0
        if expected != header.nbytes:
            raise ProtocolError(
                f"header announces {header.nbytes} bytes but shape {list(shape)} of {dtype} needs {expected}"
            )
        self.header = header
        self.dtype = dtype
        self.shape = shape
        self.nbytes = int(header.nbytes)
        self.buffer = np.empty(self.nbytes, dtype=np.uint8)
        self.received = 0

    def add(self, offset: int, data: bytes) -> None:
        if not data:
            return
        if offset != self.received:
            raise ProtocolError(f"chunk at offset {offset} but {self.received} bytes received")
        end = self.received + len(data)
        if end > self.nbytes:
            raise ProtocolError(f"chunks exceed the announced {self.nbytes} bytes (chunk ends at {end})")
        self.buffer[self.received : end] = np.frombuffer(data, dtype=np.uint8)
        self.received = end

    @property
    def complete(self) -> bool:
        return self.received == self.nbytes

    def finish(self) -> Batch:
        if not self.complete:
            raise ProtocolError(f"received {self.received} of {self.nbytes} bytes")
        return Batch(self.header, self.buffer.view(self.dtype).reshape(self.shape))


def assemble_batches(messages: Iterable[Any]) -> Iterator[Batch]:
    """Batches from a reply stream, each yielded as soon as its last byte arrives."""
    current: Optional[ArrayAssembler] = None
    for msg in messages:
        if msg.HasField("header"):
            if current is not None:
                raise ProtocolError(
                    f"batch header arrived after {current.received} of {current.nbytes} bytes of the previous batch"
                )
            current = ArrayAssembler(msg.header)
        elif current is None:
            if not msg.data:
                continue  # an empty message between batches carries nothing
            raise ProtocolError(
                f"chunk of {len(msg.data)} bytes at offset {msg.offset} before any batch header"
            )
        current.add(msg.offset, msg.data)
        if current.complete:
            yield current.finish()
            current = None
    if current is not None:
        raise ProtocolError(f"stream ended after {current.received} of {current.nbytes} bytes of a batch")


def assemble_one(messages: Iterable[Any]) -> Batch:
    """The single batch of a GetClips reply."""
    out: Optional[Batch] = None
    for batch in assemble_batches(messages):
        if out is not None:
            raise ProtocolError("GetClips reply carried more than one batch header")
        out = batch
    if out is None:
        raise ProtocolError("empty reply stream (no batch header)")
    return out
