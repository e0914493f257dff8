"""Errors: one class per gRPC status, all under :class:`VServeError`.

The daemon maps its failures to statuses at its edge (DESIGN.md): bad request -> INVALID_ARGUMENT, unknown
dataset or video -> NOT_FOUND, path outside a dataset -> PERMISSION_DENIED, frame past the end ->
OUT_OF_RANGE, overload -> RESOURCE_EXHAUSTED, shutting down -> UNAVAILABLE, corrupt media -> DATA_LOSS,
bugs -> INTERNAL. The client turns each status back into the matching class here, so callers write
``except vserve_client.NotFound`` instead of inspecting ``grpc.RpcError`` codes.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Type

import grpc


class VServeError(Exception):
    """A call failed. ``code`` is the gRPC status name (``"NOT_FOUND"``), ``message`` the daemon's text."""

    #: The status name this class stands for; instances carry the actual one in ``self.code``.
    code_name = "UNKNOWN"

    def __init__(self, message: str, code: Optional[str] = None):
        self.code = code or self.code_name
        self.message = message
        super().__init__(f"{self.code}: {message}")

    def __reduce__(self) -> Tuple[Any, ...]:
        # Pickles (e.g. from a DataLoader worker) as the same class with the same code and message.
        return (type(self), (self.message, self.code))


class Cancelled(VServeError):
    code_name = "CANCELLED"


class Unknown(VServeError):
    code_name = "UNKNOWN"


class InvalidArgument(VServeError, ValueError):
    code_name = "INVALID_ARGUMENT"


class DeadlineExceeded(VServeError):
    code_name = "DEADLINE_EXCEEDED"


class NotFound(VServeError, LookupError):
    code_name = "NOT_FOUND"


class AlreadyExists(VServeError):
    code_name = "ALREADY_EXISTS"


class PermissionDenied(VServeError, PermissionError):
    code_name = "PERMISSION_DENIED"


class ResourceExhausted(VServeError):
    code_name = "RESOURCE_EXHAUSTED"


class FailedPrecondition(VServeError):
    code_name = "FAILED_PRECONDITION"


class Aborted(VServeError):
    code_name = "ABORTED"


class OutOfRange(VServeError, IndexError):
    code_name = "OUT_OF_RANGE"


class Unimplemented(VServeError, NotImplementedError):
    code_name = "UNIMPLEMENTED"


class Internal(VServeError):
    code_name = "INTERNAL"


class Unavailable(VServeError, ConnectionError):
    code_name = "UNAVAILABLE"


class DataLoss(VServeError):
    code_name = "DATA_LOSS"


class Unauthenticated(VServeError):
    code_name = "UNAUTHENTICATED"


class ClientClosed(FailedPrecondition, ValueError):
    """A call on a :class:`~vserve_client.Client` after its ``close()`` (or the end of its ``with`` block):
    raised by the client, nothing was sent. A ``ValueError`` too, as Python's I/O on a closed file is."""


class ProtocolError(Internal):
    """The daemon's reply broke the wire contract (chunks out of order, wrong size, no header)."""


class ShmUnreachable(ProtocolError):
    """This process cannot open the daemon's shared-memory file: the daemon runs on another host, in
    another container (another /dev/shm), or as a user whose files this one may not read. A client
    opened with ``transport="auto"`` then sends the call again inline and uses inline from then on."""

    #: The ``errno`` of the failed open, when it was one (``ENOENT``: no such file here).
    errno: Optional[int] = None


_BY_CODE: Dict[grpc.StatusCode, Type[VServeError]] = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNKNOWN: Unknown,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


def error_class(code: grpc.StatusCode) -> Type[VServeError]:
    """The class standing for a gRPC status code (:class:`Unknown` for codes without one)."""
    return _BY_CODE.get(code, Unknown)


def from_rpc_error(err: grpc.RpcError) -> VServeError:
    """The :class:`VServeError` for a failed call, keeping the status name and the daemon's message."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else None
    if not isinstance(code, grpc.StatusCode):
        return Unknown(str(err))
    cls = error_class(code)
    return cls(details or "", code=code.name)
