#!/usr/bin/env python3
"""Two vserve builds serving one GulpIO directory, alternated: clips/s and the daemon's CPU seconds.

Each trial starts a fresh daemon of one build (``--cache-bytes 0``: every request reads its records from
the chunks), sends 5 untimed GetClips and then 60 timed ones of 8 clips (8 frames, stride 4) at seeded
random places in seeded random videos, and reads the daemon's user + system CPU from /proc at the end.
Builds alternate for ``--pairs`` rounds; CPU per trial is the comparison that survives a noisy machine.

    target/py-venv/bin/python benches/gulp_ab.py --gulp DIR --ids-from VIDEO_DIR OLD_BIN NEW_BIN [--pairs 4]

DIR is a ``vserve ingest`` output; VIDEO_DIR holds the source videos (their names are the ids).
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients" / "python"))
from vserve_client import Client  # noqa: E402


def trial(binary: str, gulp: str, ids: list, frames: int) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "s.sock")
        p = subprocess.Popen(
            [binary, "--dataset", f"g={gulp}", "--listen", "unix:" + sock, "--admin-listen", "none",
             "--state-dir", os.path.join(tmp, "state"), "--shm-dir", tmp, "--cache-bytes", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            c = Client("unix:" + sock)
            rng = random.Random(1)
            reqs = []
            for _ in range(65):
                clips = []
                for _ in range(8):
                    start = rng.randrange(0, frames - 29)
                    clips.append((rng.choice(ids), list(range(start, start + 29, 4))))
                reqs.append(clips)
            for clips in reqs[:5]:
                c.get_clips("g", clips)
            t0 = time.perf_counter()
            for clips in reqs[5:]:
                c.get_clips("g", clips)
            wall = time.perf_counter() - t0
            stat = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
            cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
            c.close()
            return 60 * 8 / wall, cpu
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--gulp", required=True)
    ap.add_argument("--ids-from", required=True)
    ap.add_argument("--frames", type=int, default=250, help="frames per video (clips start below it)")
    ap.add_argument("--pairs", type=int, default=4)
    a = ap.parse_args()
    ids = sorted(os.listdir(a.ids_from))
    got = {"old": [], "new": []}
    for _ in range(a.pairs):
        for tag, binary in (("old", a.old), ("new", a.new)):
            rate, cpu = trial(binary, a.gulp, ids, a.frames)
            got[tag].append(cpu)
            print(f"{tag}: {rate:.1f} clips/s, daemon CPU {cpu:.2f} s", flush=True)
    for tag, cpus in got.items():
        print(f"{tag}: mean daemon CPU {sum(cpus) / len(cpus):.3f} s over {len(cpus)} trials")


if __name__ == "__main__":
    main()
