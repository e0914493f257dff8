"""How a batch's bytes reach this process: the one place that differs between transports.

gRPC is the control plane for every transport; a transport decides (1) what it adds to a request (a
shared-memory transport will ask for a slot in a /dev/shm arena) and (2) how it turns the reply messages
into :class:`~vserve_client.batch.Batch` objects.

- ``inline``: the array's bytes travel inside the reply messages, in chunks (the daemon sends 8 MiB
  chunks); the client copies them into one preallocated array per batch.
- ``shm``: the daemon writes each batch into a slot of a per-stream arena (a file under /dev/shm); the
  message carries the slot, never the pixels; the client maps the arena once and hands out numpy views of it
  (copy-on-write mappings: writable, no copy unless written; pages written here are dropped before the slot
  is viewed again, so the daemon's next batch in it shows). The next read of a stream releases the
  previous batch's slot unless it was kept (:meth:`Batch.keep`). A GetClips reply's slot is released once
  nothing views it any more (its array and every view of it are garbage-collected; the release goes out
  with the client's next call), and the request says so (``reuse_arena``), so the daemon hands the same
  arena to a later reply instead of creating and zero-filling a new file each time; the client keeps that
  arena mapped, so the later reply's pages are mapped already (reading a reply runs at memory speed).
- ``auto``: shm when the address is a Unix socket (the daemon is on this host), else inline.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from ._proto import vserve_pb2 as pb
from .batch import WIRE_DTYPES, Batch, assemble_batches, assemble_one
from .errors import (
    ClientClosed,
    InvalidArgument,
    NotFound,
    ProtocolError,
    ResourceExhausted,
    ShmUnreachable,
    Unavailable,
)

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

    def flush(self, wait: bool = False) -> None:
        """Gives back to the daemon what nothing views any more (shared-memory slots); ``wait``: and waits
        for its answers."""

    def close(self) -> None:
        """Releases what the transport holds (a shared-memory mapping)."""


class InlineTransport(Transport):
    name = "inline"

    def prepare(self, request: Any) -> None:
        # A request prepared for shared memory once (sent again inline after ShmUnreachable).
        request.transport = pb.TRANSPORT_INLINE
        if "reuse_arena" in request.DESCRIPTOR.fields_by_name:
            request.reuse_arena = False

    def one(self, messages: Iterable[Any]) -> Batch:
        return assemble_one(messages)

    def batches(self, messages: Iterable[Any]) -> Iterator[Batch]:
        return assemble_batches(messages)


#: ``madvise`` advice that faults a range in for reading without writing it (Linux 5.14); Python names it
#: only from 3.13 on.
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
PAGE = mmap.PAGESIZE
#: Arena mappings a transport keeps for later replies and streams in the same arena (the daemon lends a
#: released GetClips arena to a later reply, an ended stream's to the next stream of its shape).
CACHED_MAPPINGS = 8
#: Seconds between checks, on a background thread, for kept mappings of arenas the daemon has removed
#: (it drops spare arenas unused for a minute) and for replies garbage-collected since the last call: a
#: client that stops calling keeps neither their memory nor the daemon's slots.
PRUNE_PERIOD = 1.0


class Mapping:
    """One arena file mapped whole, copy-on-write: numpy views of it are writable, and this process's
    writes stay private (the daemon's later writes to pages this process has not written stay visible).

    - :meth:`populate` faults a slot's pages in ahead of the consumer (``MADV_POPULATE_READ``: one system
      call instead of a page fault per 64 KiB on first read; read faults never copy, unlike
      ``MAP_POPULATE`` on a writable private mapping, which copies every page). Off unless
      :attr:`populate_supported` is set (measured slower than the faults it saves); kernels without it
      (EINVAL, before 5.14) or that refuse it fall back to faulting on first read.
    - :meth:`refresh`, before a slot is viewed again: the daemon rewrites a slot once it is released,
      but pages this process wrote to (a trainer normalising a batch in place) are private copies that
      would hide the new bytes; they are dropped (or, on a page shared with a neighbouring slot, the
      slot's part is read again from the file). Needed wherever a mapping outlives a slot's release:
      stream arenas, and GetClips arenas kept across replies.
    """

    __slots__ = ("path", "size", "mm", "base", "address", "__weakref__")

    #: Whether to fault slots in with MADV_POPULATE_READ before handing them out (cleared at the kernel's
    #: first refusal, for the whole process). Off by default: on Linux 6.x, populating a fresh 38.5 MB
    #: mapping took longer (3-4 ms) than the page faults it saves (the kernel maps 16 cached pages per read
    #: fault), and a mapping kept across replies is already populated (docs/BENCHMARKS.md, issue 16).
    populate_supported = False
    #: /proc/self/pagemap, opened once per process (None: unreadable; then every release drops the
    #: slot's pages, which is always correct, only slower).
    _pagemap: Optional[int] = -1
    _pagemap_lock = threading.Lock()

    def __init__(self, path: str, size: int = 0):
        try:
            with open(path, "rb") as f:
                self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except OSError as e:
            err = ShmUnreachable(
                f"cannot map the daemon's shared memory {path}: {e.strerror} (is the daemon on another host or "
                "in another container, or another user's? use transport='inline')"
            )
            err.errno = e.errno
            raise err from None
        self.path = path
        self.size = len(self.mm)
        self.base = np.frombuffer(self.mm, dtype=np.uint8)
        self.address = int(self.base.ctypes.data)

    def check(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ProtocolError(f"slot at {offset}+{nbytes} outside the {self.size}-byte arena")

    def populate(self, offset: int, nbytes: int) -> None:
        if not Mapping.populate_supported or nbytes == 0:
            return
        start = offset - offset % PAGE
        try:
            self.mm.madvise(MADV_POPULATE_READ, start, offset + nbytes - start)
        except (OSError, ValueError, AttributeError):
            Mapping.populate_supported = False

    @classmethod
    def _pagemap_fd(cls) -> Optional[int]:
        with cls._pagemap_lock:
            if cls._pagemap == -1:
                try:
                    cls._pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    cls._pagemap = None
            return cls._pagemap

    def refresh(self, offset: int, nbytes: int) -> bool:
        """Makes the mapping show the file's bytes in a slot the daemon has just written: pages of it this
        process wrote to earlier (its private copies, which would hide the new bytes) are dropped, or,
        where a page is shared with a neighbouring slot whose copy must stay, the slot's part of it is read
        again from the file. Returns whether every page of the slot is mapped now (nothing to populate)."""
        if nbytes == 0:
            return True
        end = offset + nbytes
        start = offset - offset % PAGE
        pages = -(-(min(end, self.size) - start) // PAGE)
        fd = self._pagemap_fd()
        entries = None
        if fd is not None:
            try:
                raw = os.pread(fd, pages * 8, (self.address + start) // PAGE * 8)
                if len(raw) == pages * 8:
                    entries = np.frombuffer(raw, dtype="<u8")
            except OSError:
                pass
        if entries is None:
            private = np.arange(pages)  # unknown: treat every page as written
            present = False
        else:
            # Bit 63: present; bit 61: a file page (or shared memory). Present but not a file page: a
            # private copy, made when this process wrote to it.
            mapped = (entries >> np.uint64(63)) & np.uint64(1)
            private = np.flatnonzero(mapped & ~(entries >> np.uint64(61)))
            present = bool(mapped.all())
        if private.size == 0:
            return present
        inner: List[int] = []
        for p in private.tolist():
            lo = start + p * PAGE
            hi = min(lo + PAGE, self.size)
            if lo >= offset and hi <= end:
                inner.append(p)
            else:
                self._reread(max(lo, offset), min(hi, end))
        if inner:
            lo = start + inner[0] * PAGE
            try:
                self.mm.madvise(mmap.MADV_DONTNEED, lo, start + (inner[-1] + 1) * PAGE - lo)
            except (OSError, ValueError):
                self._reread(lo, min(start + (inner[-1] + 1) * PAGE, end))
            return False
        return present

    def _reread(self, lo: int, hi: int) -> None:
        """Copies the file's bytes [lo, hi) into the mapping."""
        with open(self.path, "rb") as f:
            data = os.pread(f.fileno(), hi - lo, lo)
        self.base[lo : lo + len(data)] = np.frombuffer(data, dtype=np.uint8)

    def view(self, header: Any, owner: Any = None) -> np.ndarray:
        """The header's slot as an array; ``owner`` (an object whose lifetime marks the slot in use), when
        given, becomes the array's base, so views of it keep it alive."""
        dtype = WIRE_DTYPES.get(header.dtype)
        if dtype is None:
            raise ProtocolError(f"unknown dtype {header.dtype} in batch header")
        shape = tuple(int(d) for d in header.shape)
        offset, nbytes = int(header.shm.offset), int(header.nbytes)
        self.check(offset, nbytes)
        if not self.refresh(offset, nbytes):
            self.populate(offset, nbytes)
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else 0
        if expected != nbytes:
            raise ProtocolError(f"header announces {nbytes} bytes but shape {list(shape)} of {dtype} needs {expected}")
        if owner is None:
            return self.base[offset : offset + nbytes].view(dtype).reshape(shape)
        owner.__array_interface__ = {
            "version": 3,
            "shape": shape,
            "typestr": dtype.str,
            "data": (self.address + offset, False),
        }
        arr = np.asarray(owner)
        del owner.__array_interface__
        return arr


def _after_fork() -> None:
    # /proc/self/pagemap opened before the fork still reads the parent's page map.
    fd, Mapping._pagemap = Mapping._pagemap, -1
    if fd is not None and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _Slot:
    """Owns one GetClips reply's slot: the base of the reply's array (and of every view of it); when it is
    garbage-collected, nothing reads the slot any more and it can go back to the daemon."""

    __slots__ = ("mapping", "__array_interface__", "__weakref__")

    def __init__(self, mapping: Mapping):
        self.mapping = mapping


class ShmTransport(Transport):
    """Batches as views of the daemon's shared-memory arenas. ``release(arena, slots)`` calls ReleaseSlots.

    GetClips arenas stay mapped across replies (up to :data:`CACHED_MAPPINGS`, by path and size): the
    daemon hands a released arena to the next reply that fits (``reuse_arena``), and a mapping whose
    pages are already mapped is read at memory speed, where a fresh one pays a page fault per 64 KiB.
    Mappings of arenas the daemon has removed are dropped (their memory goes once nothing views them)."""

    name = "shm"

    def __init__(
        self,
        release: Callable[[str, List[int]], None],
        release_async: Optional[Callable[[str, List[int]], Any]] = None,
    ):
        self._release = release
        # GetClips releases go out without waiting for their answers (a gRPC future each), so a
        # request never waits on the round trip of the previous reply's release; their outcomes are
        # checked at the next flush (errors other than NotFound are raised there).
        self._release_async = release_async
        self._in_flight: List[Any] = []
        # GetClips slots whose arrays were garbage-collected, to release on the next call (a
        # finalizer may run on any thread at any moment, so it only records them).
        self._collected: List[Tuple[str, int]] = []
        self._lock = threading.Lock()
        self._maps: "OrderedDict[Tuple[str, int], Mapping]" = OrderedDict()
        # Whether this process has mapped one of the daemon's arenas: after that, an arena file the daemon
        # named and that is not there means the daemon went away (it removes its files as it shuts down),
        # not that its shared memory is out of this process's reach.
        self._mapped_any = False
        self._checked = 0.0
        # The process whose pruning thread runs (a forked child starts its own).
        self._pruner_pid = 0
        # When the last call was prepared: the pruning thread releases collected slots only for a client
        # idle since (a calling client releases them with its next call, ahead of it).
        self._last_call = 0.0

    def _collect(self, arena: str, slot: int) -> None:
        with self._lock:
            self._collected.append((arena, slot))

    def flush(self, wait: bool = False) -> None:
        """Releases the GetClips slots nothing views any more (``wait``: and waits for every release
        sent so far to be answered)."""
        with self._lock:
            todo, self._collected = self._collected, []
        if self._release_async is None:
            for arena, slot in todo:
                self._releaser(arena, slot)()
            return
        sent = [self._release_async(arena, [slot]) for arena, slot in todo]
        with self._lock:
            answered = [f for f in self._in_flight if wait or f.done()]
            self._in_flight = [f for f in self._in_flight if f not in answered] + sent
        if wait:
            answered += sent
            with self._lock:
                self._in_flight = [f for f in self._in_flight if f not in sent]
        for f in answered:
            try:
                f.result()
            except NotFound:
                pass  # expired already

    def _releaser(self, arena: str, slot: int) -> Callable[[], None]:
        def release() -> None:
            try:
                self._release(arena, [slot])
            except NotFound:
                pass  # the stream ended and its arena is gone already
            except ClientClosed:
                pass  # the stream ended with the client's channel: the daemon removed its arena

        return release

    def close(self) -> None:
        try:
            self.flush(wait=True)
        except Exception:
            pass  # the daemon expires unreleased replies on its own
        with self._lock:
            self._maps.clear()  # unmapped once no batch views them

    def prepare(self, request: Any) -> None:
        self._last_call = time.monotonic()
        self.flush()
        request.transport = pb.TRANSPORT_SHM
        if "reuse_arena" in request.DESCRIPTOR.fields_by_name:
            request.reuse_arena = True

    def _mapping(self, shm: Any) -> Mapping:
        """An arena's mapping (a GetClips reply's or a stream's): a cached one when this arena served an
        earlier reply or an earlier stream."""
        key = (shm.path, int(shm.arena_bytes))
        with self._lock:
            mapping = self._maps.get(key)
            now = time.monotonic()
            if mapping is None or now - self._checked > 1.0:
                # The daemon drops arenas (spare pool bounds, expiry): a mapping kept of a removed file
                # would hold its memory.
                self._checked = now
                for k in [k for k in self._maps if k != key and not os.path.exists(k[0])]:
                    del self._maps[k]
            if mapping is not None:
                self._maps.move_to_end(key)
                return mapping
        try:
            mapping = Mapping(shm.path)
        except ShmUnreachable as e:
            if self._mapped_any and getattr(e, "errno", None) == errno.ENOENT:
                raise Unavailable(
                    f"the daemon's shared memory {shm.path} is gone before this reply was read: the daemon shut "
                    "down or restarted (this process had read its shared memory before)"
                ) from None
            raise
        with self._lock:
            self._mapped_any = True
            self._maps[key] = mapping
            while len(self._maps) > CACHED_MAPPINGS:
                self._maps.popitem(last=False)
            if self._pruner_pid != os.getpid():
                self._pruner_pid = os.getpid()
                threading.Thread(
                    target=_prune, args=(weakref.ref(self),), name="vserve-shm-prune", daemon=True
                ).start()
        return mapping

    def _prune(self) -> bool:
        """Drops kept mappings whose arena file is gone, and releases the slots of replies garbage-collected
        since (a client that makes no further call, such as the one a dropped VideoDecoder read through,
        would otherwise hold them until the daemon's expiry); whether any mappings remain to watch."""
        with self._lock:
            mine = self._pruner_pid == os.getpid()
            gone = [k for k in self._maps if not os.path.exists(k[0])]
            for k in gone:
                del self._maps[k]
            if not self._maps:
                self._pruner_pid = 0  # the next mapping starts a new thread
            keep = bool(self._maps)
            collected = bool(self._collected)
        idle = time.monotonic() - self._last_call >= PRUNE_PERIOD
        if collected and mine and idle:
            try:
                self.flush()
            except Exception:
                pass  # the next call's flush sees it again; the daemon expires what stays unreleased
        return keep

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
        return self.reply(first.header)

    def reply(self, h: Any) -> Batch:
        """The batch of a GetClips reply header placed in shared memory."""
        try:
            mapping = self._mapping(h.shm)
        except ShmUnreachable:
            self._releaser(h.shm.arena, h.shm.slot)()  # its slot is free again at once, not at expiry
            raise
        owner = _Slot(mapping)
        array = mapping.view(h, owner)
        # The slot goes back once `owner` is garbage-collected: it is the base of the array and of every
        # view of it, so the array stays valid for as long as anything references it.
        weakref.finalize(owner, self._collect, h.shm.arena, h.shm.slot)
        return Batch(h, array)

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
        # The stream's arena is mapped through the same cache as GetClips replies: the daemon lends an
        # ended stream's arena to the next stream of the same shape (the next epoch), whose batches then
        # land in pages this process has already mapped.
        previous = None
        kept: List[Batch] = []
        release_failed: Optional[Unavailable] = None
        # The stream's own hold on its arena's mapping: the cache's pruner drops mappings of files the
        # daemon removed, and a daemon that exits removes the arena while batches it sent are still on
        # their way (they were lost, "gone before this reply was read": probe G).
        mapped: Optional[Mapping] = None
        mapped_key: Any = None
        try:
            for msg in messages:
                if not msg.HasField("header"):
                    if msg.data:
                        raise ProtocolError("inline bytes in a shared-memory stream")
                    continue
                h = msg.header
                if not h.HasField("shm"):
                    raise ProtocolError("batch without a shared-memory slot in a shared-memory stream")
                key = (h.shm.path, int(h.shm.arena_bytes))
                if mapped is None or key != mapped_key:
                    mapped, mapped_key = self._mapping(h.shm), key
                batch = Batch(h, mapped.view(h), releaser=self._releaser(h.shm.arena, h.shm.slot))
                if previous is not None and not previous._kept and release_failed is None:
                    try:
                        previous.release()
                    except Unavailable as e:
                        # A daemon shutting down takes no new call (its listener is closed) while the
                        # stream's last batches and its status are still on their way: read them, so
                        # the stream ends with the daemon's own status ("server is shutting down"),
                        # not this release's "connection refused". An ended stream's arena goes with
                        # it, released or not.
                        release_failed = e
                previous = batch
                yield batch
                _check_kept(kept, batch, h.shm.slots)
        finally:
            if previous is not None and not previous._kept:
                try:
                    previous.release()
                except Exception:
                    pass  # the call is being torn down; the daemon removes the arena with the stream


def _check_kept(kept: "List[Batch]", batch: Batch, slots: int) -> None:
    """Before a stream's next batch is read: every slot of its arena is held by a kept batch (``keep()``
    without ``release()``), so the daemon has nowhere to write the next one and the read would wait
    forever. Raises ResourceExhausted naming the fix instead. Nothing to check when the daemon does not
    say its slot count, or when ``batch`` was the last (the stream then ends without a slot)."""
    if batch._kept:
        kept.append(batch)
    kept[:] = [b for b in kept if b._releaser is not None]
    last = batch.batches_total is not None and batch.batch + 1 >= batch.batches_total
    if slots and len(kept) >= slots and not last:
        raise ResourceExhausted(
            f"every slot of this stream's shared-memory arena ({slots}) holds a kept batch, so the next "
            "batch has nowhere to go: release kept batches (Batch.release(), or Batch.detach() to keep a "
            "copy) before reading on, or keep fewer at once (a stream has prefetch + 3 slots)"
        )


def _prune(transport: "weakref.ReferenceType[ShmTransport]") -> None:
    """A transport's pruning thread: every PRUNE_PERIOD, drops its mappings of removed arenas; ends with
    the transport or once it keeps none."""
    while True:
        time.sleep(PRUNE_PERIOD)
        t = transport()
        if t is None or not t._prune():
            return
        del t


def is_local(addr: str) -> bool:
    """Whether the daemon runs on this host (a Unix socket or a loopback address): where shm can work."""
    if addr.startswith("unix:"):
        return True
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "127.0.0.1", "::1")


def select(
    kind: str,
    addr: str,
    release: Callable[[str, List[int]], None],
    release_async: Optional[Callable[[str, List[int]], Any]] = None,
) -> Transport:
    """The transport for ``Client(addr, transport=kind)``; ``release`` calls the daemon's ReleaseSlots
    (``release_async`` sends it and returns a future whose ``result()`` raises its VServeError)."""
    if kind not in TRANSPORTS:
        raise InvalidArgument(f"transport={kind!r}: expected one of {', '.join(map(repr, TRANSPORTS))}")
    if kind == "shm" or (kind == "auto" and addr.startswith("unix:")):
        return ShmTransport(release, release_async)
    return InlineTransport()
