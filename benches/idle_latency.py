"""idle_latency: one client, one clip a request, on an otherwise idle daemon, for A/B runs of builds.

    target/bench-venv/bin/python benches/idle_latency.py --vserve BUILD_A --vserve BUILD_B \
        [--variant gop1s] [--frames 20,24,28,32,36,40,44,48] [--videos 60] [--rounds 2]

Per round and build: starts ``BUILD serve`` (2 decode threads) on the reference corpus
(``target/bench-corpus/reference-v1/VARIANT``, made by ``benches/reference.sh``), builds the index of
``--videos`` videos untimed, then times one GetClips of ``--frames`` (``cache_policy one_pass``, native
size) per video, one request at a time, up to the sum of the returned array, and prints the median and mean
milliseconds. The default frames (20-48, stride 4) cross the keyframe at 30 of the 1 s GOP: what an idle
daemon does with a clip across a keyframe (one pass, or its two GOP runs at once on two threads). Builds
alternate within each round, so drift hits them alike. No timing is asserted: this prints.
"""

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from vserve_client import Client

ROOT = Path(__file__).resolve().parent.parent


def trial(binary: str, root: Path, videos, frames) -> tuple:
    d = tempfile.mkdtemp(prefix="vserve-idle-")
    sock = f"{d}/s.sock"
    p = subprocess.Popen(
        [binary, "serve", "--listen", f"unix:{sock}", "--dataset", f"c={root}", "--decode-threads", "2"],
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        c = Client(f"unix:{sock}")
        for v in videos:
            c.probe("c", v)  # index builds, untimed
        ms = []
        for v in videos:
            t = time.perf_counter()
            b = c.get_clips("c", [(v, frames)], cache_policy="one_pass")
            b.array.sum()
            ms.append((time.perf_counter() - t) * 1000)
        c.close()
        return statistics.median(ms), statistics.mean(ms)
    finally:
        p.terminate()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vserve", action="append", help="daemon binaries, alternated (default target/release/vserve)")
    ap.add_argument("--variant", default="gop1s")
    ap.add_argument("--frames", default="20,24,28,32,36,40,44,48")
    ap.add_argument("--videos", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    root = ROOT / "target" / "bench-corpus" / "reference-v1" / args.variant
    videos = sorted(v for v in os.listdir(root) if v.endswith(".mp4"))[: args.videos]
    frames = [int(x) for x in args.frames.split(",")]
    builds = args.vserve or [str(ROOT / "target" / "release" / "vserve")]
    for r in range(args.rounds):
        for b in builds:
            med, mean = trial(b, root, videos, frames)
            print(f"round {r + 1} {b}: median {med:.1f} ms, mean {mean:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
