#!/usr/bin/env python3
"""pipeline: GetClips one clip per request, pipelined (``Client.get_clips_many``), against batched requests.

The open-loop benchmark's clip (benches/reference.py): a random video of the reference corpus, 8 frames at
stride 4 from a random start, short side 256, centre crop 224; ``--clips`` of them, the same list for every
mode. Each mode runs on a fresh daemon (cold frame cache; indexes built by an untimed Probe per video), the
consumer copying each batch into a staging buffer (what a trainer does before the device copy):

- ``batch8``: 8 clips per request, one request at a time (``get_clips``);
- ``batch8-pipe``: 8 clips per request, ``get_clips_many(max_in_flight=2)``;
- ``one``: 1 clip per request, one at a time (``get_clips``): latency-bound;
- ``one-pipeN``: 1 clip per request, ``get_clips_many(max_in_flight=N)``.

    target/bench-venv/bin/python benches/pipeline.py [--variant gop250] [--clips 256] [--videos 100]
        [--modes batch8,batch8-pipe,one,one-pipe4,one-pipe8,one-pipe16] [--repeat 2] [--tcp]

``--tcp`` runs the client over the daemon's loopback TCP listener with shared memory forced. Prints a
Markdown table; each mode's best trial of ``--repeat`` counts (other load only slows a run down).
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(HERE))

import refcorpus  # noqa: E402
from reference import DATASET, Daemon, probe_all, write_manifest  # noqa: E402

TRANSFORM = dict(short_side=256, crop=(224, 224))


def clip_list(infos: Dict[str, Dict[str, Any]], videos: List[str], n: int, seed: int) -> List[Tuple[str, List[int]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        v = rng.choice(videos)
        frames = infos[v]["frames"]
        s = rng.randrange(0, max(1, frames - 28))
        out.append((v, [min(frames - 1, s + 4 * i) for i in range(8)]))
    return out


def run_mode(addr: str, transport: str, mode: str, clips: List[Tuple[str, List[int]]]) -> Dict[str, Any]:
    import vserve_client

    per = 8 if mode.startswith("batch8") else 1
    depth = 1
    if mode == "batch8-pipe":
        depth = 2
    elif mode.startswith("one-pipe"):
        depth = int(mode[len("one-pipe") :])
    reqs = [(DATASET, clips[i : i + per]) for i in range(0, len(clips), per)]
    staging: Dict[Tuple[int, ...], np.ndarray] = {}
    with vserve_client.Client(addr, transport=transport) as c:
        c.list_datasets()
        t0, c0 = time.perf_counter(), os.times()
        done = 0
        if depth == 1:
            batches = (c.get_clips(d, cl, **TRANSFORM) for d, cl in reqs)
        else:
            batches = c.get_clips_many(reqs, max_in_flight=depth, **TRANSFORM)
        for b in batches:
            buf = staging.get(b.array.shape)
            if buf is None:
                buf = staging[b.array.shape] = np.empty(b.array.shape, b.array.dtype)
            np.copyto(buf, b.array)
            done += len(b)
            del b
        dt = time.perf_counter() - t0
        c1 = os.times()
    return {
        "mode": mode,
        "clips": done,
        "seconds": dt,
        "clips_per_s": done / dt,
        "client_cpu_s": (c1.user + c1.system) - (c0.user + c0.system),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="gop250", choices=list(refcorpus.VARIANTS))
    ap.add_argument("--clips", type=int, default=256)
    ap.add_argument("--videos", type=int, default=100, help="corpus videos the clips are drawn from")
    ap.add_argument("--modes", default="batch8,batch8-pipe,one,one-pipe4,one-pipe8,one-pipe16")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--tcp", action="store_true", help="loopback TCP with shared memory forced")
    ap.add_argument("--vserve-bin", default=str(REPO / "target" / "release" / "vserve"))
    args = ap.parse_args()
    root = refcorpus.build(REPO.parent / "shared" / "media", REPO / "target" / "bench-corpus", args.videos, variants=[args.variant])[
        args.variant
    ]
    videos = sorted(p.name for p in root.glob("*.mp4") if not p.name.startswith("."))[: args.videos]
    work = Path(tempfile.mkdtemp(prefix="vserve-pipeline-"))
    manifest = write_manifest(work, videos)
    modes = [m for m in args.modes.split(",") if m]
    best: Dict[str, Dict[str, Any]] = {}
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}; load {os.getloadavg()[0]:.2f}; {args.variant}, {len(videos)} videos, "
          f"{args.clips} clips; {'tcp+shm' if args.tcp else 'unix socket, shm'}", flush=True)
    infos = None
    clips: List[Tuple[str, List[int]]] = []
    for rep in range(args.repeat):
        for mode in modes:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            d = Daemon(Path(args.vserve_bin), root, args.cores, "2G", work / "daemon.log", manifest,
                       extra=["--listen", f"127.0.0.1:{port}"])  # fmt: skip
            try:
                infos = probe_all(d, videos)
                if not clips:
                    clips = clip_list(infos, videos, args.clips, args.seed)
                addr = f"127.0.0.1:{port}" if args.tcp else d.addr
                r = run_mode(addr, "shm", mode, clips)
            finally:
                d.stop()
            print(f"  trial {rep + 1} {mode}: {r['clips_per_s']:.1f} clips/s", file=sys.stderr, flush=True)
            if mode not in best or r["clips_per_s"] > best[mode]["clips_per_s"]:
                best[mode] = r
    base = best.get("batch8", {}).get("clips_per_s")
    print("\n| mode | clips per request | in flight | clips/s | vs batch8 | client CPU s/clip |")
    print("|---|---|---|---|---|---|")
    for mode in modes:
        r = best[mode]
        per = 8 if mode.startswith("batch8") else 1
        depth = 2 if mode == "batch8-pipe" else (int(mode[8:]) if mode.startswith("one-pipe") else 1)
        ratio = f"{r['clips_per_s'] / base:.2f}" if base else "-"
        print(f"| {mode} | {per} | {depth} | {r['clips_per_s']:.1f} | {ratio} | {r['client_cpu_s'] / r['clips']:.4f} |")


if __name__ == "__main__":
    main()
