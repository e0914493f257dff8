"""The client: one gRPC channel to one daemon, and a method per RPC.

``Client(addr)`` with addr ``unix:/path.sock``, ``host:port`` or ``https://host:port`` (TLS). Calls raise
:class:`~vserve_client.errors.VServeError` subclasses (never ``grpc.RpcError``); batch bytes arrive through
the transport chosen at construction (see :mod:`vserve_client.transport`).
"""

from __future__ import annotations

import atexit
import collections
import inspect
import ipaddress
import os
import threading
import warnings
import weakref
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Deque,
    Dict,
    Generator,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import grpc

from . import request as rq
from ._proto import vserve_pb2 as pb
from ._proto import vserve_pb2_grpc as pb_grpc
from .batch import Batch, message_to_dict
from .errors import (
    Cancelled,
    ClientClosed,
    InvalidArgument,
    OutOfRange,
    ShmUnreachable,
    VServeError,
    from_rpc_error,
)
from .transport import InlineTransport, ShmTransport, Transport, select

if TYPE_CHECKING:  # pragma: no cover
    from .decoder import VideoDecoder, VideoStreamMetadata

#: The largest message accepted or sent. The daemon sends 8 MiB chunks; headers of huge requests (per-clip
#: frame lists) are the other large messages.
MAX_MESSAGE_BYTES = 64 << 20

#: GetClips calls one :class:`Client` keeps in flight at most (its ``max_clips_in_flight`` by default);
#: later ones wait in the client, unsent (see :class:`ClipsFuture`). The daemon refuses a client's streaming
#: calls (GetClips, StreamBatches and CheckDataset together) past its ``--client-streams`` at once with
#: RESOURCE_EXHAUSTED ("32 streams in flight"): 32 by default (half of ``--max-streams`` 64), where a client
#: is a process on the Unix socket and an IP address on TCP. Clients are not told that limit, so this is
#: half of its default: room for the process's streams (a training stream, another Client) beside it,
#: and for a call the daemon still counts for a moment after its reply has arrived here.
MAX_CLIPS_IN_FLIGHT = 16


def _target(addr: str) -> Tuple[str, bool]:
    """The gRPC target of ``unix:/path.sock``, ``host:port``, ``http://host:port`` or ``https://host:port``,
    and whether it needs TLS."""
    if not isinstance(addr, str) or not addr:
        raise InvalidArgument(f"addr={addr!r}: expected unix:/path.sock or host:port")
    if addr.startswith("unix:"):
        if len(addr) == len("unix:"):
            raise InvalidArgument(f"addr={addr!r}: no socket path after 'unix:'")
        return addr, False
    secure = addr.startswith("https://")
    rest = addr
    for scheme in ("http://", "https://"):
        if rest.startswith(scheme):
            rest = rest[len(scheme) :]
    rest = rest.rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgument(f"addr={addr!r}: expected unix:/path.sock, host:port or https://host:port")
    return rest, secure


def _is_loopback(target: str) -> bool:
    """Whether a ``host:port`` target (or a Unix socket) stays on this host."""
    if target.startswith("unix:"):
        return True
    host = target.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _pem(tls_ca: Union[None, str, bytes, "os.PathLike[str]"]) -> Optional[bytes]:
    """The CA certificate(s): PEM bytes as given, or read from a file path."""
    if tls_ca is None or isinstance(tls_ca, bytes):
        return tls_ca
    try:
        with open(tls_ca, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgument(f"tls_ca={str(tls_ca)!r}: {e.strerror}") from None


#: The keyword arguments of :meth:`Client.get_clips`.
_GET_CLIPS_KEYWORDS = frozenset(
    (
        "size",
        "short_side",
        "crop",
        "flip",
        "dtype",
        "mean",
        "std",
        "layout",
        "rotate",
        "height",
        "width",
        "cache_policy",
    )
)


#: :meth:`Client.get_clips` keywords that say one thing in different ways: a request giving one of a
#: group replaces the common keywords' others (a request's own ``short_side`` with a common ``size`` was
#: refused as giving both: probe F).
_ALTERNATIVES = ({"size", "height", "width", "short_side"},)


def _with_common(common: Dict[str, Any], own: Dict[str, Any]) -> Dict[str, Any]:
    """A request's keywords over the common ones: its own win, alternatives to them included."""
    merged = dict(common)
    for group in _ALTERNATIVES:
        if group & own.keys():
            for k in group:
                merged.pop(k, None)
    merged.update(own)
    return merged


def _clips_item(item: Any, common: Dict[str, Any]) -> Tuple[str, Sequence[Any], Dict[str, Any]]:
    """One request of :meth:`Client.get_clips_many`: (dataset, clips, keywords)."""
    if isinstance(item, dict):
        rest = dict(item)
        try:
            dataset, clips = rest.pop("dataset"), rest.pop("clips")
        except KeyError as e:
            raise InvalidArgument(f"request {item!r}: missing {e.args[0]!r}") from None
        return dataset, clips, _with_common(common, rest)
    if isinstance(item, tuple) and len(item) in (2, 3):
        extra = item[2] if len(item) == 3 else {}
        if not isinstance(extra, dict):
            raise InvalidArgument(f"request {item!r}: the third item must be a dict of keywords")
        return item[0], item[1], _with_common(common, extra)
    raise InvalidArgument(
        f"request {item!r}: expected (dataset, clips), (dataset, clips, {{keywords}}) or a dict with dataset and clips"
    )


class _Answer:
    """A unary call's gRPC future whose ``result()`` raises VServeError instead of grpc.RpcError."""

    __slots__ = ("_f",)

    def __init__(self, f: Any):
        self._f = f

    def done(self) -> bool:
        return bool(self._f.done())

    def result(self) -> Any:
        try:
            return self._f.result()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None


# A ClipsFuture's request: waiting in its client (unsent), sent (a gRPC call), or done (collected,
# cancelled or failed).
_WAITING, _SENT, _DONE = "waiting", "sent", "done"


class _ClipsQueue:
    """The GetClips calls of one Client: at most ``limit`` sent and not yet collected (oldest first);
    later ones wait, unsent, and go out in order as earlier ones are collected or cancelled. Futures are
    held weakly: one dropped unread gives its place back (grpc cancels its garbage-collected call).
    ``lock`` guards every future's ``_state``, ``_call`` and ``_req``; it is never held while waiting for a
    reply or for a future's own lock."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()
        self._sent: "Deque[weakref.ref[ClipsFuture]]" = collections.deque()
        self._waiting: "Deque[weakref.ref[ClipsFuture]]" = collections.deque()

    def submit(self, f: "ClipsFuture") -> None:
        with self.lock:
            self._waiting.append(f._ref)
            self._pump()

    def _pump(self) -> None:
        """Sends waiting calls while there is room (lock held)."""
        if any(r() is None for r in self._sent):
            self._sent = collections.deque(r for r in self._sent if r() is not None)
        while self._waiting and len(self._sent) < self.limit:
            f = self._waiting.popleft()()
            if f is None:
                continue  # dropped before its turn: never sent
            f._start()
            if f._state == _SENT:
                self._sent.append(f._ref)

    def make_room(self, f: "ClipsFuture") -> "Optional[ClipsFuture]":
        """For a waiting ``f`` whose reply is wanted: None once it is sent (or done), else the oldest call
        in flight, for the caller to collect (its reply kept for its own ``result()``) so that ``f`` can
        go out: a thread that made more calls than ``limit`` and waits for a late one does not wait
        forever for places only its own collecting would free."""
        with self.lock:
            self._pump()
            if f._state != _WAITING:
                return None
            for r in self._sent:
                oldest = r()
                if oldest is not None:
                    return oldest
        raise AssertionError("unreachable: calls wait only while `limit` are in flight")

    def end(self, f: "ClipsFuture") -> Any:
        """Ends ``f`` (collected, cancelled): its place goes to the next waiting call. Returns its gRPC
        call when it was sent (for a cancel to cancel), else None."""
        with self.lock:
            call = f._call if f._state == _SENT else None
            if f._state == _WAITING:
                self._waiting.remove(f._ref)
            elif f._state == _SENT and f._ref in self._sent:
                self._sent.remove(f._ref)
            f._state, f._call, f._req = _DONE, None, None
            self._pump()
        return call

    def unsent(self, f: "ClipsFuture") -> bool:
        with self.lock:
            return f._state == _WAITING

    def close(self, error: VServeError) -> None:
        """Fails every waiting call with ``error``: its client was closed before its turn came."""
        with self.lock:
            for r in self._waiting:
                f = r()
                if f is not None:
                    f._error = error
                    f._state, f._req = _DONE, None
            self._waiting.clear()


class ClipsFuture:
    """A GetClips call (:meth:`Client.get_clips_async`). The request goes out when the future is made, or,
    while its client has ``max_clips_in_flight`` calls in flight (:data:`MAX_CLIPS_IN_FLIGHT`), waits in
    the client, unsent, and goes out in order as earlier calls are collected or cancelled, so that no call
    is refused for being one too many. :meth:`result` waits for the reply (first sending a waiting request,
    collecting the oldest call in flight to make room: its reply is kept for its own ``result()``) and
    returns its :class:`Batch` (the same object on every call), or raises the call's
    :class:`~vserve_client.errors.VServeError`. Thread-safe.

    GetClips is a server-streaming RPC (inline replies come in chunks), so the gRPC call completes only
    as its messages are read: ``done()`` says whether :meth:`result` has collected it (or it was
    cancelled), not whether the daemon has answered yet."""

    def __init__(
        self,
        queue: _ClipsQueue,
        transport: Transport,
        send: Callable[[Any], Any],
        request: Any,
        finish: rq.Finish,
        unreachable: Optional[Callable[[ShmUnreachable], bool]] = None,
    ):
        self._queue = queue
        self._transport = transport
        self._send = send
        self._unreachable = unreachable
        self._req: Any = request
        self._sent: Any = None
        self._call: Any = None
        self._state = _WAITING
        self._ref = weakref.ref(self)
        self._finish = finish
        self._lock = threading.Lock()
        self._batch: Optional[Batch] = None
        self._error: Optional[BaseException] = None
        self._cancelled = False

    def _start(self) -> None:
        """Sends the request (the queue's lock held); a failure to send becomes the call's error."""
        req, self._req = self._req, None
        self._sent = req
        try:
            self._call = self._send(req)
            self._state = _SENT
        except Exception as e:  # noqa: BLE001 - raised by result(), as the call's own errors are
            self._error = e
            self._state = _DONE

    def result(self) -> Batch:
        with self._lock:
            if self._batch is None and self._error is None:
                while True:
                    oldest = self._queue.make_room(self)
                    if oldest is None:
                        break
                    oldest._gather()
                if self._error is None:  # sent (not failed to send, nor closed before its turn)
                    self._collect()
            if self._error is not None:
                raise self._error
            assert self._batch is not None
            return self._batch

    def _gather(self) -> None:
        """Collects the reply, kept for :meth:`result`, unless done already (its place goes to a waiting call)."""
        with self._lock:
            if self._batch is None and self._error is None:
                self._collect()

    def _collect(self) -> None:
        try:
            try:
                self._batch = self._read(self._call)
            except ShmUnreachable as e:
                if self._unreachable is None or not self._unreachable(e):
                    raise
                self._call = self._send(self._sent)  # again, inline
                self._batch = self._read(self._call)
        except VServeError as e:
            self._error = e
        finally:
            self._queue.end(self)

    def _read(self, call: Any) -> Batch:
        def messages() -> Generator[Any, None, None]:
            try:
                for msg in call:
                    yield msg
            except grpc.RpcError as e:
                raise from_rpc_error(e) from None

        it = messages()
        try:
            batch = self._transport.one(it)
            return batch._finish(self._finish) if self._finish.needed else batch
        finally:
            it.close()
            call.cancel()  # a no-op once the call has finished

    def exception(self) -> Optional[BaseException]:
        """The call's error (waiting for the reply), or None when it succeeded."""
        try:
            self.result()
        except VServeError as e:
            return e
        return None

    def done(self) -> bool:
        return self._batch is not None or self._error is not None

    def cancel(self) -> bool:
        """Cancels the call unless its reply was collected already (then returns False); a request still
        waiting in the client is never sent. ``result()`` then raises :class:`~vserve_client.errors.Cancelled`."""
        with self._lock:
            if self.done():
                return self._cancelled
            self._cancelled = True
            self._error = Cancelled("the GetClips call was cancelled by the client", "CANCELLED")
            call = self._queue.end(self)
            if call is not None:
                call.cancel()
            return True

    def cancelled(self) -> bool:
        return self._cancelled

    def _drop(self, collect: bool) -> None:
        """Ends a call nobody will read: a waiting one is never sent; a sent one is collected and its reply
        dropped when ``collect`` (shared memory: a cancelled call's reply may already sit in an arena slot
        nobody would release), else cancelled."""
        if collect and not self._queue.unsent(self):
            try:
                self.result()
            except Exception:  # noqa: BLE001 - an abandoned reply's error is nobody's to raise
                pass
        else:
            self.cancel()


class BatchStream:
    """The batches of one StreamBatches call (an iterator). ``close()`` (or leaving a ``with`` block, or
    dropping it) cancels the call, so the daemon stops preparing batches."""

    def __init__(self, batches: Iterator[Batch], close: Any):
        self._batches = batches
        self._close = close

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> Batch:
        return next(self._batches)

    def close(self) -> None:
        self._close()

    def __enter__(self) -> "BatchStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to cancel
            pass


# Clients not closed yet: closed at interpreter exit, before finalization (see _close_open_clients).
_OPEN: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _close_open_clients() -> None:
    """Closes every client still open when the interpreter exits: waits for the shared-memory releases
    in flight (and sends those of replies still held), then closes the channel, so no gRPC call is left
    without a status. Left to interpreter finalization, a call still open there is cancelled by its
    garbage-collected ``_Rendezvous.__del__`` after grpcio's threads may have been stopped holding its
    lock: the process then hangs at exit (seen with grpcio 1.85.3, docs/BENCHMARKS.md)."""
    for c in list(_OPEN):
        if c._pid != os.getpid():
            continue  # inherited through fork: its channel belongs to the parent
        try:
            c.close()
        except Exception:
            pass  # the daemon expires what was not released


atexit.register(_close_open_clients)



def _classes(dataset: str, class_to_idx: Dict[str, int]) -> List[str]:
    """torchvision's ``classes`` for ``class_to_idx`` (sorted by index): the label of each label index,
    a gap (integer labels 0, 2, 5) named as the integer label it would be, so that
    ``classes[label_index]`` is the label."""
    size = max(class_to_idx.values(), default=-1) + 1
    if size > 16 * len(class_to_idx) + 65536:
        warnings.warn(
            f"dataset {dataset!r}: its {len(class_to_idx)} integer labels run up to {size - 1}; classes lists "
            "them in index order, not indexed by label_index (look labels up in class_to_idx)",
            stacklevel=3,
        )
        return list(class_to_idx)
    classes = [str(i) for i in range(size)]
    for name, i in class_to_idx.items():
        if i >= 0:
            classes[i] = name
    return classes

class Client:
    """A connection to a vserve daemon.

    Args:
        addr: ``unix:/path/to.sock`` or ``host:port``.
        transport: ``"auto"`` (shared memory for a Unix socket address, else inline), ``"shm"`` (batches
            are views of the daemon's /dev/shm arenas; see :mod:`vserve_client.transport`) or ``"inline"``
            (bytes in the gRPC messages).
        token: sent as ``authorization: Bearer <token>`` with every call (daemons started with
            ``--auth-token-file`` require it on TCP listeners).
        tls_ca: for ``https://host:port``: the CA certificate that signed the daemon's certificate, as PEM
            bytes or a file path (None: the system's roots).
        timeout: seconds allowed for each unary call and each GetClips (None: no limit). Streams have none.
        max_clips_in_flight: GetClips calls sent and not yet collected, at most (:data:`MAX_CLIPS_IN_FLIGHT`);
            later ones wait in the client, unsent, as :meth:`get_clips_async` says. The daemon refuses more
            than ``--client-streams`` streaming calls of one client at once (32 by default): raise it only
            for a daemon started with more.
    """

    def __init__(
        self,
        addr: str,
        transport: str = "auto",
        token: Optional[str] = None,
        *,
        tls_ca: Union[None, str, bytes, "os.PathLike[str]"] = None,
        timeout: Optional[float] = None,
        max_clips_in_flight: int = MAX_CLIPS_IN_FLIGHT,
    ):
        self.addr = addr
        self._clips = _ClipsQueue(rq.uint("max_clips_in_flight", max_clips_in_flight, 1))
        self._transport: Transport = select(transport, addr, self._release_slots, self._release_slots_async)
        self._auto = transport == "auto"
        self._switch = threading.Lock()
        self._timeout = timeout
        target, secure = _target(addr)
        if token and not secure and not _is_loopback(target):
            # A bearer token in clear text over the network is a token given away.
            raise InvalidArgument(
                f"addr={addr!r}: refusing to send the token over an unencrypted connection to another host; "
                "use https://host:port (the daemon's --tls-cert) or a Unix socket"
            )
        self._metadata = (("authorization", f"Bearer {token.strip()}"),) if token else None
        options: List[Tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # HTTP/2 pings every 5 s, answered within 10 s, also while a call waits for data: a peer that
            # accepts connections and never answers (a hung process, something else on the port) ends
            # the call UNAVAILABLE instead of leaving it waiting forever. A busy daemon answers pings at
            # once, so long calls are not cut.
            ("grpc.keepalive_time_ms", 5_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # After the daemon goes away, try to connect again every 100 ms at first and never less often
            # than every second: gRPC's default backoff grows to 120 s, and a call made while it waits
            # fails at once, so a daemon restarted after a minute stayed unreachable for a minute more.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
        ]
        if target.startswith("unix:"):
            # gRPC core sends the socket path as the HTTP/2 :authority, which the daemon's HTTP stack
            # rejects as malformed (RST_STREAM, PROTOCOL_ERROR); a host name is what it expects.
            options.append(("grpc.default_authority", "localhost"))
        if secure:
            creds = grpc.ssl_channel_credentials(root_certificates=_pem(tls_ca))
            self._channel = grpc.secure_channel(target, creds, options=options)
        elif tls_ca is not None:
            raise InvalidArgument(f"tls_ca given but addr={addr!r} is not https://host:port")
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._stub = pb_grpc.VServeStub(self._channel)
        self._pid = os.getpid()
        self._closed = False
        _OPEN.add(self)

    @property
    def transport(self) -> str:
        """The transport in use: ``"inline"`` or ``"shm"``."""
        return self._transport.name

    def close(self) -> None:
        """Releases the shared-memory replies nothing views any more (waiting for the daemon's answers)
        and closes the channel; calls made after it raise :class:`~vserve_client.errors.ClientClosed`.
        Clients still open at interpreter exit are closed then. Closing twice is a no-op."""
        _OPEN.discard(self)
        if self._pid != os.getpid():
            self._closed = True
            return  # inherited through fork: the channel and the replies are the parent's
        if self._closed:
            return
        self._transport.close()  # its releases are calls of this client: made before it counts as closed
        self._closed = True
        self._clips.close(self._closed_error())
        self._channel.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self) -> None:
        """Releases the shared-memory replies nothing views any more now, rather than at the next call."""
        self._check_process()
        self._transport.flush()

    def _check_process(self) -> None:
        """Refuses a call from a process this client was not opened in: a fork's child inherits the
        channel (whose gRPC threads and locks do not survive fork) and the parent's pending releases
        (arenas the daemon lets only the parent release). Refuses a call on a closed client
        (:class:`~vserve_client.errors.ClientClosed`, rather than grpc's "Channel closed" ValueError)."""
        if self._pid != os.getpid():
            raise InvalidArgument(
                f"this Client was opened in process {self._pid} and is used in process {os.getpid()} (a "
                "fork, e.g. a DataLoader worker): open a Client in each process (VideoDecoder given the "
                "address string does; vserve_client.torch.VideoClipDataset does)"
            )
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> ClientClosed:
        return ClientClosed(f"this Client of {self.addr} is closed (Client.close() was called): open a new Client")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> Dict[str, Any]:
        raise TypeError(
            "a vserve_client.Client holds a gRPC channel and cannot be pickled; create one per process "
            "(vserve_client.torch.VideoClipDataset does)"
        )

    # -- unary calls ------------------------------------------------------------------------------------

    def _unary(self, method: Any, req: Any) -> Any:
        self._check_process()
        try:
            return method(req, metadata=self._metadata, timeout=self._timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except ValueError:
            if self._closed:  # closed by another thread since the check
                raise self._closed_error() from None
            raise

    def probe(
        self, dataset: str, video: str, include_pts: bool = False, stream: Optional[int] = None
    ) -> Dict[str, Any]:
        """Stream facts and frame table of one video: codec, width/height (stored), display_width/height,
        rotation (clockwise), mirrored, avg_fps, time_base {num, den}, duration_seconds, frame_count, keyframes, pts and
        durations (per frame, in the time base; with include_pts), stream, pixel_format, declared_frames.
        :meth:`metadata` gives the same facts under TorchCodec's names."""
        req = pb.ProbeRequest(
            dataset=rq.text("dataset", dataset), video=rq.text("video", video), include_pts=include_pts
        )
        if stream is not None:
            req.stream = rq.uint("stream", stream)
        return message_to_dict(self._unary(self._stub.Probe, req))

    def metadata(self, dataset: str, video: str, stream: Optional[int] = None) -> "VideoStreamMetadata":
        """One video's stream facts as TorchCodec's ``VideoStreamMetadata`` names them (``num_frames``,
        ``average_fps``, ``begin_stream_seconds``, ``end_stream_seconds``, ``duration_seconds``, ...)."""
        from .decoder import VideoStreamMetadata

        return VideoStreamMetadata.from_probe(self.probe(dataset, video, include_pts=True, stream=stream))

    def decoder(self, dataset: str, video: str, **kwargs: Any) -> "VideoDecoder":
        """A :class:`~vserve_client.decoder.VideoDecoder` (TorchCodec's API) for one video of a dataset."""
        from .decoder import VideoDecoder

        return VideoDecoder(self, dataset, video, **kwargs)

    def list_datasets(self, *, labels: bool = True) -> List[Dict[str, Any]]:
        """The datasets served: dicts with name, root, video_count, samples (what StreamBatches draws
        from: manifest rows, else the videos found), building (the daemon's walk of the root is under
        way: until the first completes, the counts are of the videos found so far),
        samples_fingerprint, and, as torchvision's ``ImageFolder`` names them, classes (the labels,
        indexed by label index) and class_to_idx (label -> label index). Integer labels are their own
        indices, so with gaps (labels 0, 2, 5) ``classes`` has one entry per index up to the largest, a gap
        named as the integer label it would be: ``classes[label_index]`` is always the label.
        (Integer labels spread far wider than there are labels, as ids up to a billion, are listed in
        index order instead, with a warning.) ``labels=False`` leaves the last two out and the daemon does
        not send them (a million distinct labels are an 18 MB reply)."""
        return self._datasets(pb.ListDatasetsRequest(omit_labels=not labels), labels)

    def dataset_info(self, dataset: str, *, labels: bool = True) -> Dict[str, Any]:
        """:meth:`list_datasets`' entry for one dataset, asked alone (NotFound when the daemon does not
        serve it)."""
        rq.text("dataset", dataset)
        return self._datasets(pb.ListDatasetsRequest(dataset=dataset, omit_labels=not labels), labels)[0]

    def _datasets(self, request: Any, labels: bool) -> List[Dict[str, Any]]:
        reply = self._unary(self._stub.ListDatasets, request)
        out = []
        for d in reply.datasets:
            info = message_to_dict(d)
            if labels:
                info["class_to_idx"] = dict(sorted(info["class_to_idx"].items(), key=lambda kv: (kv[1], kv[0])))
                info["classes"] = _classes(info["name"], info["class_to_idx"])
            else:
                del info["class_to_idx"]
            out.append(info)
        return out

    def _release_slots(self, arena: str, slots: List[int]) -> None:
        self._unary(self._stub.ReleaseSlots, pb.ReleaseSlotsRequest(arena=arena, slots=slots))

    def _release_slots_async(self, arena: str, slots: List[int]) -> "_Answer":
        self._check_process()
        req = pb.ReleaseSlotsRequest(arena=arena, slots=slots)
        try:
            return _Answer(self._stub.ReleaseSlots.future(req, metadata=self._metadata, timeout=self._timeout))
        except ValueError:
            if self._closed:
                raise self._closed_error() from None
            raise

    def reload(self) -> Dict[str, Any]:
        """Makes the daemon walk its dataset roots again and re-read its manifests now (as SIGHUP does);
        returns when done: dict with datasets (as :meth:`list_datasets` gives them, without classes),
        changed (names of datasets whose lists changed) and errors (what could not be reloaded)."""
        return message_to_dict(self._unary(self._stub.Reload, pb.ReloadRequest()))

    def stats(self) -> Dict[str, Any]:
        """The daemon's counters since start-up (frames_decoded, cache_hits, requests, ...)."""
        return message_to_dict(self._unary(self._stub.GetStats, pb.GetStatsRequest()))

    # -- batches ----------------------------------------------------------------------------------------

    def _messages(self, method: Any, req: Any, timeout: Optional[float]) -> Generator[Any, None, None]:
        """The reply messages of a server-streaming call; errors become VServeError; closing cancels."""
        try:
            call = method(req, metadata=self._metadata, timeout=timeout)
        except ValueError:
            if self._closed:
                raise self._closed_error() from None
            raise
        try:
            for msg in call:
                yield msg
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()  # a no-op once the call has finished

    def get_clips(
        self,
        dataset: str,
        clips: Sequence[Any],
        *,
        size: Optional[rq.SizeArg] = None,
        short_side: Optional[int] = None,
        crop: Optional[rq.SizeArg] = None,
        flip: bool = False,
        dtype: Any = "uint8",
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        layout: str = "THWC",
        rotate: bool = True,
        height: Optional[int] = None,
        width: Optional[int] = None,
        cache_policy: str = "auto",
    ) -> Batch:
        """Decodes explicit clips into one array ``[clips, T, H, W, 3]`` (THWC; or TCHW, CTHW).

        ``clips``: ``(video, [frame indices])`` or ``(video, {"times": [seconds]})`` items (a dict may add
        ``"stream": N``), or dicts ``{"video": path, "frames": [...]}`` / ``{"video": path, "times": [...]}``. ``size=(height, width)`` (or ``height=``/``width=``) or ``short_side=N`` resizes
        (bilinear), ``crop=(height, width)`` centre-crops after it, ``flip`` mirrors, ``dtype`` "uint8" |
        "float16" | "float32" | "bfloat16" (floats are ``(x/255 - mean) / std`` per channel), ``layout``
        "THWC" | "TCHW" | "CTHW", ``rotate=False`` keeps the stored orientation. ``cache_policy``
        "auto" | "one_pass" | "keep": whether the decoded frames may enter the daemon's frame cache
        ("auto": unless the request's frames of one video are a scan; "one_pass" for frames read once,
        such as a pass over every frame of a dataset, so they do not displace other jobs' cached frames).

        One request at a time waits for each reply before sending the next: :meth:`get_clips_many` (or
        :meth:`get_clips_async`) keeps several in flight.
        """
        return self.get_clips_async(
            dataset,
            clips,
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
            cache_policy=cache_policy,
        ).result()

    def get_clips_async(self, dataset: str, clips: Sequence[Any], **kwargs: Any) -> "ClipsFuture":
        """:meth:`get_clips`, without waiting: the request goes out now and the daemon starts on it; the
        returned :class:`ClipsFuture`'s ``result()`` waits for the reply and gives its :class:`Batch`
        (or raises the call's error). Takes :meth:`get_clips`' keyword arguments.

        Each call in flight is one of the daemon's streaming calls, which it limits per client process
        (``--client-streams``, 32 by default, RESOURCE_EXHAUSTED past it): this client keeps at most
        ``max_clips_in_flight`` (:data:`MAX_CLIPS_IN_FLIGHT`, 16) sent and not yet collected, and a
        request made while that many are holds its place in the client, unsent, until an earlier one is
        collected or cancelled (:class:`ClipsFuture`). A shared-memory reply holds its arena slot from
        the moment the daemon makes it: collect every future's ``result()`` and drop the batch when done.
        A future dropped unread, or cancelled after the daemon made its reply, leaves that slot to the
        daemon's expiry (60 s, counted against this client's shared-memory budget meanwhile)."""
        unknown = set(kwargs) - _GET_CLIPS_KEYWORDS
        if unknown:
            raise TypeError(f"get_clips_async() got unexpected keyword arguments {sorted(unknown)}")
        req = rq.get_clips_request(dataset, clips, **kwargs)
        finish = rq.finish_of(kwargs.get("dtype", "uint8"), kwargs.get("layout", "THWC"))
        self._check_process()
        future = ClipsFuture(self._clips, self._transport, self._send_clips, req, finish, self._shm_unreachable)
        self._clips.submit(future)
        return future

    def _send_clips(self, req: "pb.GetClipsRequest") -> Any:
        """Sends a GetClips request whose turn has come (:class:`_ClipsQueue`): its gRPC call."""
        self._check_process()
        self._transport.prepare(req)
        try:
            return self._stub.GetClips(req, metadata=self._metadata, timeout=self._timeout)
        except ValueError:
            if self._closed:
                raise self._closed_error() from None
            raise

    def get_clips_many(
        self, requests: Iterable[Any], *, max_in_flight: int = 4, **common: Any
    ) -> Generator[Batch, None, None]:
        """The replies of many GetClips requests, in the order of ``requests``, with up to
        ``max_in_flight`` of them in flight at once: the daemon's decode threads stay busy while this
        process consumes earlier replies, so one clip per request runs about as fast as many per request.
        ``max_in_flight`` is capped at the client's ``max_clips_in_flight`` (:data:`MAX_CLIPS_IN_FLIGHT`),
        under the daemon's limit per client (``--client-streams``), so no request is refused for being
        one too many.

        Each request is ``(dataset, clips)``, ``(dataset, clips, {keyword: value})`` or a dict with
        ``dataset``, ``clips`` and any of :meth:`get_clips`' keywords; ``common`` keywords apply to every
        request (a request's own keywords win, over their alternatives too: its ``short_side`` replaces a
        common ``size``). ``requests`` is read lazily (it may be a generator).

        A failed request raises its error when its turn comes, after the replies before it were yielded.
        Leaving early (``break``, an error, closing the generator) collects the replies still in flight
        so their shared-memory slots go back to the daemon at once (inline ones are cancelled).
        """
        if int(max_in_flight) < 1:
            raise InvalidArgument(f"max_in_flight={max_in_flight!r}: expected at least 1")
        max_in_flight = min(int(max_in_flight), self._clips.limit)
        pending: Deque[ClipsFuture] = collections.deque()
        source = iter(requests)
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) < max_in_flight:
                    try:
                        item = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    dataset, clips, kwargs = _clips_item(item, common)
                    pending.append(self.get_clips_async(dataset, clips, **kwargs))
                if not pending:
                    return
                # Taken off the queue first: the consumer holds the only reference to the batch, so its
                # slot goes back as soon as the consumer drops it.
                yield pending.popleft().result()
        finally:
            self._abandon(pending)

    def _abandon(self, futures: "Deque[ClipsFuture]") -> None:
        """Ends calls nobody will read: those still waiting in the client are never sent; inline ones are
        cancelled; shared-memory ones are collected and dropped (a cancelled call's reply may already sit
        in an arena slot nobody would release), and their slots released now."""
        for f in futures:
            if self._clips.unsent(f):
                f.cancel()
        while futures:
            f = futures.popleft()
            f._drop(collect=self._transport.name == "shm")
            del f
        try:
            self._transport.flush()  # type: ignore[attr-defined]
        except AttributeError:
            pass
        except Exception:  # noqa: BLE001 - the daemon expires unreleased replies on its own
            pass

    def stream(self, dataset: str, **kwargs: Any) -> BatchStream:
        """One rank's share of one epoch, as batches sampled, shuffled and transformed by the daemon.

        Keyword arguments (defaults in brackets), TorchCodec's sampler names and torchvision's transforms:
        - sampler ["random-indices"] | "regular-indices" | "random-timestamps" | "regular-timestamps"
          (TorchCodec's ``clips_at_*``); num_clips [1], num_frames_per_clip [1],
          num_indices_between_frames [1], seconds_between_frames, seconds_between_clip_starts,
          sampling_range_start, sampling_range_end, policy ["repeat_last"] | "wrap" | "error" | "skip"
          ("error": raise OutOfRange at the batch holding a clip that runs past its video's end; "skip":
          replace that sample and report it);
        - the transform of :meth:`get_clips` (size, short_side, crop, flip, dtype, mean, std, layout,
          rotate, height, width), plus per-clip augmentation: random_crop=(h, w), random_resized_crop=(h, w)
          or {"size": (h, w), "scale": (lo, hi), "ratio": (lo, hi)}, random_hflip [False];
        - batch_size (required), drop_last [False], seed [0], epoch [0], rank [0], world_size [1],
          start_batch [0] (resume: the next batch after the last one consumed), start_sample [0] (resume
          after a change of world size: samples of the epoch's order already consumed by all ranks),
          prefetch [2], shuffle [True], shard_remainder ["uneven"] | "pad" | "drop", on_error ["skip"] | "fail".
        - cache_policy ["auto"] | "one_pass" | "keep": whether the decoded frames may enter the daemon's
          frame cache (as in :meth:`get_clips`; each sample's frames are judged alone).

        vserve 0.1's sampler names (clips_per_video, frames_per_clip, frame_stride, range_start,
        range_end, short_video) still work, with a DeprecationWarning.

        Also ``worker=(w, n)``: only the batches of data-loader worker w of n (see :mod:`vserve_client.workers`).
        """
        worker = kwargs.pop("worker", None)
        kwargs = rq.rename_deprecated(kwargs)
        req = rq.stream_request(dataset, **kwargs)
        finish = rq.finish_of(kwargs.get("dtype", "uint8"), kwargs.get("layout", "THWC"))
        policy_error = rq.policy_of(kwargs) == "error"
        if worker is not None:
            try:
                w, n = worker
                w, n = rq.uint("worker", w), rq.uint("worker", n)
            except (TypeError, ValueError):
                w = n = 0
            if not w < n:
                raise InvalidArgument(f"worker={worker!r}: expected (w, n), ints with 0 <= w < n <= {rq.UINT32_MAX}")
            req.worker = w
            req.num_workers = n
        return self._open_stream(req, finish, policy_error)

    # help(Client.stream) and IDEs that read signatures show every keyword stream_request takes.
    stream.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("dataset", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str),
            *[
                p
                for p in list(inspect.signature(rq.stream_request).parameters.values())[1:]
                if p.kind is not inspect.Parameter.VAR_KEYWORD
            ],
            inspect.Parameter("worker", inspect.Parameter.KEYWORD_ONLY, default=None),
        ],
        return_annotation=BatchStream,
    )

    def _open_stream(
        self, req: "pb.StreamBatchesRequest", finish: Optional[rq.Finish] = None, policy_error: bool = False
    ) -> BatchStream:
        self._check_process()
        self._transport.prepare(req)
        calls = [self._messages(self._stub.StreamBatches, req, None)]
        batches = self._transport.batches(calls[0])
        if self._auto and isinstance(self._transport, ShmTransport):
            batches = self._inline_if_unreachable(batches, req, calls)
        if (finish is not None and finish.needed) or policy_error:
            batches = _finished(batches, finish, policy_error)
        return BatchStream(batches, lambda: calls[-1].close())

    def _shm_unreachable(self, e: ShmUnreachable) -> bool:
        """A reply this process could not map (:class:`ShmUnreachable`): with ``transport="auto"`` the
        client uses inline from now on (warning once) and the call is to be sent again; otherwise False
        (the error is the call's)."""
        if not self._auto:
            return False
        with self._switch:
            if isinstance(self._transport, ShmTransport):
                shm, self._transport = self._transport, InlineTransport()
                warnings.warn(
                    f"vserve_client: {e}; this Client of {self.addr} (transport='auto') receives inline from now on",
                    RuntimeWarning,
                    stacklevel=4,
                )
                shm.close()  # sends what it still had to release
        return True

    def _inline_if_unreachable(self, batches: Iterator[Batch], req: Any, calls: List[Any]) -> Iterator[Batch]:
        """A stream's batches; when its first cannot be mapped (:meth:`_shm_unreachable`), the stream is
        cancelled and opened again inline: the same request gives the same batches."""
        try:
            first = next(batches)
        except StopIteration:
            return
        except ShmUnreachable as e:
            calls[0].close()
            if not self._shm_unreachable(e):
                raise
            self._transport.prepare(req)
            calls.append(self._messages(self._stub.StreamBatches, req, None))
            yield from self._transport.batches(calls[-1])
            return
        yield first
        yield from batches


def _finished(batches: Iterator[Batch], finish: Optional[rq.Finish], policy_error: bool) -> Iterator[Batch]:
    """A stream's batches with the client-side finish applied, and policy "error" enforced: the batch
    that reports a too-short sample raises instead of being yielded."""
    for batch in batches:
        if policy_error:
            short = [s for s in batch.skipped if s["code"] == "TOO_SHORT"]
            if short:
                batch.release()
                s = short[0]
                raise OutOfRange(
                    f"policy='error': sample {s['sample']} ({s['video']!r}) is too short: {s['message']}"
                )
        yield batch._finish(finish) if finish is not None and finish.needed else batch
