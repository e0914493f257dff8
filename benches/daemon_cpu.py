"""daemon_cpu: where the daemon's CPU goes on one reference workload, for A/B runs of two builds.

Starts ``vserve serve`` on the reference corpus (``benches/reference.sh`` encodes it into
``target/bench-corpus``), builds every index untimed, then runs 2 rank processes that each copy every batch
into a staging buffer (as ``reference.py``'s consumers do) and prints one JSON line: clips (videos for
``full``) per second, the daemon's CPU seconds per clip by thread kind (decode threads, runtime), its minor
page faults, the ranks' CPU, and the decode counters. ``--vserve`` picks the build, so two builds can be
alternated on a drifting machine; ``--perf FILE`` records the timed part (``perf record -g -p DAEMON``)::

    target/bench-venv/bin/python benches/daemon_cpu.py --workload full --repeat 3 \\
        --vserve target/release/vserve --vserve /path/to/other/release/vserve

``full``: one GetClips per video of every frame at native size (40 videos, 1 request in flight per rank);
``train``: ``reference.py``'s train stream (8-frame clips, crop 224, flip, batches of 32) over 400 videos.
"""

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "clients" / "python"))
sys.path.insert(0, str(HERE))

CORPUS = HERE.parent / "target" / "bench-corpus" / "reference-v1"


def rank(addr: str, workload: str, r: int, jobs, inflight: int, q, go) -> None:
    import numpy as np

    from vserve_client import Client

    import reference

    cl = Client(addr)
    cl.list_datasets()
    buf = None
    n = 0
    q.put("ready")
    go.get()
    t0, c0 = time.time(), time.process_time()

    def take(a) -> None:
        nonlocal buf
        if buf is None or buf.shape != a.shape:
            buf = np.empty(a.shape, a.dtype)
        np.copyto(buf, a)

    if workload == "full":
        # `inflight` requests queued at once (reference.py's full keeps 2), replies taken in order.
        mine = [("ref", [(v, list(range(count)))]) for v, count in jobs[r::2]]
        for b in cl.get_clips_many(mine, max_in_flight=inflight):
            take(b.array)
            n += 1
            b.release()
    else:
        for b in cl.stream("ref", **reference.train_stream_args(r, 2, 1)):
            take(b.array)
            n += b.array.shape[0]
            b.release()
    q.put((time.time() - t0, time.process_time() - c0, n))


def threads(pid: int):
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
            f = Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()
            out[t] = (name.rstrip("0123456789-"), (int(f[11]) + int(f[12])) / tick)
        except OSError:
            pass
    return out


def minflt(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def trial(binary: str, workload: str, root: Path, videos: int, inflight: int, perf: str) -> dict:
    from vserve_client import Client

    d = Path(tempfile.mkdtemp(prefix="vserve-cpu-"))
    sock = d / "s.sock"
    cmd = [binary, "serve", "--listen", f"unix:{sock}", "--dataset", f"ref={root}", "--decode-threads", "2"]
    proc = subprocess.Popen(cmd, stdout=open(d / "log", "w"), stderr=subprocess.STDOUT)
    addr = f"unix:{sock}"
    ctx = mp.get_context("spawn")  # no gRPC channel crosses a fork
    try:
        for _ in range(300):
            try:
                c = Client(addr)
                if not any(x.get("building") for x in c.list_datasets()):
                    break
            except Exception:
                pass
            time.sleep(0.1)
        names = sorted(p.name for p in root.glob("*.mp4"))
        jobs = [(v, c.probe("ref", v)["frame_count"]) for v in names]  # every index built, untimed
        if workload == "full":
            jobs = jobs[:videos]
        q, go = ctx.Queue(), ctx.Queue()
        ps = [ctx.Process(target=rank, args=(addr, workload, r, jobs, inflight, q, go)) for r in range(2)]
        for p in ps:
            p.start()
        for _ in ps:
            q.get()
        rec = None
        if perf:
            rec = subprocess.Popen(["perf", "record", "-g", "-p", str(proc.pid), "-o", perf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        s0, th0, f0, t0 = c.stats(), threads(proc.pid), minflt(proc.pid), time.time()
        for _ in ps:
            go.put(1)
        res = [q.get() for _ in ps]
        wall = time.time() - t0
        if rec:
            rec.send_signal(signal.SIGINT)
            rec.wait()
        th1, s1, f1 = threads(proc.pid), c.stats(), minflt(proc.pid)
        for p in ps:
            p.join()
        by_kind: dict = {}
        for t, (kind, cpu) in th1.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + cpu - th0.get(t, (kind, 0.0))[1]
        n = sum(x[2] for x in res)
        return dict(
            build=binary,
            workload=workload,
            clips=n,
            wall_s=round(wall, 3),
            clips_per_s=round(n / wall, 2),
            # Share of the machine's cores busy in the daemon and the ranks during the trial.
            busy=round((sum(by_kind.values()) + sum(x[1] for x in res)) / (wall * (os.cpu_count() or 1)), 3),
            daemon_cpu_per_clip={k: round(v / n, 4) for k, v in sorted(by_kind.items()) if v > 0},
            ranks_cpu_per_clip=round(sum(x[1] for x in res) / n, 4),
            daemon_minor_faults_per_clip=round((f1 - f0) / n, 1),
            counters={k: s1[k] - s0[k] for k in ("frames_decoded", "frames_skipped", "frames_in_place", "cache_admitted", "cache_bypassed") if k in s1},
        )
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("full", "train"), default="full")
    ap.add_argument("--variant", default="gop250")
    ap.add_argument("--videos", type=int, default=40, help="videos of the full workload")
    ap.add_argument("--inflight", type=int, default=1, help="full: GetClips requests in flight per rank")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--vserve", action="append", help="daemon binaries, alternated per trial (default target/release/vserve)")
    ap.add_argument("--perf", default="", help="perf.data path for the timed part (the last trial's)")
    args = ap.parse_args()
    root = CORPUS / args.variant
    if not root.is_dir():
        sys.exit(f"no corpus at {root}: run benches/reference.sh run once to encode it")
    builds = args.vserve or [str(HERE.parent / "target" / "release" / "vserve")]
    for _ in range(args.repeat):
        for b in builds:
            print(json.dumps(trial(b, args.workload, root, args.videos, args.inflight, args.perf)), flush=True)


if __name__ == "__main__":
    main()
