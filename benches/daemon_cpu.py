"""daemon_cpu: where the daemon's CPU goes on one reference workload, for A/B runs of two builds.

Starts ``vserve serve`` on the reference corpus (``benches/reference.sh`` encodes it into
``target/bench-corpus``), builds every index untimed, then runs 2 rank processes that each copy every batch
into a staging buffer (as ``reference.py``'s consumers do) and prints one JSON line: clips (videos for
``full``) per second, the daemon's CPU seconds per clip by thread kind (decode threads, runtime), its minor
page faults, the ranks' CPU, and the decode counters. ``--vserve`` picks the build, so two builds can be
alternated on a drifting machine; ``--perf FILE`` records the timed part (``perf record -g -p DAEMON``;
``--perf-event page-faults`` samples where the minor faults happen instead of cycles)::

    target/bench-venv/bin/python benches/daemon_cpu.py --workload full --repeat 3 \\
        --vserve target/release/vserve --vserve /path/to/other/release/vserve

``full``: one GetClips per video of every frame at native size (40 videos, ``--inflight`` requests in
flight per rank); ``train``: ``reference.py``'s train stream (8-frame clips, crop 224, flip, batches of 32)
over 400 videos.

``--policy`` (repeatable) sets the requests' ``cache_policy`` and is alternated per trial like ``--vserve``;
``--daemon-arg`` passes extra ``vserve serve`` arguments (``--daemon-arg=--cache-bytes=256M``). ``--floor``
runs ``benches/floor.rs`` right after each round's vserve trials on exactly the clips those trials
delivered (``tight`` mode for train: it skips frames no clip needs; ``specified`` for full) and prints
each round's vserve/floor ratio and the median, so the ratio is taken on the same machine minutes apart.
``--consume read`` has the ranks read every byte of a batch in place instead of copying it (the
floor reads each frame once to hash it). ``--warmup-epochs N`` runs N untimed passes over other clips
first (train: other epochs; full: the next ``--videos`` videos): a short trial from a fresh daemon
otherwise times its warm-up (fresh frame buffers, arenas, a cache still filling)::

    target/bench-venv/bin/python benches/daemon_cpu.py --workload train --repeat 6 \
        --policy auto --policy one_pass --floor
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


def whole(jobs) -> list:
    """GetClips requests of every frame of each (video, frame count)."""
    return [("ref", [(v, list(range(count)))]) for v, count in jobs]


def rank(addr: str, r: int, jobs, warm_jobs, opt: dict, q, go) -> None:
    """One rank: `opt` holds workload, inflight, policy, warmup and consume (as on the command line)."""
    import numpy as np

    from vserve_client import Client

    import reference

    workload, inflight, policy, consume = opt["workload"], opt["inflight"], opt["policy"], opt["consume"]
    ranks = opt["ranks"]
    cl = Client(addr)
    cl.list_datasets()
    buf = None
    n = 0
    got = []  # (video, frames) of every clip taken, for the floor's plan
    for e in range(1, opt["warmup"] + 1):
        # Untimed epochs of other clips (train: epochs 1..N, the timed one is epoch 0; full: the videos
        # after the timed ones): the daemon's buffer pool, arenas and (with a cache smaller than what
        # they admit) its cache reach their steady state.
        if workload == "full":
            for b in cl.get_clips_many(whole(warm_jobs[r::ranks]), max_in_flight=inflight, cache_policy=policy):
                b.release()
            continue
        for b in cl.stream("ref", cache_policy=policy, **reference.train_stream_args(r, 2, 1, epoch=e)):
            b.release()
    q.put("ready")
    go.get()
    t0, c0 = time.time(), time.process_time()

    def take(a) -> None:
        nonlocal buf
        if consume == "read":
            # Every byte read once where it lies (an XOR over 8-byte words), as the floor reads each
            # frame once to hash it: no staging copy.
            flat = a.reshape(-1)
            words = flat[: flat.size // 8 * 8].view(np.uint64)
            buf = np.bitwise_xor.reduce(words) ^ np.bitwise_xor.reduce(flat[words.size * 8 :], initial=0)
            return
        if buf is None or buf.shape != a.shape:
            buf = np.empty(a.shape, a.dtype)
        np.copyto(buf, a)

    if workload == "full":
        # `inflight` requests queued at once (reference.py's full keeps 2), replies taken in order.
        for b in cl.get_clips_many(whole(jobs[r::ranks]), max_in_flight=inflight, cache_policy=policy):
            take(b.array)
            n += 1
            b.release()
        got = [(v, list(range(count))) for v, count in jobs[r::ranks]]
    else:
        for b in cl.stream("ref", cache_policy=policy, **reference.train_stream_args(r, ranks, 1)):
            take(b.array)
            n += b.array.shape[0]
            got.extend((v, [int(x) for x in f]) for v, f in zip(b.videos, b.frames))
            b.release()
    q.put((time.time() - t0, time.process_time() - c0, n, got))


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


def trial(binary: str, root: Path, policy: str, consume: str, args) -> tuple:
    """One vserve trial with the command line's `args`: its row, and (clips taken, probes) for the floor."""
    from vserve_client import Client

    workload, videos, perf = args.workload, args.videos, args.perf
    opt = dict(workload=workload, inflight=args.inflight, policy=policy, warmup=args.warmup_epochs, consume=consume, ranks=args.ranks)

    d = Path(tempfile.mkdtemp(prefix="vserve-cpu-"))
    sock = d / "s.sock"
    cmd = [binary, "serve", "--listen", f"unix:{sock}", "--dataset", f"ref={root}", *(() if any(a.startswith("--decode-threads") for a in args.daemon_arg) else ("--decode-threads", "2")), *args.daemon_arg]
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
        probes = {v: c.probe("ref", v, include_pts=True) for v in names}  # every index built, untimed
        jobs = [(v, probes[v]["frame_count"]) for v in names]
        warm_jobs = []
        if workload == "full":
            jobs, warm_jobs = jobs[:videos], jobs[videos : 2 * videos]
        q, go = ctx.Queue(), ctx.Queue()
        ps = [ctx.Process(target=rank, args=(addr, r, jobs, warm_jobs, opt, q, go)) for r in range(args.ranks)]
        for p in ps:
            p.start()
        for _ in ps:
            q.get()
        rec = None
        if perf:
            ev = ["-e", args.perf_event] if args.perf_event else []
            cg = ["--call-graph", args.perf_call_graph] if args.perf_call_graph else ["-g"]
            rec = subprocess.Popen(["perf", "record", *ev, *cg, "-p", str(proc.pid), "-o", perf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        got = [g for x in res for g in x[3]]
        return dict(
            build=binary,
            workload=workload,
            cache_policy=policy,
            consume=consume,
            clips=n,
            wall_s=round(wall, 3),
            clips_per_s=round(n / wall, 2),
            # Share of the machine's cores busy in the daemon and the ranks during the trial.
            busy=round((sum(by_kind.values()) + sum(x[1] for x in res)) / (wall * (os.cpu_count() or 1)), 3),
            daemon_cpu_per_clip={k: round(v / n, 4) for k, v in sorted(by_kind.items()) if v > 0},
            ranks_cpu_per_clip=round(sum(x[1] for x in res) / n, 4),
            daemon_minor_faults_per_clip=round((f1 - f0) / n, 1),
            counters={k: s1[k] - s0[k] for k in ("frames_decoded", "frames_skipped", "frames_in_place", "cache_admitted", "cache_bypassed") if k in s1},
        ), (got, probes)
    finally:
        proc.terminate()
        proc.wait()


def floor_plan(workload: str, root: Path, got, probes) -> dict:
    """The floor bench's plan for exactly the clips a vserve trial delivered (reference.py's format)."""
    import reference

    infos = {v: reference.probe_info(p) for v, p in probes.items()}

    def size(v):
        w, h = infos[v]["width"], infos[v]["height"]
        return (w, h) if workload == "full" else reference.short_side_size(w, h, 256)

    return reference.floor_plan(workload, root, infos, [(v, f, size(v)) for v, f in got], whole=workload == "full")


def floor_trial(binary: str, plan_path: Path, mode: str, clips: int) -> dict:
    out = subprocess.run([binary, str(plan_path), "--threads", "2", "--modes", mode], check=True, capture_output=True, text=True).stdout
    p = json.loads(out)["passes"][0]
    return dict(build="floor", mode=p["mode"], clips=clips, clips_per_s=round(clips / p["seconds"], 2), cpu_per_clip=round(p["cpu_seconds"] / clips, 4))


def summarize(rows) -> None:
    """Per vserve configuration: its rate over the floor's of the same round, each round and the median."""
    import statistics

    rounds, cur = [], []
    for r in rows:
        cur.append(r)
        if r["build"] == "floor":
            rounds.append(cur)
            cur = []
    ratios: dict = {}
    for rd in rounds:
        fl = rd[-1]["clips_per_s"]
        for r in rd[:-1]:
            ratios.setdefault(f"{r['build']} {r['cache_policy']} {r['consume']}", []).append(r["clips_per_s"] / fl)
    for k, v in ratios.items():
        print(json.dumps({"vserve/floor": k, "median": round(statistics.median(v), 3), "rounds": [round(x, 3) for x in v]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("full", "train"), default="full")
    ap.add_argument("--variant", default="gop250")
    ap.add_argument("--videos", type=int, default=40, help="videos of the full workload")
    ap.add_argument("--inflight", type=int, default=1, help="full: GetClips requests in flight per rank")
    ap.add_argument("--ranks", type=int, default=2, help="client processes (1 with --inflight 1: a lone sequential reader)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--vserve", action="append", help="daemon binaries, alternated per trial (default target/release/vserve)")
    ap.add_argument("--policy", action="append", help="the requests' cache_policy, alternated per trial after the builds (default auto)")
    ap.add_argument("--floor", nargs="?", const="auto", default="", help="alternate FFmpeg's floor (benches/floor.rs: 'tight' on train, 'specified' on full) on the same clips with the vserve trials; BIN or the newest target/release/deps/floor-*")
    ap.add_argument("--daemon-arg", action="append", default=[], help="an extra `vserve serve` argument (repeatable), e.g. --daemon-arg=--cache-bytes=256M")
    ap.add_argument("--perf", default="", help="perf.data path for the timed part (the last trial's)")
    ap.add_argument("--warmup-epochs", type=int, default=0, help="untimed passes first over other clips (train: other epochs; full: the next --videos videos), so the timed pass sees a long-running daemon's steady state")
    ap.add_argument("--consume", choices=["copy", "read"], action="append", help="what a rank does with each batch, alternated per trial after the policies (default copy): copy it into a staging buffer (reference.py's consumers) or read every byte in place once (as the floor reads each frame to hash it)")
    ap.add_argument("--perf-call-graph", default="", help="perf's --call-graph mode (default frame pointers, -g); dwarf unwinds through libc and FFmpeg")
    ap.add_argument("--perf-event", default="", help="what --perf samples instead of cycles, e.g. page-faults (where the daemon's minor faults come from)")
    args = ap.parse_args()
    root = CORPUS / args.variant
    if not root.is_dir():
        sys.exit(f"no corpus at {root}: run benches/reference.sh run once to encode it")
    builds = args.vserve or [str(HERE.parent / "target" / "release" / "vserve")]
    floor = args.floor
    if floor == "auto":
        bins = [p for p in (HERE.parent / "target" / "release" / "deps").glob("floor-*") if p.suffix == ""]
        if not bins:
            sys.exit("no floor bench binary: cargo bench --bench floor --no-run")
        floor = str(max(bins, key=lambda p: p.stat().st_mtime))
    mode = "tight" if args.workload == "train" else "specified"
    plan_path = Path(tempfile.mkdtemp(prefix="vserve-floor-")) / "plan.json"
    rows = []
    for _ in range(args.repeat):
        for b in builds:
            for policy in args.policy or ["auto"]:
                for consume in args.consume or ["copy"]:
                    row, (got, probes) = trial(b, root, policy, consume, args)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if floor and not plan_path.exists():
                        plan_path.write_text(json.dumps(floor_plan(args.workload, root, got, probes)))
        if floor:
            # Right after this round's vserve trials, on the same clips (every round streams the same seed).
            row = floor_trial(floor, plan_path, mode, rows[-1]["clips"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    if floor:
        summarize(rows)


if __name__ == "__main__":
    main()
