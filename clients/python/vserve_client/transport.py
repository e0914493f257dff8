"""How a batch's bytes reach this process: the one place that differs between transports.

gRPC is the control plane for every transport; a transport decides (1) what it adds to a request (a
shared-memory transport will ask for a slot in a /dev/shm arena) and (2) how it turns the reply messages
into :class:`~vserve_client.batch.Batch` objects.

- ``inline``: the array's bytes travel inside the reply messages, in chunks (the daemon sends 8 MiB
  chunks); the client copies them into one preallocated array per batch.
- ``shm`` (planned, issue 4): the daemon writes each batch into a slot of a per-stream arena; the message
  carries the slot, never the pixels; the client maps the arena once and hands out numpy views. Not served by
  the daemon yet: asking for it raises :class:`~vserve_client.errors.Unimplemented`.
- ``auto``: shm when the daemon is on this host and offers it, else inline. Inline for now.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from .batch import Batch, assemble_batches, assemble_one
from .errors import InvalidArgument, Unimplemented

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


def is_local(addr: str) -> bool:
    """Whether the daemon runs on this host (a Unix socket or a loopback address): where shm can work."""
    if addr.startswith("unix:"):
        return True
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "127.0.0.1", "::1")


def select(kind: str, addr: str) -> Transport:
    """The transport for ``Client(addr, transport=kind)``."""
    if kind not in TRANSPORTS:
        raise InvalidArgument(f"transport={kind!r}: expected one of {', '.join(map(repr, TRANSPORTS))}")
    if kind == "shm":
        raise Unimplemented(
            "transport='shm': the shared-memory transport is not available yet (the daemon serves inline "
            "bytes only); use transport='inline' or 'auto'"
        )
    # "auto": shared memory will be chosen here when is_local(addr) and the daemon offers it.
    return InlineTransport()
