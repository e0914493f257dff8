"""How a batch's bytes reach this process: the one place that differs between transports.

gRPC is the control plane for every transport; a transport decides (1) what it adds to a request (a
shared-memory transport will ask for a slot in a /dev/shm arena) and (2) how it turns the reply messages
into :class:`~vserve_client.batch.Batch` objects.

- ``inline``: the array's bytes travel inside the reply messages, in chunks (the daemon sends 8 MiB
  chunks); the client copies them into one preallocated array per batch.
- ``shm``: the daemon writes each batch into a slot of a per-stream arena (a file under /dev/shm); the
  message carries the slot, never the pixels; the client maps the arena once and hands out numpy views of it
  (copy-on-write mappings: writable, no copy unless written). The next read of a stream releases the
  previous batch's slot unless it was kept (:meth:`Batch.keep`). A GetClips reply's slot is released once
  nothing views it any more (its mapping is garbage-collected; the release goes out with the client's next
  call), and the request says so (``reuse_arena``), so the daemon hands the same arena to a later reply
  instead of creating and zero-filling a new file each time.
- ``auto``: shm when the address is a Unix socket (the daemon is on this host), else inline.
"""

from __future__ import annotations

import itertools
import mmap
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List

import numpy as np

from ._proto import vserve_pb2 as pb
from .batch import WIRE_DTYPES, Batch, assemble_batches, assemble_one
from .errors import InvalidArgument, NotFound, ProtocolError

TRANSPORTS = ("auto", "shm", "inline")


class Transport:
    """Interface every transport implements."""

    #: "inline" or "shm".
    name = ""

    def prepare(self, request: Any) -> None:
        """Adds this transport's fields to a GetClips or StreamBatches request (in place)."""

    def one(self, messages: Iterable[Any]) -> Batch:
        """The single batch of a GetClips reply."""
        raise NotImplementedError

    def batches(self, messages: Iterable[Any]) -> Iterator[Batch]:
        """The batches of a StreamBatches reply, each as soon as it is complete."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases what the transport holds (a shared-memory mapping)."""


class InlineTransport(Transport):
    name = "inline"

    def one(self, messages: Iterable[Any]) -> Batch:
        return assemble_one(messages)

    def batches(self, messages: Iterable[Any]) -> Iterator[Batch]:
        return assemble_batches(messages)


def _map(path: str) -> mmap.mmap:
    """Maps a whole arena file, copy-on-write (writable views; the daemon's later writes to slots this
    process has not written stay visible)."""
    try:
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as e:
        raise ProtocolError(
            f"cannot map the daemon's shared memory {path}: {e.strerror} (is the daemon on another host or in "
            "another container? use transport='inline')"
        ) from None


def _view(mapped: mmap.mmap, header: Any) -> np.ndarray:
    dtype = WIRE_DTYPES.get(header.dtype)
    if dtype is None:
        raise ProtocolError(f"unknown dtype {header.dtype} in batch header")
    shape = tuple(int(d) for d in header.shape)
    offset, nbytes = int(header.shm.offset), int(header.nbytes)
    if offset + nbytes > len(mapped):
        raise ProtocolError(f"slot at {offset}+{nbytes} outside the {len(mapped)}-byte arena")
    return np.frombuffer(mapped, dtype=np.uint8, count=nbytes, offset=offset).view(dtype).reshape(shape)


class ShmTransport(Transport):
    """Batches as views of the daemon's shared-memory arenas. ``release(arena, slots)`` calls ReleaseSlots."""

    name = "shm"

    def __init__(self, release: Callable[[str, List[int]], None]):
        self._release = release
        # GetClips slots whose mappings were garbage-collected, to release on the next call (a finalizer
        # may run on any thread at any moment, so it only records them).
        self._collected: List[Any] = []
        self._lock = threading.Lock()

    def _collect(self, arena: str, slot: int) -> None:
        with self._lock:
            self._collected.append((arena, slot))

    def flush(self) -> None:
        """Releases the GetClips slots nothing views any more."""
        with self._lock:
            todo, self._collected = self._collected, []
        for arena, slot in todo:
            self._releaser(arena, slot)()

    def _releaser(self, arena: str, slot: int) -> Callable[[], None]:
        def release() -> None:
            try:
                self._release(arena, [slot])
            except NotFound:
                pass  # the stream ended and its arena is gone already

        return release

    def close(self) -> None:
        try:
            self.flush()
        except Exception:
            pass  # the daemon expires unreleased replies on its own

    def prepare(self, request: Any) -> None:
        self.flush()
        request.transport = pb.TRANSPORT_SHM
        if "reuse_arena" in request.DESCRIPTOR.fields_by_name:
            request.reuse_arena = True

    def one(self, messages: Iterable[Any]) -> Batch:
        it = iter(messages)
        first = next(it, None)
        if first is None or not first.HasField("header"):
            raise ProtocolError("empty reply stream (no batch header)")
        if not first.header.HasField("shm"):
            # A daemon that answered inline: assemble as such.
            return assemble_one([first, *it])
        for _ in it:
            pass
        h = first.header
        mapped = _map(h.shm.path)
        # The slot goes back once the mapping is garbage-collected: numpy views keep it alive, so the
        # array (and any view of it) stays valid for as long as it is referenced.
        weakref.finalize(mapped, self._collect, h.shm.arena, h.shm.slot)
        return Batch(h, _view(mapped, h))

    def batches(self, messages: Iterable[Any]) -> Iterator[Batch]:
        it = iter(messages)
        first = next(it, None)
        if first is None:
            return
        if first.HasField("header") and not first.header.HasField("shm"):
            # A daemon that answers inline (one without shared memory): assemble as such.
            yield from assemble_batches(itertools.chain([first], it))
            return
        yield from self._shm_batches(itertools.chain([first], it))

    def _shm_batches(self, messages: Iterable[Any]) -> Iterator[Batch]:
        maps: Dict[str, mmap.mmap] = {}
        previous = None
        try:
            for msg in messages:
                if not msg.HasField("header"):
                    if msg.data:
                        raise ProtocolError("inline bytes in a shared-memory stream")
                    continue
                h = msg.header
                if not h.HasField("shm"):
                    raise ProtocolError("batch without a shared-memory slot in a shared-memory stream")
                mapped = maps.get(h.shm.path)
                if mapped is None:
                    mapped = maps[h.shm.path] = _map(h.shm.path)
                batch = Batch(h, _view(mapped, h), releaser=self._releaser(h.shm.arena, h.shm.slot))
                if previous is not None and not previous._kept:
                    previous.release()
                previous = batch
                yield batch
        finally:
            if previous is not None and not previous._kept:
                try:
                    previous.release()
                except Exception:
                    pass  # the call is being torn down; the daemon removes the arena with the stream


def is_local(addr: str) -> bool:
    """Whether the daemon runs on this host (a Unix socket or a loopback address): where shm can work."""
    if addr.startswith("unix:"):
        return True
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "127.0.0.1", "::1")


def select(kind: str, addr: str, release: Callable[[str, List[int]], None]) -> Transport:
    """The transport for ``Client(addr, transport=kind)``; ``release`` calls the daemon's ReleaseSlots."""
    if kind not in TRANSPORTS:
        raise InvalidArgument(f"transport={kind!r}: expected one of {', '.join(map(repr, TRANSPORTS))}")
    if kind == "shm" or (kind == "auto" and addr.startswith("unix:")):
        return ShmTransport(release)
    return InlineTransport()
