#!/usr/bin/env python3
"""index_builds: how long a fresh daemon takes to index a corpus, for A/B runs of builds.

Per round and per build (alternated, so a drifting machine weighs on both alike): starts ``vserve serve``
on the reference corpus (``benches/reference.sh`` encodes it into ``target/bench-corpus``) with an empty
``--state-dir`` (no stored indexes), Probes every video with ``--inflight`` requests in flight, and prints
the seconds it took; each Probe builds the video's index (one packet scan) and records the file in the
crash journal::

    target/bench-venv/bin/python benches/index_builds.py --vserve OLD/vserve --vserve target/release/vserve
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "clients" / "python"))

import reference  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vserve", action="append", help="daemon binaries, alternated (default target/release/vserve)")
    ap.add_argument("--variant", default="gop250")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--inflight", type=int, default=4)
    args = ap.parse_args()
    builds = args.vserve or [str(HERE.parent / "target" / "release" / "vserve")]
    root = HERE.parent / "target" / "bench-corpus" / "reference-v1" / args.variant
    videos = sorted(p.name for p in root.iterdir() if p.suffix == ".mp4")
    if not videos:
        sys.exit(f"no corpus at {root}: run benches/reference.sh run first")
    for rnd in range(args.rounds):
        for build in builds:
            state = Path(tempfile.mkdtemp(prefix="vserve-index-state-"))
            log = state / "daemon.log"
            daemon = reference.Daemon(Path(build), root, 2, "2G", log, extra=["--state-dir", str(state)])
            try:
                t = time.time()
                with cf.ThreadPoolExecutor(args.inflight) as ex:
                    list(ex.map(lambda v: daemon.client.probe(reference.DATASET, v), videos))
                secs = time.time() - t
            finally:
                daemon.stop()
                shutil.rmtree(state, ignore_errors=True)
            print(json.dumps(dict(build=build, round=rnd, videos=len(videos), seconds=round(secs, 2))), flush=True)


if __name__ == "__main__":
    main()
