#!/usr/bin/env python3
"""scale: the daemon on a dataset of N videos (issue 15), not in CI. Run it through ``benches/scale.sh``::

    benches/scale.sh --n 100000 [--per-dir 1000] [--clip torchcodec/nasa_13013.mp4] [--tables 1000]
                     [--root target/scale/root] [--keep]

Makes N hard links of one real clip from ../shared/media in nested folders (``d0000/v0000000.mp4``,
``--per-dir`` to a folder) under ``--root`` (kept between runs with the same N and clip; removed at the
end unless ``--keep``), then starts the release daemon on it (one dataset, a state directory under
target/scale/state, no rescans) and reports:

- **serves after**: seconds from starting the process to its first ListDatasets answer;
- **ListDatasets while building / after**: the latency of calls while the catalogue's first walk is under
  way (median and max of those made) and after it completed (median and max of 20);
- **catalogue complete after**: seconds from start until ListDatasets says ``building`` is over;
- **catalogue RSS / video**: the daemon's RSS once the catalogue is complete minus the RSS of the same
  daemon serving an empty root, divided by N;
- **first batch, world size 8, rank 0**: seconds from opening the stream (batch 8 clips of 8 frames at
  112x112, seed 0, epoch 0) to its first batch, once the catalogue is complete;
- **RSS / frame table**: RSS after Probe on ``--tables`` distinct videos (each builds its frame table)
  minus RSS before, divided by ``--tables``; with the index builds counted (GetStats.index_builds);
- the same after a restart on the same state directory: serves after, catalogue complete after, first
  batch, and the index builds the same ``--tables`` Probes cost (0 when the store is reused).

Prints one JSON object per measurement and a Markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import vserve_client

REPO = Path(__file__).resolve().parents[1]
MEDIA = REPO.parent / "shared" / "media"
LINKS_PER_COPY = 60_000


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def make_links(root: Path, clip: Path, n: int, per_dir: int) -> float:
    """N hard links of `clip` under `root`; reused when a previous run made the same ones."""
    marker = root / ".scale"
    want = f"{n} {per_dir} {clip}"
    if marker.exists() and marker.read_text() == want:
        return 0.0
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    # Private copies on this file system are what gets linked (the media may sit elsewhere), a fresh one
    # every LINKS_PER_COPY links (ext4 allows 65,000 links to a file).
    for old in root.parent.glob("source-*"):
        old.unlink()
    start = time.monotonic()
    source = root
    for i in range(n):
        if i % LINKS_PER_COPY == 0:
            source = root.parent / f"source-{i // LINKS_PER_COPY}{clip.suffix}"
            shutil.copyfile(clip, source)
        d = root / f"d{i // per_dir:04d}"
        if i % per_dir == 0:
            d.mkdir()
        os.link(source, d / f"v{i:07d}{clip.suffix}")
    marker.write_text(want)
    return time.monotonic() - start


class Daemon:
    def __init__(self, binary: Path, root: Path, state: Path, sock: Path):
        self.addr = f"unix:{sock}"
        self.sock = sock
        if sock.exists():
            sock.unlink()
        self.log = open(state.parent / "daemon.log", "ab")
        cmd = [
            str(binary),
            "serve",
            "--listen",
            self.addr,
            "--dataset",
            f"scale={root}",
            "--state-dir",
            str(state),
            "--rescan-interval",
            "0",
            "--admin-listen",
            "none",
        ]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)

    def wait_serving(self) -> tuple[float, dict]:
        """Seconds from start to the first ListDatasets answer, and that answer's entry."""
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}; see {self.log.name}")
            if self.sock.exists():
                try:
                    with vserve_client.Client(self.addr, timeout=5) as c:
                        d = c.list_datasets()[0]
                    return time.monotonic() - self.started, d
                except vserve_client.VServeError:
                    pass
            time.sleep(0.01)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def timed_list(c: vserve_client.Client) -> tuple[float, dict]:
    t = time.monotonic()
    d = c.list_datasets()[0]
    return time.monotonic() - t, d


def until_built(d: Daemon, c: vserve_client.Client) -> tuple[float, list[float], dict]:
    """Polls ListDatasets until the catalogue is complete: (seconds since start, latencies while
    building, the last entry)."""
    lat = []
    while True:
        s, info = timed_list(c)
        if not info["building"]:
            return time.monotonic() - d.started, lat, info
        lat.append(s)
        time.sleep(0.05)


def first_batch(c: vserve_client.Client) -> float:
    t = time.monotonic()
    with c.stream(
        "scale",
        batch_size=8,
        num_frames_per_clip=8,
        size=(112, 112),
        world_size=8,
        rank=0,
        seed=0,
        epoch=0,
    ) as s:
        batch = next(iter(s))
        assert batch.array.shape[0] == 8, batch.array.shape
    return time.monotonic() - t


def ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs) * 1e3:.1f} / {max(xs) * 1e3:.1f}"


def emit(key: str, value) -> None:
    print(json.dumps({key: value}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--per-dir", type=int, default=1000)
    ap.add_argument("--clip", default="torchcodec/nasa_13013.mp4")
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--root", type=Path, default=REPO / "target" / "scale" / "root")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--bin", type=Path, default=Path(os.environ.get("VSERVE_BIN", REPO / "target/release/vserve")))
    args = ap.parse_args()

    work = args.root.parent
    state = work / "state"
    if state.exists():
        shutil.rmtree(state)
    state.mkdir(parents=True)
    empty = work / "empty"
    empty.mkdir(parents=True, exist_ok=True)
    sock = work / "vserve.sock"
    clip = MEDIA / args.clip
    made = make_links(args.root, clip, args.n, args.per_dir)
    emit("links_made_s", round(made, 1))
    res: dict = {"n": args.n, "clip": args.clip}

    # Baseline: the same daemon serving an empty root.
    base = Daemon(args.bin, empty, work / "state-empty", sock)
    base.wait_serving()
    with vserve_client.Client(base.addr) as c:
        until_built(base, c)
    time.sleep(0.5)
    res["rss_empty"] = rss_bytes(base.proc.pid)
    base.stop()
    shutil.rmtree(work / "state-empty", ignore_errors=True)

    for run in ("first", "restart"):
        d = Daemon(args.bin, args.root, state, sock)
        serves, info = d.wait_serving()
        res[f"{run}_serves_s"] = serves
        res[f"{run}_first_answer"] = {k: info[k] for k in ("building", "video_count")}
        with vserve_client.Client(d.addr) as c:
            built, during, info = until_built(d, c)
            res[f"{run}_built_s"] = built
            res[f"{run}_list_during"] = during
            assert info["video_count"] == args.n, info
            time.sleep(0.5)
            res[f"{run}_rss_catalogue"] = rss_bytes(d.proc.pid)
            res[f"{run}_list_after"] = [timed_list(c)[0] for _ in range(20)]
            res[f"{run}_first_batch_s"] = first_batch(c)
            before_rss = rss_bytes(d.proc.pid)
            before_builds = c.stats()["index_builds"]
            step = max(1, args.n // args.tables)
            t = time.monotonic()
            for i in range(0, step * args.tables, step):
                c.probe("scale", f"d{i // args.per_dir:04d}/v{i:07d}{clip.suffix}")
            res[f"{run}_probe_s"] = time.monotonic() - t
            time.sleep(0.5)
            res[f"{run}_rss_tables"] = rss_bytes(d.proc.pid) - before_rss
            res[f"{run}_index_builds"] = c.stats()["index_builds"] - before_builds
        d.stop()
        for k, v in res.items():
            if k.startswith(run):
                emit(k, v)

    n, t = args.n, args.tables
    rows = [
        ("serves after start (s)", f"{res['first_serves_s']:.2f}", f"{res['restart_serves_s']:.2f}", "< 2"),
        (
            "first answer: building, videos so far",
            f"{res['first_first_answer']['building']}, {res['first_first_answer']['video_count']}",
            f"{res['restart_first_answer']['building']}, {res['restart_first_answer']['video_count']}",
            "",
        ),
        ("catalogue complete after (s)", f"{res['first_built_s']:.2f}", f"{res['restart_built_s']:.2f}", ""),
        ("ListDatasets while building, median / max (ms)", ms(res["first_list_during"]), ms(res["restart_list_during"]), "< 50"),
        ("ListDatasets after, median / max (ms)", ms(res["first_list_after"]), ms(res["restart_list_after"]), "< 50"),
        (
            "catalogue RSS per video (bytes)",
            f"{(res['first_rss_catalogue'] - res['rss_empty']) / n:.0f}",
            f"{(res['restart_rss_catalogue'] - res['rss_empty']) / n:.0f}",
            "< 200",
        ),
        ("first batch, world size 8, rank 0 (s)", f"{res['first_first_batch_s']:.2f}", f"{res['restart_first_batch_s']:.2f}", "< 2"),
        (
            f"{t} Probes: seconds, index builds",
            f"{res['first_probe_s']:.1f}, {res['first_index_builds']}",
            f"{res['restart_probe_s']:.1f}, {res['restart_index_builds']}",
            "restart: 0 builds",
        ),
        (
            "RSS per frame table (bytes)",
            f"{res['first_rss_tables'] / t:.0f}",
            f"{res['restart_rss_tables'] / t:.0f}",
            "",
        ),
    ]
    print(f"\nN = {n} hard links of {args.clip}, {args.per_dir} a folder; daemon RSS serving an empty root "
          f"{res['rss_empty'] / 2**20:.1f} MiB\n")
    print("| measure | first start | after a restart | aim |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if not args.keep:
        shutil.rmtree(args.root)
        for copy in work.glob("source-*"):
            copy.unlink()
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
