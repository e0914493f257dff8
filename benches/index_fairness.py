#!/usr/bin/env python3
"""index_fairness: how long one client waits for a video while another client's index builds queue.

Client A (one process) asks frame 0 of 13 unindexed 900k-frame videos, all 13 requests in flight; 0.5 s
later client B (another process) asks frame 0 of a small video, once unindexed ("cold": it needs a build
of its own) and, with a fresh daemon, once already indexed ("warm": indexed by B just before A starts).
Prints B's wait, A's total and one long build's time, per binary (alternated per round). Before
index-build places went round the clients (probe P, F4), B waited for all of A's builds either way::

    target/py-venv/bin/python benches/index_fairness.py --vserve OLD/vserve --vserve target/release/vserve

The corpus (13 copies of a 32x32, 1000 fps, 900-second H.264 video, 17 MB each, and nasa_13013.mp4 from
../shared/media) is made once in target/bench-corpus/index-fairness (ffmpeg, about 20 s).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "clients" / "python"))

import reference  # noqa: E402

LONG = 13


def corpus() -> Path:
    root = HERE.parent / "target" / "bench-corpus" / "index-fairness"
    if (root / f"long{LONG - 1:02d}.mp4").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    base = root / "base.tmp.mp4"
    run = ["ffmpeg", "-v", "error", "-y"]
    subprocess.run(run + ["-f", "lavfi", "-i", "testsrc=size=32x32:rate=1000", "-t", "90",
                          "-c:v", "libx264", "-preset", "ultrafast", "-g", "250", str(base)], check=True)  # fmt: skip
    first = root / "long00.mp4"
    subprocess.run(run + ["-stream_loop", "9", "-i", str(base), "-c", "copy", str(first)], check=True)
    base.unlink()
    for i in range(1, LONG):
        shutil.copy(first, root / f"long{i:02d}.mp4")
    shutil.copy(HERE.parent.parent / "shared" / "media" / "torchcodec" / "nasa_13013.mp4", root / "small.mp4")
    return root


def client_a(addr: str, q: "mp.Queue[tuple[str, float]]") -> None:
    from vserve_client import Client

    c = Client(addr)
    t = time.time()
    reqs = [(reference.DATASET, [(f"long{i:02d}.mp4", [0])]) for i in range(LONG)]
    for _ in c.get_clips_many(reqs, max_in_flight=LONG):
        pass
    q.put(("a_all", time.time() - t))


def client_b(addr: str, q: "mp.Queue[tuple[str, float]]", label: str, video: str = "small.mp4") -> None:
    from vserve_client import Client

    c = Client(addr)
    t = time.time()
    c.get_clips(reference.DATASET, [(video, [0])])
    q.put((label, time.time() - t))


def trial(binary: str, root: Path, warm: bool) -> dict:
    state = Path(tempfile.mkdtemp(prefix="vserve-fair-"))
    d = reference.Daemon(Path(binary), root, 2, "2G", state / "daemon.log", extra=["--state-dir", str(state / "s")])
    out = {}
    try:
        q: "mp.Queue[tuple[str, float]]" = mp.Queue()
        if warm:
            p = mp.Process(target=client_b, args=(d.addr, q, "b_first"))
            p.start()
            p.join()
        a = mp.Process(target=client_a, args=(d.addr, q))
        a.start()
        time.sleep(0.5)
        b = mp.Process(target=client_b, args=(d.addr, q, "b"))
        b.start()
        b.join()
        a.join()
        # One more long build alone, for scale.
        shutil.copy(root / "long00.mp4", root / "long-extra.tmp.mp4")
        one = mp.Process(target=client_b, args=(d.addr, q, "one_build", "long-extra.tmp.mp4"))
        one.start()
        one.join()
        while not q.empty():
            k, v = q.get()
            out[k] = v
    finally:
        d.stop()
        (root / "long-extra.tmp.mp4").unlink(missing_ok=True)
        shutil.rmtree(state, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vserve", action="append", help="daemon binaries, alternated (default target/release/vserve)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    builds = args.vserve or [str(HERE.parent / "target" / "release" / "vserve")]
    root = corpus()
    print(f"{'binary':40} {'B':5} {'B wait s':>9} {'A all 13 s':>11} {'one build s':>12}")
    for _ in range(args.rounds):
        for build in builds:
            for warm in (False, True):
                r = trial(build, root, warm)
                print(
                    f"{build[-40:]:40} {'warm' if warm else 'cold':5} {r['b']:9.3f} {r['a_all']:11.2f} {r['one_build']:12.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
