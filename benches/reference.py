#!/usr/bin/env python3
"""reference: DESIGN.md's reference workloads, vserve against PyAV, decord (and TorchCodec) and FFmpeg's floor.

Run it through ``benches/reference.sh``, which makes the virtualenv (target/bench-venv), builds the release
daemon and the floor bench, then calls this script::

    benches/reference.sh run [--variants gop250,gop1s] [--workloads train,warm,steady,shared,uniform,full]
                             [--systems vserve,pyav,pyav-auto,decord,decord-torch,torchcodec,spdl] [--clips 400] [--ranks 2]
                             [--cores N] [--full-videos 40] [--out target/bench-results/reference]
    benches/reference.sh open-loop [--variants gop250,gop1s] [--rates 20,40,...] [--duration 10] [--queue 32]
                                   [--open-loop-ranks 4] [--cold]

Everything runs on the same cores (``--cores``, default all of this machine's; the daemon gets that many
decode threads, each peer rank that many workers divided by the ranks). Per (variant, workload, system)
it measures clips/s, frames/s, the batch wait of the consumer (p50/p99), CPU seconds per clip (every
process involved, from its own counters, for the timed part only), the peak PSS of all processes involved
(the daemon's frame cache subtracted), and frames decoded per frame delivered; and the ratios vserve/peer
and vserve/floor, all from one run. Results go to ``--out``: ``results.json``, ``report.md`` and PNG plots.

Systems (all deliver the same clips: the peers replay the clip list vserve's stream drew, so every system
decodes exactly the same frames; the report compares their first batches pixel by pixel):

- **vserve**: the release daemon on a private Unix socket, ``--ranks`` client processes with the Python
  client over shared memory; ``train`` is a ``StreamBatches`` stream per rank, ``uniform`` and ``full``
  are ``GetClips`` requests (32 clips, or one whole video) with 2 in flight per rank.
- **pyav**, **decord**, **torchcodec**, **spdl** (each only when importable): per rank a pool shaped like a
  PyTorch ``DataLoader(num_workers=W, prefetch_factor=2)``: forked workers take whole batches round-robin,
  decode each clip (the file opened per clip, as a Dataset's ``__getitem__`` does), resize, crop and flip
  it, collate the batch into shared memory and pass its name back; the rank receives batches in order.
  Decoders are single-threaded (W processes use the W cores). Each peer as it runs best:
  PyAV seeks frame-exactly (to the keyframe before each GOP run by pts, then decodes forward, matching
  frames by pts, with the frame tables from the daemon's Probe) and resizes in ``to_ndarray`` (swscale
  bilinear); ``pyav-auto`` is the same with ``stream.thread_type = "AUTO"`` (FFmpeg's frame and slice
  threads). decord: ``VideoReader(width, height, num_threads=1).get_batch`` (resize inside the decoder),
  the native bridge (``asnumpy()``); ``decord-torch`` with ``decord.bridge.set_bridge("torch")``.
  TorchCodec: ``torch.set_num_threads(1)`` in the rank and every worker, ``VideoDecoder(seek_mode="exact",
  num_ffmpeg_threads=1, transforms=[torchcodec.transforms.Resize((h, w))]).get_frames_at`` (the resize in
  the decoder where this TorchCodec has ``transforms``, else torch's ``interpolate``);
  ``torchcodec-approx`` with ``seek_mode="approximate"`` (no scan at open; exact on constant-rate MP4s).
  SPDL 0.8: ``spdl.io.demux_video`` + ``sample_decode_video(indices)`` (decoder threads 1), then one FFmpeg
  filter graph (``scale`` bilinear, RGB24) over the wanted frames only.
- **floor**: ``cargo bench --bench floor`` (FFmpeg through ffmpeg-next, the same cores as threads) on
  exactly the GOP runs the workload's clips need, converting each wanted frame to RGB at the output size;
  "floor (ffmpeg)" reopens per run and decodes every frame, "floor, skip nonref" opens once per video and
  skips unwanted non-reference frames (what vserve does).

``train`` times a fresh daemon (cold: its cache fills from new memory, its arenas and decoders are new);
``warm`` the same clips again on that daemon (cache hits only); ``steady`` the same clips on a daemon that
has already streamed ``--steady-epochs`` other epochs of the same videos through a ``--steady-cache``
cache (512M: full after the first epoch), as a daemon that has run for hours has: cache full and turning
over, buffers and arenas reused. Its rows are compared with the train workload's peers and floors (the
same clips; the other epochs' frames give it under 1% of cache hits, visible in decoded/delivered), and its
first batch with the cold daemon's. It always runs right after the cold trial, and on a machine where the
second of two back-to-back trials runs faster (docs/BENCHMARKS.md, run s41) its rate carries that: compare
a warmed daemon with a fresh one by alternating ``benches/daemon_cpu.py`` runs in both orders.

``--repeat N`` runs N trials and keeps each system's fastest row (and reports each trial's own ratios); with
``--counterbalance`` (the default) every second trial runs the train workload's peers and floor before
vserve, on trial 1's clips (checked to be the clips vserve's stream draws again).

Every rank consumes a batch by copying it into a reusable staging buffer (what a trainer does before the
host-to-device copy). The batch wait is how long the consumer was blocked for each batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import refcorpus  # noqa: E402

DATASET = "bench"
CLK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------------------
# Small helpers


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(xs: List[float], q: float) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def short_side_size(w: int, h: int, short: int) -> Tuple[int, int]:
    """vserve's short-side resize (src/engine.rs): the short side becomes `short`, the other rounds half up."""
    if w <= h:
        return short, max(1, (h * short * 2 + w) // (2 * w))
    return max(1, (w * short * 2 + h) // (2 * h)), short


#: Seconds between PSS samples during a timed trial (``--pss-period``; 0: no sampling).
PSS_PERIOD = 1.0


class PssSampler(threading.Thread):
    """Samples the summed PSS of some root processes and all their descendants, every `period` s.

    PSS splits shared pages (shared memory arenas, forked workers' copy-on-write pages) between the
    processes that map them, so the sum counts each page once. `minus()` is subtracted per sample (the
    daemon's frame cache, which the memory aim excludes)."""

    def __init__(self, roots: List[int], minus, period: float):
        super().__init__(daemon=True)
        self.roots, self.minus, self.period = roots, minus, period
        self.peak = 0
        self.peak_raw = 0
        self._halt = threading.Event()

    @staticmethod
    def _tree(roots: List[int]) -> List[int]:
        children: Dict[int, List[int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
        out, todo = [], list(roots)
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(children.get(p, []))
        return out

    @staticmethod
    def _pss(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def run(self) -> None:
        while self.period > 0 and not self._halt.is_set():
            total = sum(self._pss(p) for p in self._tree(self.roots))
            minus = 0
            if self.minus is not None:
                try:
                    minus = self.minus()
                except Exception:  # noqa: BLE001 - the daemon may be between states
                    minus = 0
            self.peak_raw = max(self.peak_raw, total)
            self.peak = max(self.peak, total - minus)
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join()


# ------------------------------------------------------------------------------------------------------
# The daemon


class Daemon:
    def __init__(self, binary: Path, root: Path, threads: int, cache: str, log_path: Path, manifest: Optional[Path] = None, extra=()):
        self.dir = Path(tempfile.mkdtemp(prefix="vserve-ref-"))
        self.sock = self.dir / "s.sock"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.admin_port = s.getsockname()[1]
        self.log_path = log_path
        cmd = [
            str(binary), "serve", "--listen", f"unix:{self.sock}",
            "--dataset", f"{DATASET}={root}" + (f":manifest={manifest}" if manifest else ""),
            "--decode-threads", str(threads),
            "--cache-bytes", cache, "--admin-listen", f"127.0.0.1:{self.admin_port}", *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT
        )
        from vserve_client import Client

        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}; see {log_path}")
            if self.sock.exists():
                try:
                    self.client = Client(self.addr)
                    self.client.list_datasets()
                    break
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
            if time.time() > deadline:
                raise RuntimeError(f"daemon did not start; see {log_path}")
            time.sleep(0.05)

    @property
    def addr(self) -> str:
        return f"unix:{self.sock}"

    def stats(self) -> Dict[str, Any]:
        return self.client.stats()

    def metrics(self) -> Dict[str, float]:
        """The admin listener's /metrics as {series: value} (histogram sums and counts included)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=5).read()
        out: Dict[str, float] = {}
        for line in text.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
        return out

    def cpu(self) -> float:
        return proc_cpu(self.proc.pid)

    def stop(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def probe_info(p: Dict[str, Any]) -> Dict[str, Any]:
    """What the plans need of one video's probe (``include_pts=True``): its frame table and display size."""
    return {
        "keyframes": list(p["keyframes"]),
        "pts": list(p["pts"]),
        "time_base": [p["time_base"]["num"], p["time_base"]["den"]],
        "stream": p["stream"],
        "width": p["display_width"] or p["width"],
        "height": p["display_height"] or p["height"],
    }


def probe_all(daemon: Daemon, videos: List[str]) -> Dict[str, Dict[str, Any]]:
    out = {}
    for v in videos:
        p = daemon.client.probe(DATASET, v, include_pts=True)
        out[v] = {"frames": p["frame_count"], **probe_info(p)}
    return out


# ------------------------------------------------------------------------------------------------------
# Rank processes: started by the driver, print "ready", wait for "go" on stdin, run, write JSON


def _wait_go() -> None:
    print("ready", flush=True)
    line = sys.stdin.readline()
    if line.strip() != "go":
        sys.exit(0)


class Consumer:
    """What a trainer does with a batch before the device copy: copy it into a reusable staging buffer."""

    def __init__(self, keep_first: Optional[Path]):
        self.buf: Optional[np.ndarray] = None
        self.keep_first = keep_first
        self.waits: List[float] = []
        self.clips = 0
        self.frames = 0
        self.nbytes = 0

    def take(self, arr: np.ndarray, wait: float) -> None:
        if self.buf is None or self.buf.shape != arr.shape:
            self.buf = np.empty(arr.shape, arr.dtype)
        np.copyto(self.buf, arr)
        if self.keep_first is not None:
            np.save(self.keep_first, self.buf)
            self.keep_first = None
        self.waits.append(wait)
        self.clips += arr.shape[0]
        self.frames += arr.shape[0] * arr.shape[1]
        self.nbytes += arr.nbytes


def vserve_rank(spec: Dict[str, Any]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from vserve_client import Client

    keep = Path(spec["keep_first"]) if spec.get("keep_first") else None
    consumer = Consumer(keep)
    records: List[Dict[str, Any]] = []
    local = threading.local()

    def client() -> Any:
        if not hasattr(local, "c"):
            local.c = Client(spec["addr"], transport=spec.get("transport", "auto"))
        return local.c

    first = client()
    first.list_datasets()  # connected before "go"
    if spec["kind"] == "get_clips":
        pool = ThreadPoolExecutor(spec.get("inflight", 2))
        pool.submit(lambda: client().list_datasets()).result()
    _wait_go()
    t0, c0 = time.time(), self_cpu()
    if spec["kind"] == "stream":
        stream = first.stream(DATASET, **spec["stream"])
        while True:
            w0 = time.perf_counter()
            try:
                b = next(stream)
            except StopIteration:
                break
            wait = time.perf_counter() - w0
            consumer.take(b.array, wait)
            for i, c in enumerate(b.clips):
                crop = c.get("crop") or {}
                records.append(
                    {
                        "batch": b.batch,
                        "video": b.videos[i],
                        "frames": [int(x) for x in b.frames[i]],
                        "crop": [crop.get("x", 0), crop.get("y", 0), crop.get("width", 0), crop.get("height", 0)],
                        "flip": bool(c.get("flipped")),
                    }
                )
            b.release()
    else:
        transform = spec["transform"]

        def fetch(req: List[Any]) -> Any:
            return client().get_clips(DATASET, [(v, f) for v, f in req], **transform)

        reqs = spec["requests"]
        depth = spec.get("inflight", 2)
        futures = [pool.submit(fetch, r) for r in reqs[:depth]]
        nxt = depth
        for _ in range(len(reqs)):
            w0 = time.perf_counter()
            b = futures.pop(0).result()
            wait = time.perf_counter() - w0
            if nxt < len(reqs):
                futures.append(pool.submit(fetch, reqs[nxt]))
                nxt += 1
            consumer.take(b.array, wait)
            b.release()
        pool.shutdown()
    t1, c1 = time.time(), self_cpu()
    Path(spec["out"]).write_text(
        json.dumps(
            {
                "start": t0,
                "end": t1,
                "cpu": c1 - c0,
                "waits": consumer.waits,
                "clips": consumer.clips,
                "frames": consumer.frames,
                "bytes": consumer.nbytes,
                "records": records,
            }
        )
    )


# -- peers ---------------------------------------------------------------------------------------------


#: Groups whose frames meet across a keyframe (at most this many frames between) are decoded in one pass,
#: as vserve's plan does (src/plan.rs MERGE_GAP): a second seek would decode that keyframe twice.
MERGE_GAP = 4


def _runs(frames: List[int], keyframes: List[int]) -> List[Tuple[int, List[int]]]:
    """Wanted frames grouped by the keyframe before them, (keyframe, [frames]) in order, with groups that
    meet across a keyframe (``MERGE_GAP``) joined into one pass from the first one's keyframe."""
    import bisect

    runs: Dict[int, List[int]] = {}
    for f in sorted(set(frames)):
        k = keyframes[bisect.bisect_right(keyframes, f) - 1] if keyframes else 0
        runs.setdefault(k, []).append(f)
    out: List[Tuple[int, List[int]]] = []
    for k, fs in sorted(runs.items()):
        if out and k - out[-1][1][-1] - 1 <= MERGE_GAP:
            out[-1][1].extend(fs)
        else:
            out.append((k, fs))
    return out


def decode_pyav(clip: Dict[str, Any], stats: Dict[str, int], thread_type: Optional[str] = None) -> np.ndarray:
    import av

    size = clip.get("size")
    got: Dict[int, np.ndarray] = {}
    pts_of = clip["pts"]
    with av.open(clip["path"]) as container:
        stream = container.streams.video[0]
        if thread_type is not None:
            stream.thread_type = thread_type  # "AUTO": frame and slice threads, FFmpeg's choice of count
        if clip.get("all"):
            # Every frame: decode straight through, no seeking.
            frames = []
            for frame in container.decode(stream):
                stats["decoded"] += 1
                frames.append(frame.to_ndarray(format="rgb24"))
            return np.stack(frames)
        for key, wanted in _runs(clip["frames"], clip["keyframes"]):
            want = {pts_of[f]: f for f in wanted}
            container.seek(pts_of[key], stream=stream, backward=True, any_frame=False)
            last = pts_of[wanted[-1]]
            for frame in container.decode(stream):
                stats["decoded"] += 1
                f = want.get(frame.pts)
                if f is not None:
                    if size:
                        got[f] = frame.to_ndarray(
                            width=size[0], height=size[1], format="rgb24", interpolation="BILINEAR"
                        )
                    else:
                        got[f] = frame.to_ndarray(format="rgb24")
                if frame.pts is not None and frame.pts >= last:
                    break
            missing = [f for f in wanted if f not in got]
            if missing:
                raise RuntimeError(f"pyav: frames {missing} of {clip['path']} never came out")
    return np.stack([got[f] for f in clip["frames"]])


def decode_pyav_auto(clip: Dict[str, Any], stats: Dict[str, int]) -> np.ndarray:
    return decode_pyav(clip, stats, thread_type="AUTO")


def decode_decord(clip: Dict[str, Any], stats: Dict[str, int]) -> np.ndarray:
    import decord

    size = clip.get("size")
    if size:
        vr = decord.VideoReader(clip["path"], width=size[0], height=size[1], num_threads=1)
    else:
        vr = decord.VideoReader(clip["path"], num_threads=1)
    frames = list(range(len(vr))) if clip.get("all") else clip["frames"]
    out = vr.get_batch(frames)
    # 'native' bridge: a decord NDArray, copied out by asnumpy(); 'torch' bridge (decord-torch): a torch
    # tensor on decord's memory (DLPack, no copy), viewed as NumPy.
    return out.numpy() if hasattr(out, "numpy") else out.asnumpy()


def _torchcodec_transforms(size: Optional[List[int]], shape: Tuple[int, int]) -> Optional[List[Any]]:
    """TorchCodec's decoder-side resize (FFmpeg's swscale inside the decoder, before the RGB tensor is made),
    where this TorchCodec has it (``VideoDecoder(transforms=...)``, 0.17); None: resize afterwards."""
    if not size or (shape[1], shape[0]) == tuple(size):
        return None
    try:
        from torchcodec.transforms import Resize
    except ImportError:
        return None
    return [Resize(size=(size[1], size[0]))]


def decode_torchcodec(clip: Dict[str, Any], stats: Dict[str, int], seek_mode: str = "exact") -> np.ndarray:
    import torch
    from torchcodec.decoders import VideoDecoder

    size = clip.get("size")
    kw: Dict[str, Any] = dict(seek_mode=seek_mode, num_ffmpeg_threads=1)
    transforms = _torchcodec_transforms(size, (clip.get("height", 0), clip.get("width", 0))) if size else None
    if transforms:
        kw["transforms"] = transforms
    dec = VideoDecoder(clip["path"], **kw)
    frames = list(range(len(dec))) if clip.get("all") else clip["frames"]
    x = dec.get_frames_at(frames).data  # [T, C, H, W] uint8
    if size and (x.shape[3], x.shape[2]) != tuple(size):
        x = torch.nn.functional.interpolate(x.float(), size=(size[1], size[0]), mode="bilinear")
        x = x.round().clamp(0, 255).to(torch.uint8)
    return x.permute(0, 2, 3, 1).contiguous().numpy()


def decode_torchcodec_approx(clip: Dict[str, Any], stats: Dict[str, int]) -> np.ndarray:
    return decode_torchcodec(clip, stats, seek_mode="approximate")


def decode_spdl(clip: Dict[str, Any], stats: Dict[str, int]) -> np.ndarray:
    """SPDL (spdl.io): demux the file, ``sample_decode_video`` decodes the GOP runs the indices need (frame
    index = the frame's index in presentation order) with no filter, then one FFmpeg filter graph resizes
    (``scale`` bilinear) and converts only the wanted frames to RGB24; one decoder thread. (Passing the
    resize as ``sample_decode_video``'s ``filter_desc`` filters every decoded frame of the runs: 1.9x
    slower on uniform.) Whole videos: ``decode_packets`` with the filter."""
    import spdl.io

    size = clip.get("size")
    cfg = spdl.io.decode_config(decoder_options={"threads": "1"})
    packets = spdl.io.demux_video(clip["path"])
    if clip.get("all"):
        filter_desc = spdl.io.get_video_filter_desc(
            scale_width=size[0] if size else None,
            scale_height=size[1] if size else None,
            scale_algo="bilinear",
            scale_mode=None,
            pix_fmt="rgb24",
        )
        frames = spdl.io.decode_packets(packets, filter_desc=filter_desc, decode_config=cfg)
        return spdl.io.to_numpy(spdl.io.convert_frames(frames))
    source = spdl.io.get_buffer_desc(packets.codec)  # read before sampling consumes the packets
    wanted = sorted(set(clip["frames"]))
    raw = spdl.io.sample_decode_video(packets, wanted, filter_desc=None, decode_config=cfg)
    scale = f"scale={size[0]}:{size[1]}:flags=bilinear," if size else ""
    graph = spdl.io.FilterGraph(f"{source},{scale}format=rgb24,buffersink")
    for f in raw:
        graph.add_frames(f)
    graph.flush()
    arr = spdl.io.to_numpy(spdl.io.convert_frames(graph.get_frames()))
    pos = {f: i for i, f in enumerate(wanted)}
    return arr[[pos[f] for f in clip["frames"]]]


DECODERS = {
    "pyav": decode_pyav,
    "pyav-auto": decode_pyav_auto,
    "decord": decode_decord,
    "decord-torch": decode_decord,
    "torchcodec": decode_torchcodec,
    "torchcodec-approx": decode_torchcodec_approx,
    "spdl": decode_spdl,
}
#: What each peer imports (the rank imports it before forking its workers, as a training script would).
PEER_MODULES = {
    "pyav": "av",
    "pyav-auto": "av",
    "decord": "decord",
    "decord-torch": "decord",
    "torchcodec": "torchcodec.decoders",
    "torchcodec-approx": "torchcodec.decoders",
    "spdl": "spdl.io",
}


def peer_setup(system: str) -> None:
    """Per-process settings each peer runs best with (in the rank and again in each worker)."""
    if system.startswith("torchcodec"):
        import torch

        # One intra-op thread per process: the pool's W processes already use the W cores; torch's default
        # (a thread per core in every worker) only adds contention (the resize fallback, tensor copies).
        torch.set_num_threads(1)
    elif system == "decord-torch":
        import decord

        decord.bridge.set_bridge("torch")


def finish_clip(arr: np.ndarray, clip: Dict[str, Any]) -> np.ndarray:
    crop = clip.get("crop")
    if crop and crop[2]:
        x, y, w, h = crop
        arr = arr[:, y : y + h, x : x + w]
    if clip.get("flip"):
        arr = arr[:, :, ::-1]
    return arr


def peer_worker(system: str, tasks: Any, results: Any) -> None:
    """A DataLoader-style worker: batches in, names of shared-memory batches out."""
    from multiprocessing import resource_tracker, shared_memory

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    peer_setup(system)
    decode = DECODERS[system]
    c0 = None
    while True:
        task = tasks.get()
        if task is None:
            break
        if c0 is None:
            c0 = self_cpu()
        idx, clips = task
        stats = {"decoded": 0}
        try:
            arrays = [finish_clip(decode(c, stats), c) for c in clips]
            shape = (len(arrays),) + arrays[0].shape
            shm = shared_memory.SharedMemory(create=True, size=int(np.prod(shape)))
            # The rank owns it from here (it unlinks it after use), as with torch's shared tensors.
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
            out = np.ndarray(shape, np.uint8, buffer=shm.buf)
            for i, a in enumerate(arrays):  # collate, as default_collate writes into shared memory
                out[i] = a
            del out
            results.put((idx, shm.name, shape, stats["decoded"], None))
            shm.close()
        except Exception as e:  # noqa: BLE001 - reported to the rank, which fails the run
            results.put((idx, None, None, 0, f"{type(e).__name__}: {e}"))
    results.put(("cpu", self_cpu() - (c0 if c0 is not None else self_cpu())))


def peer_rank(spec: Dict[str, Any]) -> None:
    import multiprocessing as mp
    from multiprocessing import shared_memory

    ctx = mp.get_context("fork")
    system, workers, prefetch = spec["system"], spec["workers"], spec.get("prefetch", 2)
    # Import the decoder library before forking, as a training script would have.
    __import__(PEER_MODULES[system])
    peer_setup(system)
    batches = spec["batches"]
    task_qs = [ctx.Queue() for _ in range(workers)]
    results = ctx.Queue()
    procs = [ctx.Process(target=peer_worker, args=(system, task_qs[w], results)) for w in range(workers)]
    for p in procs:
        p.start()
    keep = Path(spec["keep_first"]) if spec.get("keep_first") else None
    consumer = Consumer(keep)
    _wait_go()
    t0, c0 = time.time(), self_cpu()
    sent = 0
    decoded = 0

    def send_next() -> None:
        nonlocal sent
        if sent < len(batches):
            task_qs[sent % workers].put((sent, batches[sent]))
            sent += 1

    for _ in range(min(len(batches), prefetch * workers)):
        send_next()
    ready: Dict[int, Tuple[str, Tuple[int, ...]]] = {}
    for i in range(len(batches)):
        w0 = time.perf_counter()
        while i not in ready:
            idx, name, shape, dec, err = results.get()
            if err is not None:
                raise RuntimeError(f"{system} worker: batch {idx}: {err}")
            ready[idx] = (name, shape)
            decoded += dec
        wait = time.perf_counter() - w0
        name, shape = ready.pop(i)
        send_next()
        shm = shared_memory.SharedMemory(name=name)
        arr = np.ndarray(shape, np.uint8, buffer=shm.buf)
        consumer.take(arr, wait)
        del arr
        shm.close()
        shm.unlink()
    t1, c1 = time.time(), self_cpu()
    for q in task_qs:
        q.put(None)
    worker_cpu = 0.0
    got = 0
    while got < workers:
        msg = results.get()
        if msg[0] == "cpu":
            worker_cpu += msg[1]
            got += 1
    for p in procs:
        p.join()
    Path(spec["out"]).write_text(
        json.dumps(
            {
                "start": t0,
                "end": t1,
                "cpu": (c1 - c0) + worker_cpu,
                "waits": consumer.waits,
                "clips": consumer.clips,
                "frames": consumer.frames,
                "bytes": consumer.nbytes,
                "decoded": decoded if system.startswith("pyav") else None,
            }
        )
    )


# ------------------------------------------------------------------------------------------------------
# Running one (workload, system) measurement


def run_ranks(specs: List[Dict[str, Any]], mode: str, daemon: Optional[Daemon], workdir: Path) -> Dict[str, Any]:
    """Starts one process per spec, waits for all to be ready, says go, samples memory, gathers results."""
    procs = []
    for i, spec in enumerate(specs):
        spec = dict(spec, out=str(workdir / f"rank{i}.json"))
        path = workdir / f"spec{i}.json"
        path.write_text(json.dumps(spec))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), mode, str(path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "ready":
            for q in procs:
                q.kill()
            raise RuntimeError(f"{mode}: a rank did not start (said {line!r})")
    roots = [p.pid for p in procs] + ([daemon.proc.pid] if daemon else [])
    minus = (lambda: daemon.stats()["cache_bytes"]) if daemon else None
    sampler = PssSampler(roots, minus, PSS_PERIOD)
    stats0 = daemon.stats() if daemon else None
    cpu0 = daemon.cpu() if daemon else 0.0
    sampler.start()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        p.wait()
    sampler.stop()
    cpu1 = daemon.cpu() if daemon else 0.0
    stats1 = daemon.stats() if daemon else None
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"{mode}: a rank failed ({[p.returncode for p in procs]})")
    ranks = [json.loads((workdir / f"rank{i}.json").read_text()) for i in range(len(specs))]
    wall = max(r["end"] for r in ranks) - min(r["start"] for r in ranks)
    waits = [w for r in ranks for w in r["waits"]]
    clips = sum(r["clips"] for r in ranks)
    frames = sum(r["frames"] for r in ranks)
    cpu = sum(r["cpu"] for r in ranks) + (cpu1 - cpu0)
    out = {
        "seconds": wall,
        "clips": clips,
        "frames": frames,
        "bytes": sum(r["bytes"] for r in ranks),
        "clips_per_s": clips / wall if wall else None,
        "frames_per_s": frames / wall if wall else None,
        "batches": len(waits),
        "wait_p50_ms": (percentile(waits, 0.5) or 0) * 1e3,
        "wait_p99_ms": (percentile(waits, 0.99) or 0) * 1e3,
        "waits": waits,
        "cpu_s_per_clip": cpu / clips if clips else None,
        "peak_pss_mb": sampler.peak / 1e6,
        "peak_pss_with_cache_mb": sampler.peak_raw / 1e6,
        "records": [rec for r in ranks for rec in r.get("records", [])],
    }
    if daemon:
        delta = {k: stats1[k] - stats0[k] for k in ("frames_decoded", "frames_skipped", "cache_hits", "cache_misses", "shared_frames")}
        out["daemon"] = delta
        out["decoded_per_delivered"] = delta["frames_decoded"] / frames if frames else None
    else:
        dec = [r.get("decoded") for r in ranks]
        out["decoded_per_delivered"] = sum(dec) / frames if frames and all(d is not None for d in dec) else None
    return out


# ------------------------------------------------------------------------------------------------------
# Workload plans


def train_stream_args(rank: int, ranks: int, seed: int, epoch: int = 0) -> Dict[str, Any]:
    return dict(
        sampler="random-indices",
        num_clips=1,
        num_frames_per_clip=8,
        num_indices_between_frames=4,
        short_side=256,
        random_crop=(224, 224),
        random_hflip=True,
        batch_size=32,
        seed=seed,
        epoch=epoch,
        rank=rank,
        world_size=ranks,
        prefetch=2,
    )


def tsn_indices(n: int, k: int = 8) -> List[int]:
    return [((2 * i + 1) * n) // (2 * k) for i in range(k)]


def clip_spec(root: Path, video: str, info: Dict[str, Any], frames: List[int], size, crop=None, flip=False, all_frames=False):
    return {
        "path": str(root / video),
        "frames": frames,
        "pts": info["pts"],
        "keyframes": info["keyframes"],
        "size": list(size) if size else None,
        "width": info["width"],
        "height": info["height"],
        "crop": crop,
        "flip": flip,
        "all": all_frames,
    }


def floor_plan(workload: str, root: Path, infos: Dict[str, Dict[str, Any]], clips: List[Tuple[str, List[int], Tuple[int, int]]], whole: bool = False) -> Dict[str, Any]:
    """The GOP runs `clips` need, as benches/floor.rs reads them. `whole`: one run per clip from frame 0."""
    names = sorted({c[0] for c in clips})
    vid = {n: i for i, n in enumerate(names)}
    videos = [
        {"rel": n, "stream": infos[n]["stream"], "time_base": infos[n]["time_base"], "pts": infos[n]["pts"]}
        for n in names
    ]
    runs = []
    slot_base: Dict[str, int] = {}
    for video, frames, size in clips:
        base = slot_base.get(video, 0)
        slot_base[video] = base + len(frames)
        slots = {f: base + i for i, f in enumerate(frames)}
        groups = [(0, sorted(set(frames)))] if whole else _runs(frames, infos[video]["keyframes"])
        for key, wanted in groups:
            runs.append(
                {"video": vid[video], "keyframe": key, "wanted": [[slots[f], f] for f in wanted], "out_size": list(size)}
            )
    return {"root": str(root), "videos": videos, "runs": runs, "workload": workload}


def run_floor(args, plan: Dict[str, Any], workdir: Path, clips: int, frames: int) -> Dict[str, Dict[str, Any]]:
    if args.floor_bin is None:
        return {}
    path = workdir / f"floor-plan-{plan['workload']}.json"
    path.write_text(json.dumps(plan))
    out = subprocess.run(
        [str(args.floor_bin), str(path), "--threads", str(args.cores)], check=True, capture_output=True, text=True
    ).stdout
    res = {}
    for p in json.loads(out)["passes"]:
        s = p["seconds"]
        res[p["mode"]] = {
            "seconds": s,
            "clips": clips,
            "frames": frames,
            "clips_per_s": clips / s,
            "frames_per_s": frames / s,
            "cpu_s_per_clip": p["cpu_seconds"] / clips,
            "decoded_per_delivered": p["frames_decoded"] / max(1, p["frames_out"]),
            "restarts": p["restarts"],
        }
    return res


# ------------------------------------------------------------------------------------------------------
# The `run` command


def available_peers(wanted: List[str]) -> List[str]:
    out = []
    for s in wanted:
        if s == "vserve":
            continue
        mod = PEER_MODULES[s]
        try:
            __import__(mod)
            out.append(s)
        except Exception as e:  # noqa: BLE001 - optional peers
            log(f"peer {s} skipped: cannot import {mod} ({e})")
    return out


def compare_first_batches(workdir: Path, names: List[str]) -> Dict[str, Any]:
    """Per peer, how its first batch (rank 0) differs from vserve's: the same clips, so small differences
    come only from colour conversion and resize arithmetic; a wrong frame shows as a large mean."""
    ref_path = workdir / "first-vserve.npy"
    if not ref_path.exists():
        return {}
    ref = np.load(ref_path).astype(np.int16)
    out = {}
    for n in names:
        p = workdir / f"first-{n}.npy"
        if not p.exists():
            continue
        a = np.load(p).astype(np.int16)
        if a.shape != ref.shape:
            out[n] = {"shape": list(a.shape), "vserve_shape": list(ref.shape)}
            continue
        d = np.abs(a - ref)
        per_frame = d.reshape(d.shape[0] * d.shape[1], -1).mean(axis=1)
        out[n] = {
            "max_abs": int(d.max()),
            "mean_abs": float(d.mean()),
            "identical_frames": int((d.reshape(len(per_frame), -1).max(axis=1) == 0).sum()),
            "frames_mean_abs_over_5": int((per_frame > 5).sum()),
            "frames": len(per_frame),
        }
    return out


def write_manifest(work: Path, videos: List[str]) -> Path:
    """The dataset the daemon streams: exactly the chosen videos, labelled by their source footage."""
    path = work / "manifest.csv"
    path.write_text("path,label\n" + "".join(f"{v},{v.split('_')[0]}\n" for v in videos))
    return path


def run_variant(args, variant: str, root: Path, outdir: Path, memo: Dict[str, Any]) -> Dict[str, Any]:
    """One trial of every workload on one corpus variant. `memo` is shared by the variant's trials (trial 1's
    train clips, which later trials' peers replay first under --counterbalance)."""
    videos = sorted(p.name for p in root.glob("*.mp4") if not p.name.startswith("."))[: args.clips]
    work = outdir / "work" / variant
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    peers = available_peers(args.systems)
    results: Dict[str, Any] = {"videos": len(videos), "workloads": {}}
    ranks = args.ranks
    dlog = outdir / f"daemon-{variant}.log"
    manifest = write_manifest(work, videos)

    def fresh_daemon(cache: Optional[str] = None) -> Tuple[Daemon, Dict[str, Dict[str, Any]]]:
        d = Daemon(args.vserve_bin, root, args.cores, cache or args.cache, dlog, manifest, args.daemon_arg)
        try:
            infos = probe_all(d, videos)  # builds the index, untimed (the peers get the same tables)
        except BaseException:
            d.stop()  # a failed probe must not leave the daemon running
            raise
        return d, infos

    def peer_runs(workload: str, batches_per_rank: List[List[List[Dict[str, Any]]]], wl: Dict[str, Any], prefix: str):
        workers = max(1, args.cores // len(batches_per_rank))
        for system in peers:
            wd = work / f"{prefix}-{system}"
            wd.mkdir()
            specs = [
                dict(system=system, workers=workers, batches=b, keep_first=str(work / f"{prefix}-first-{system}.npy") if r == 0 else None)
                for r, b in enumerate(batches_per_rank)
            ]
            log(f"{variant} {workload}: {system} ({len(batches_per_rank)} ranks x {workers} workers)")
            res = run_ranks(specs, "_peer-rank", None, wd)
            res.pop("records")
            wl["systems"][system] = res

    def finish(workload: str, wl: Dict[str, Any], prefix: str) -> None:
        names = list(wl["systems"])
        if (work / f"{prefix}-first-vserve.npy").exists():
            for n in names:
                src = work / f"{prefix}-first-{n}.npy"
                if src.exists():
                    shutil.copy(src, work / f"first-{n}.npy")
            wl["first_batch_vs_vserve"] = compare_first_batches(work, [n for n in names if n != "vserve"])
            for n in names:
                (work / f"first-{n}.npy").unlink(missing_ok=True)
        v = wl["systems"].get("vserve")
        if v:
            wl["ratios"] = {
                f"vserve/{n}": v["clips_per_s"] / s["clips_per_s"] for n, s in wl["systems"].items() if n != "vserve"
            }
        results["workloads"][workload] = wl
        (outdir / "results.partial.json").write_text(json.dumps(results, default=str))

    # -- train (cold), then warm on the same daemon -----------------------------------------------------
    # The peers and the floor replay exactly the clips vserve's stream drew. Trial 1 runs vserve first and
    # the others on its clips; with --counterbalance (the default), every second trial runs the peers and
    # the floor first on trial 1's clips (the same seed draws the same clips; checked), then vserve: on a
    # machine where position in a trial matters, no system always has the same place.
    steady: Optional[Dict[str, Any]] = None
    if "train" in args.workloads or "warm" in args.workloads or "steady" in args.workloads:
        trial = memo["trials"] = memo.get("trials", 0) + 1
        prior_records = memo.get("train_records") if args.counterbalance and trial % 2 == 0 else None
        wl: Dict[str, Any] = {"systems": {}, "order": "peers first" if prior_records else "vserve first"}

        def replay(records: List[Dict[str, Any]], counts: List[int]) -> None:
            per_rank: List[List[List[Dict[str, Any]]]] = []
            by_batch: Dict[Tuple[int, int], List[Dict[str, Any]]] = {}
            # records come rank by rank (rank 0's first); split them back by counting batches per rank
            pos = 0
            for r, n in enumerate(counts):
                for rec in records[pos : pos + n]:
                    by_batch.setdefault((r, rec["batch"]), []).append(rec)
                pos += n
            for r in range(ranks):
                keys = sorted(k for k in by_batch if k[0] == r)
                per_rank.append(
                    [
                        [
                            clip_spec(root, rec["video"], infos[rec["video"]], rec["frames"],
                                      short_side_size(infos[rec["video"]]["width"], infos[rec["video"]]["height"], 256),
                                      rec["crop"], rec["flip"])
                            for rec in by_batch[k]
                        ]
                        for k in keys
                    ]
                )  # fmt: skip
            peer_runs("train", per_rank, wl, "train")
            floor_clips = [
                (rec["video"], rec["frames"], short_side_size(infos[rec["video"]]["width"], infos[rec["video"]]["height"], 256))
                for rec in records
            ]
            log(f"{variant} train: floor")
            frames = sum(len(rec["frames"]) for rec in records)
            wl["floor"] = run_floor(args, floor_plan("train", root, infos, floor_clips), work, len(records), frames)

        daemon, infos = fresh_daemon()
        try:
            if prior_records:
                replay(*prior_records)  # the daemon idles meanwhile: its index is built, nothing else
            specs = [
                dict(kind="stream", addr=daemon.addr, stream=train_stream_args(r, ranks, args.seed),
                     keep_first=str(work / "train-first-vserve.npy") if r == 0 else None)
                for r in range(ranks)
            ]  # fmt: skip
            (work / "train-vserve").mkdir()
            log(f"{variant} train: vserve ({ranks} ranks)")
            cold = run_ranks(specs, "_vserve-rank", daemon, work / "train-vserve")
            records = cold.pop("records")
            wl["systems"]["vserve"] = cold
            if "warm" in args.workloads:
                (work / "warm-vserve").mkdir()
                log(f"{variant} warm: vserve ({ranks} ranks, same seed)")
                specs_w = [dict(s, keep_first=None) for s in specs]
                warm = run_ranks(specs_w, "_vserve-rank", daemon, work / "warm-vserve")
                warm.pop("records")
                results["workloads"]["warm"] = {
                    "systems": {"vserve": warm},
                    "ratios": {"warm/cold": warm["clips_per_s"] / cold["clips_per_s"]},
                }
        finally:
            daemon.stop()
        counts = [len(json.loads((work / "train-vserve" / f"rank{r}.json").read_text())["records"]) for r in range(ranks)]
        if prior_records and (records, counts) != tuple(prior_records):
            raise RuntimeError(f"{variant} train: the stream drew other clips than in trial 1; the peers replayed those")
        memo.setdefault("train_records", (records, counts))
        if "steady" in args.workloads:
            daemon, _ = fresh_daemon(args.steady_cache)
            try:
                for e in range(1, args.steady_epochs + 1):
                    (work / f"steady-epoch{e}").mkdir()
                    log(f"{variant} steady: vserve, untimed epoch {e} of {args.steady_epochs} (cache {args.steady_cache})")
                    epoch = [dict(s, addr=daemon.addr, keep_first=None, stream=train_stream_args(r, ranks, args.seed, epoch=e)) for r, s in enumerate(specs)]
                    run_ranks(epoch, "_vserve-rank", daemon, work / f"steady-epoch{e}")
                (work / "steady-vserve").mkdir()
                log(f"{variant} steady: vserve ({ranks} ranks, the train clips)")
                steady_specs = [
                    dict(s, addr=daemon.addr, keep_first=str(work / "steady-first-vserve.npy") if r == 0 else None) for r, s in enumerate(specs)
                ]
                steady = run_ranks(steady_specs, "_vserve-rank", daemon, work / "steady-vserve")
                steady.pop("records")
            finally:
                daemon.stop()
        if not prior_records:
            replay(records, counts)
        wl["ratios_floor"] = {f"vserve/{m}": cold["clips_per_s"] / f["clips_per_s"] for m, f in wl["floor"].items()}
        finish("train", wl, "train")
        if steady is not None:
            # Same clips, so the same pixels from frame buffers, arenas and decoders recycled through two epochs.
            shutil.copy(work / "train-first-vserve.npy", work / "first-vserve.npy")
            shutil.copy(work / "steady-first-vserve.npy", work / "first-steady.npy")
            cmp = compare_first_batches(work, ["steady"])
            for n in ("vserve", "steady"):
                (work / f"first-{n}.npy").unlink(missing_ok=True)
            results["workloads"]["steady"] = steady_workload(steady, wl, cmp)
            (outdir / "results.partial.json").write_text(json.dumps(results, default=str))

    # -- shared: 4 jobs reading the same clips ------------------------------------------------------------
    if "shared" in args.workloads:
        daemon, infos = fresh_daemon()
        try:
            jobs = args.shared_jobs
            specs = [dict(kind="stream", addr=daemon.addr, stream=train_stream_args(0, 1, args.seed + 1)) for _ in range(jobs)]
            (work / "shared-vserve").mkdir()
            log(f"{variant} shared: vserve ({jobs} jobs, same clips)")
            res = run_ranks(specs, "_vserve-rank", daemon, work / "shared-vserve")
            res.pop("records")
            (work / "shared-one").mkdir()
            daemon.stop()
            daemon, infos = fresh_daemon()
            log(f"{variant} shared: vserve (1 job, same clips, for the single-job ratio)")
            one = run_ranks([dict(specs[0], addr=daemon.addr)], "_vserve-rank", daemon, work / "shared-one")
            one.pop("records")
            results["workloads"]["shared"] = {
                "systems": {"vserve": res, "vserve, one job": one},
                "ratios": {
                    "decoded/delivered": res["decoded_per_delivered"],
                    "vs one job": res["decoded_per_delivered"] / one["decoded_per_delivered"],
                },
            }
        finally:
            daemon.stop()

    # -- uniform: TSN 8 frames, short side 224 --------------------------------------------------------------
    for workload in ("uniform", "full"):
        if workload not in args.workloads:
            continue
        daemon, infos = fresh_daemon()
        wl = {"systems": {}}
        try:
            if workload == "uniform":
                chosen = videos
                clips = [(v, tsn_indices(infos[v]["frames"])) for v in chosen]
                per_req = 32
                transform = {"short_side": 224}
                sizes = {v: short_side_size(infos[v]["width"], infos[v]["height"], 224) for v in chosen}
            else:
                chosen = videos[: args.full_videos]
                clips = [(v, list(range(infos[v]["frames"]))) for v in chosen]
                per_req = 1
                transform = {}
                sizes = {v: (infos[v]["width"], infos[v]["height"]) for v in chosen}
            reqs = [clips[i : i + per_req] for i in range(0, len(clips), per_req)]
            # Requests dealt round-robin to the ranks, as a DistributedSampler deals samples.
            rank_reqs = [reqs[r::ranks] for r in range(ranks)]
            specs = [
                dict(kind="get_clips", addr=daemon.addr, requests=rank_reqs[r], transform=transform, inflight=args.inflight,
                     keep_first=str(work / f"{workload}-first-vserve.npy") if r == 0 else None)
                for r in range(ranks)
            ]  # fmt: skip
            (work / f"{workload}-vserve").mkdir()
            log(f"{variant} {workload}: vserve ({ranks} ranks)")
            res = run_ranks(specs, "_vserve-rank", daemon, work / f"{workload}-vserve")
            res.pop("records")
            wl["systems"]["vserve"] = res
        finally:
            daemon.stop()
        per_rank = [
            [
                [
                    clip_spec(root, v, infos[v], f, sizes[v] if workload == "uniform" else None, all_frames=workload == "full")
                    for v, f in req
                ]
                for req in rr
            ]
            for rr in rank_reqs
        ]  # fmt: skip
        peer_runs(workload, per_rank, wl, workload)
        log(f"{variant} {workload}: floor")
        nclips = len(clips)
        nframes = sum(len(f) for _, f in clips)
        plan = floor_plan(workload, root, infos, [(v, f, sizes[v]) for v, f in clips], whole=workload == "full")
        wl["floor"] = run_floor(args, plan, work, nclips, nframes)
        wl["ratios_floor"] = {
            f"vserve/{m}": wl["systems"]["vserve"]["clips_per_s"] / f["clips_per_s"] for m, f in wl["floor"].items()
        }
        finish(workload, wl, workload)
    return results


def steady_workload(steady: Dict[str, Any], train: Dict[str, Any], first: Dict[str, Any]) -> Dict[str, Any]:
    """The steady row with its ratios against the train workload's peers and floors (the same clips), and
    its first batch against the cold daemon's (`first`: compare_first_batches, keyed "steady")."""
    rate = steady["clips_per_s"]
    return {
        "systems": {"vserve": steady},
        "first_batch_vs_vserve": {"vserve (cold train)" if k == "steady" else k: v for k, v in first.items()},
        "ratios": {
            **{f"vserve/{n}": rate / s["clips_per_s"] for n, s in train["systems"].items() if n != "vserve"},
            "steady/cold": rate / train["systems"]["vserve"]["clips_per_s"],
        },
        "ratios_floor": {f"vserve/{m}": rate / f["clips_per_s"] for m, f in (train.get("floor") or {}).items()},
    }


def merge_best(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Keeps, per workload and system (floors included), the trial with the most clips/s (other load on
    the machine only ever slows a system down), then recomputes the ratios from the kept rows."""
    best = json.loads(json.dumps(runs[0], default=str))
    best["trials"] = len(runs)
    for r in runs[1:]:
        for wname, wl in r["workloads"].items():
            bw = best["workloads"].setdefault(wname, wl)
            for part in ("systems", "floor"):
                for name, row in (wl.get(part) or {}).items():
                    have = bw.setdefault(part, {}).get(name)
                    if have is None or (row.get("clips_per_s") or 0) > (have.get("clips_per_s") or 0):
                        bw[part][name] = row
    for wname, wl in best["workloads"].items():
        v = wl["systems"].get("vserve")
        if wname in ("train", "uniform", "full") and v:
            wl["ratios"] = {f"vserve/{n}": v["clips_per_s"] / s["clips_per_s"] for n, s in wl["systems"].items() if n != "vserve"}
            wl["ratios_floor"] = {f"vserve/{m}": v["clips_per_s"] / f["clips_per_s"] for m, f in (wl.get("floor") or {}).items()}
    warm, train = best["workloads"].get("warm"), best["workloads"].get("train")
    if warm and train:
        warm["ratios"] = {"warm/cold": warm["systems"]["vserve"]["clips_per_s"] / train["systems"]["vserve"]["clips_per_s"]}
    if train:
        train["orders"] = [(r["workloads"].get("train") or {}).get("order") for r in runs]
    steady = best["workloads"].get("steady")
    if steady and train:
        # Every trial's comparison must hold: the one kept is the worst.
        cmps = [c for r in runs for c in (r["workloads"].get("steady") or {}).get("first_batch_vs_vserve", {}).values()]
        worst = max(cmps, key=lambda c: (c.get("max_abs", 1 << 30), -c.get("identical_frames", 0)), default=None)
        best["workloads"]["steady"] = steady_workload(steady["systems"]["vserve"], train, {"steady": worst} if worst else {})
    # Each trial's own ratios too: its systems ran minutes apart, the best rows of different trials may
    # not have (the machine drifts), so the spread of these is the honest error bar on the kept ratios.
    for wname, wl in best["workloads"].items():
        per: Dict[str, List[float]] = {}
        for r in runs:
            rw = r["workloads"].get(wname) or {}
            for k, v in {**rw.get("ratios", {}), **rw.get("ratios_floor", {})}.items():
                per.setdefault(k, []).append(v)
        if len(runs) > 1 and per:
            wl["trial_ratios"] = per
    return best


def cmd_run(args) -> None:
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    dirs = refcorpus.build(
        REPO.parent / "shared" / "media", REPO / "target" / "bench-corpus", args.clips, variants=args.variants
    )
    report: Dict[str, Any] = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "variants": {}}
    for variant in args.variants:
        runs = []
        memo: Dict[str, Any] = {}
        for rep in range(args.repeat):
            if args.repeat > 1:
                log(f"{variant}: trial {rep + 1} of {args.repeat}")
            runs.append(run_variant(args, variant, dirs[variant], outdir, memo))
        report["variants"][variant] = merge_best(runs)
        (outdir / "results.json").write_text(json.dumps(report, indent=1, default=str))
    write_report(report, outdir)


def machine() -> Dict[str, Any]:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    vers = {}
    for mod in ("av", "decord", "torchcodec", "torch", "spdl", "numpy", "grpc"):
        try:
            vers[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            vers[mod] = None
    ff = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.split("\n")[0]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_at_start": os.getloadavg()[0],
        "python": sys.version.split()[0],
        "ffmpeg": ff,
        "versions": vers,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


# ------------------------------------------------------------------------------------------------------
# Open loop: Poisson arrivals, bounded queue


def evict_page_cache(root: Path) -> int:
    """Drops every corpus file's pages from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``: clean
    pages nobody maps go), so the next reads come from the disk. Returns the files evicted."""
    n = 0
    for p in sorted(root.glob("*.mp4")):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


def cached_fraction(root: Path) -> float:
    """The fraction of the corpus's pages in the page cache now (mincore through a read-only mapping)."""
    import ctypes
    import mmap as _mmap

    libc = ctypes.CDLL(None, use_errno=True)
    total = resident = 0
    page = _mmap.PAGESIZE
    for p in sorted(root.glob("*.mp4")):
        size = p.stat().st_size
        if size == 0:
            continue
        with open(p, "rb") as f:
            m = _mmap.mmap(f.fileno(), size, access=_mmap.ACCESS_READ)
        try:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            arr = np.frombuffer(m, dtype=np.uint8)
            if libc.mincore(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(size), vec) == 0:
                resident += sum(v & 1 for v in vec)
                total += pages
            del arr
        finally:
            m.close()
    return resident / total if total else 0.0


def open_loop_rank(spec: Dict[str, Any]) -> None:
    """One rank of the open loop: Poisson arrivals at ``rate`` for ``duration`` s, at most ``queue``
    outstanding (an arrival finding ``queue`` outstanding is an overflow, dropped), one GetClips each."""
    from concurrent.futures import ThreadPoolExecutor

    from vserve_client import Client

    frames_of: Dict[str, int] = spec["frames"]
    videos = sorted(frames_of)
    rng = random.Random(spec["seed"])
    local = threading.local()

    def client() -> Any:
        if not hasattr(local, "c"):
            local.c = Client(spec["addr"])
        return local.c

    def one(req, t_arrival):
        b = client().get_clips(DATASET, [req], short_side=256, crop=(224, 224))
        b.release()
        return time.perf_counter() - t_arrival

    queue = spec["queue"]
    pool = ThreadPoolExecutor(queue)
    for f in [pool.submit(lambda: client().list_datasets()) for _ in range(queue)]:
        f.result()  # connect every thread before timing
    lock = threading.Lock()
    outstanding = [0]
    lat: List[float] = []
    failed = [0]
    overflow = 0

    def finished(fut):
        with lock:
            outstanding[0] -= 1
            try:
                lat.append(fut.result())
            except Exception as e:  # noqa: BLE001
                failed[0] += 1
                log(f"open loop: request failed: {e}")

    _wait_go()
    start = time.perf_counter()
    t = start
    arrivals = 0
    rate = spec["rate"]
    while True:
        t += rng.expovariate(rate)
        if t - start > spec["duration"]:
            break
        delay = t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        v = rng.choice(videos)
        n = frames_of[v]
        s0 = rng.randrange(0, max(1, n - 28))
        req = (v, [min(n - 1, s0 + 4 * i) for i in range(8)])
        arrivals += 1
        with lock:
            if outstanding[0] >= queue:
                overflow += 1
                continue
            outstanding[0] += 1
        pool.submit(one, req, t).add_done_callback(finished)
    while True:
        with lock:
            if outstanding[0] == 0:
                break
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    pool.shutdown()
    Path(spec["out"]).write_text(
        json.dumps({"arrivals": arrivals, "overflow": overflow, "latencies": lat, "failed": failed[0], "elapsed": elapsed})
    )


def cmd_open_loop(args) -> None:
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    dirs = refcorpus.build(
        REPO.parent / "shared" / "media", REPO / "target" / "bench-corpus", args.clips, variants=args.variants
    )
    reports = {}
    for variant in args.variants:
        reports[variant] = open_loop_variant(args, variant, dirs[variant], outdir)
    report = {
        "machine": machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "variants": reports,
    }
    (outdir / "open-loop.json").write_text(json.dumps(report, indent=1))
    write_open_loop_report(report, outdir)


def open_loop_variant(args, variant: str, root: Path, outdir: Path) -> Dict[str, Any]:
    """The open loop on one corpus variant: ``--ranks`` client processes share the offered rate and the
    queue bound (each rank offers rate / ranks with at most queue / ranks outstanding), against one daemon;
    ``--cold``: every corpus file evicted from the page cache before each rate."""
    videos = sorted(p.name for p in root.glob("*.mp4") if not p.name.startswith("."))[: args.clips]
    work = outdir / f"open-loop-{variant}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    daemon = Daemon(args.vserve_bin, root, args.cores, args.cache, outdir / f"daemon-open-loop-{variant}.log",
                    write_manifest(work, videos), args.daemon_arg)  # fmt: skip
    rows = []
    ranks = max(1, args.open_loop_ranks)
    try:
        infos = probe_all(daemon, videos)
        frames = {v: infos[v]["frames"] for v in videos}
        for i, rate in enumerate(args.rates):
            cached = None
            if args.cold:
                evict_page_cache(root)
                cached = cached_fraction(root)
            procs = []
            for r in range(ranks):
                spec = {
                    "addr": daemon.addr,
                    "frames": frames,
                    "rate": rate / ranks,
                    "duration": args.duration,
                    "queue": max(1, args.queue // ranks),
                    "seed": args.seed * 1000 + i * 10 + r,
                    "out": str(work / f"rate{i}-rank{r}.json"),
                }
                path = work / f"rate{i}-rank{r}.spec.json"
                path.write_text(json.dumps(spec))
                procs.append(
                    subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_open-loop-rank", str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
                )
            for p in procs:
                if p.stdout.readline().strip() != "ready":
                    for q in procs:
                        q.kill()
                    raise RuntimeError("open loop: a rank did not start")
            m0, s0 = daemon.metrics(), daemon.stats()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            for p in procs:
                p.wait()
            if any(p.returncode != 0 for p in procs):
                raise RuntimeError(f"open loop: a rank failed ({[p.returncode for p in procs]})")
            m1, s1 = daemon.metrics(), daemon.stats()
            parts = [json.loads((work / f"rate{i}-rank{r}.json").read_text()) for r in range(ranks)]
            lat = [x for p in parts for x in p["latencies"]]
            elapsed = max(p["elapsed"] for p in parts)
            overflow = sum(p["overflow"] for p in parts)
            hits = s1["cache_hits"] - s0["cache_hits"]
            misses = s1["cache_misses"] - s0["cache_misses"]
            row = {
                "rate": rate,
                "arrivals": sum(p["arrivals"] for p in parts),
                "completed": len(lat),
                "failed": sum(p["failed"] for p in parts),
                "overflow": overflow,
                "throughput": len(lat) / elapsed,
                "p50_ms": (percentile(lat, 0.5) or 0) * 1e3,
                "p99_ms": (percentile(lat, 0.99) or 0) * 1e3,
                "latencies": lat,
                "stages_ms": stage_means(m0, m1),
                "cache_hit_rate": hits / max(1, hits + misses),
                "page_cache_resident_at_start": cached,
            }
            rows.append(row)
            log(
                f"open loop {variant} {rate:.0f}/s ({ranks} ranks{', cold' if args.cold else ''}): "
                f"{row['throughput']:.1f}/s done, overflow {overflow}, p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms"
            )
    finally:
        daemon.stop()
    sustained = [r["rate"] for r in rows if r["overflow"] == 0]
    return {
        "variant": variant,
        "ranks": ranks,
        "cold": bool(args.cold),
        "rows": rows,
        "highest_rate_without_overflow": max(sustained) if sustained else None,
    }


def stage_means(m0: Dict[str, float], m1: Dict[str, float]) -> Dict[str, float]:
    """Mean ms per observation of each `*_seconds` histogram between two scrapes (labels summed)."""
    sums: Dict[str, List[float]] = {}
    for key, v1 in m1.items():
        name = key.split("{", 1)[0]
        for suffix, i in (("_sum", 0), ("_count", 1)):
            if name.endswith("_seconds" + suffix):
                base = name[: -len(suffix)].removeprefix("vserve_").removesuffix("_seconds").removesuffix("_duration")
                sums.setdefault(base, [0.0, 0.0])[i] += v1 - m0.get(key, 0.0)
    return {k: 1e3 * s / c for k, (s, c) in sums.items() if c > 0}


# ------------------------------------------------------------------------------------------------------
# Reports


def fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def write_report(report: Dict[str, Any], outdir: Path) -> None:
    lines = ["# vserve reference benchmark", ""]
    m = report["machine"]
    lines += [
        f"{m['date']}; {m['cpu']}, {m['cores']} cores, load {m['loadavg_at_start']:.2f} at start; {m['ffmpeg']}; "
        f"Python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
        "",
    ]
    for variant, res in report["variants"].items():
        lines += [f"## {variant} ({res['videos']} videos)", ""]
        for workload, wl in res["workloads"].items():
            lines += [f"### {workload}", ""]
            lines += [
                "| system | clips | seconds | clips/s | frames/s | batch wait p50 / p99 ms | CPU s/clip | peak PSS MB (cache excl.) | decoded/delivered |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for name, s in wl["systems"].items():
                lines.append(
                    f"| {name} | {s['clips']} | {fmt(s['seconds'])} | {fmt(s['clips_per_s'], 1)} | {fmt(s['frames_per_s'], 0)} | "
                    f"{fmt(s['wait_p50_ms'], 1)} / {fmt(s['wait_p99_ms'], 1)} | {fmt(s['cpu_s_per_clip'], 4)} | "
                    f"{fmt(s['peak_pss_mb'], 0)} | {fmt(s.get('decoded_per_delivered'))} |"
                )
            for name, f in (wl.get("floor") or {}).items():
                lines.append(
                    f"| {name} | {f['clips']} | {fmt(f['seconds'])} | {fmt(f['clips_per_s'], 1)} | {fmt(f['frames_per_s'], 0)} | "
                    f"- | {fmt(f['cpu_s_per_clip'], 4)} | - | {fmt(f['decoded_per_delivered'])} |"
                )
            ratios = {**wl.get("ratios", {}), **wl.get("ratios_floor", {})}
            if ratios:
                lines += ["", "Ratios: " + "; ".join(f"{k} = **{v:.2f}**" for k, v in ratios.items())]
            per = wl.get("trial_ratios")
            if per:
                lines += [
                    "",
                    "Per trial (each trial's systems back to back): "
                    + "; ".join(
                        f"{k} " + ", ".join(f"{v:.2f}" for v in vs) + f" (median {statistics.median(vs):.2f})"
                        for k, vs in per.items()
                    ),
                ]
            if wl.get("orders") and len(wl["orders"]) > 1:
                lines += ["", "Order in each trial: " + ", ".join(f"{o}" for o in wl["orders"])]
            cmp = wl.get("first_batch_vs_vserve")
            if cmp:
                lines += [
                    "",
                    "First batch against vserve's (same clips): "
                    + "; ".join(
                        f"{n}: mean |Δ| {fmt(c.get('mean_abs'), 3)}, max {c.get('max_abs')}, "
                        f"{c.get('identical_frames')}/{c.get('frames')} frames identical"
                        if "mean_abs" in c
                        else f"{n}: shape {c['shape']} vs {c['vserve_shape']}"
                        for n, c in cmp.items()
                    ),
                ]
            lines.append("")
    (outdir / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))
    try:
        plot(report, outdir)
    except Exception as e:  # noqa: BLE001 - plots are optional (matplotlib)
        log(f"plots skipped: {e}")


def plot(report: Dict[str, Any], outdir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for variant, res in report["variants"].items():
        wls = [w for w in ("train", "uniform", "full") if w in res["workloads"]]
        systems: List[str] = []
        for w in wls:
            for s in list(res["workloads"][w]["systems"]) + list(res["workloads"][w].get("floor", {})):
                if s not in systems:
                    systems.append(s)
        fig, axes = plt.subplots(1, len(wls), figsize=(4.5 * len(wls), 4), squeeze=False)
        for ax, w in zip(axes[0], wls):
            wl = res["workloads"][w]
            vals = []
            for s in systems:
                src = wl["systems"].get(s) or wl.get("floor", {}).get(s)
                vals.append(src["clips_per_s"] if src else 0)
            ax.bar(range(len(systems)), vals, color=["C0" if s == "vserve" else ("C7" if "floor" in s else "C1") for s in systems])
            ax.set_xticks(range(len(systems)))
            ax.set_xticklabels(systems, rotation=35, ha="right", fontsize=8)
            ax.set_title(f"{w} ({variant})")
            ax.set_ylabel("clips/s")
        fig.tight_layout()
        fig.savefig(outdir / f"throughput-{variant}.png", dpi=110)
        plt.close(fig)
        if "train" in res["workloads"]:
            fig, ax = plt.subplots(figsize=(6, 4))
            for name, s in res["workloads"]["train"]["systems"].items():
                w = sorted(x * 1e3 for x in s["waits"])
                if w:
                    ax.plot(w, [(i + 1) / len(w) for i in range(len(w))], label=name)
            ax.set_xscale("symlog", linthresh=1)
            ax.set_xlabel("batch wait (ms)")
            ax.set_ylabel("fraction of batches")
            ax.set_title(f"train batch wait CDF ({variant})")
            ax.legend()
            fig.tight_layout()
            fig.savefig(outdir / f"latency-cdf-{variant}.png", dpi=110)
            plt.close(fig)


def write_open_loop_report(report: Dict[str, Any], outdir: Path) -> None:
    lines = [
        "# vserve open-loop benchmark (Poisson arrivals, bounded queue)",
        "",
        f"{report['machine']['date']}; {report['machine']['cpu']}, {report['machine']['cores']} cores, "
        f"load {report['machine']['loadavg_at_start']:.2f} at start; queue bound {report['args']['queue']} (split over "
        f"the ranks), {report['args']['duration']} s per rate",
        "",
    ]
    for variant, vr in report["variants"].items():
        rows = vr["rows"]
        stages = sorted({k for r in rows for k in r["stages_ms"]})
        cold = vr["cold"]
        lines += [
            f"## {variant}: {vr['ranks']} rank(s){', page cache evicted before each rate' if cold else ''}",
            "",
            "| offered req/s | done/s | overflow | p50 ms | p99 ms | cache hits | "
            + ("corpus cached at start | " if cold else "")
            + " | ".join(f"{s} ms" for s in stages)
            + " |",
            "|---" * (6 + (1 if cold else 0) + len(stages)) + "|",
        ]
        for r in rows:
            lines.append(
                f"| {r['rate']:.0f} | {r['throughput']:.1f} | {r['overflow']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                f"{r['cache_hit_rate']:.2f} | "
                + (f"{r['page_cache_resident_at_start']:.2f} | " if cold else "")
                + " | ".join(fmt(r["stages_ms"].get(s), 2) for s in stages)
                + " |"
            )
        lines += ["", f"Highest offered rate with no overflow: **{vr['highest_rate_without_overflow']}** req/s", ""]
    (outdir / "open-loop.md").write_text("\n".join(lines))
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for variant, vr in report["variants"].items():
            rows = vr["rows"]
            ax.plot([r["rate"] for r in rows], [r["p50_ms"] for r in rows], "o-", label=f"{variant} p50")
            ax.plot([r["rate"] for r in rows], [r["p99_ms"] for r in rows], "o--", label=f"{variant} p99")
        ax.set_yscale("log")
        ax.set_xlabel("offered requests/s (Poisson)")
        ax.set_ylabel("latency (ms)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(outdir / "open-loop.png", dpi=110)
        plt.close(fig)
    except Exception as e:  # noqa: BLE001
        log(f"plot skipped: {e}")


# ------------------------------------------------------------------------------------------------------


def main() -> None:
    global PSS_PERIOD
    if len(sys.argv) == 3 and sys.argv[1] in ("_vserve-rank", "_peer-rank", "_open-loop-rank"):
        spec = json.loads(Path(sys.argv[2]).read_text())
        {"_vserve-rank": vserve_rank, "_peer-rank": peer_rank, "_open-loop-rank": open_loop_rank}[sys.argv[1]](spec)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["run", "open-loop"])
    ap.add_argument("--variants", default="gop250,gop1s")
    ap.add_argument("--workloads", default="train,warm,steady,shared,uniform,full")
    ap.add_argument(
        "--no-counterbalance", dest="counterbalance", action="store_false",
        help="train: run vserve first in every trial (default: every second trial runs the peers and the floor first, on trial 1's clips)",
    )
    ap.add_argument("--steady-cache", default="512M", help="steady: the frame cache of the daemon that streams other epochs first")
    ap.add_argument("--steady-epochs", type=int, default=2, help="steady: untimed epochs streamed before the timed one")
    ap.add_argument("--systems", default="vserve,pyav,decord,torchcodec,spdl")
    ap.add_argument("--clips", type=int, default=400, help="videos per corpus variant")
    ap.add_argument("--full-videos", type=int, default=40, help="videos the full workload decodes")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--shared-jobs", type=int, default=4)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cache", default="3G", help="the daemon's frame cache")
    ap.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="one more flag for the daemon, repeatable (e.g. --daemon-arg=--cache-admit-fraction=1)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="trials per variant; the fastest row of each system counts")
    ap.add_argument("--inflight", type=int, default=2, help="GetClips requests in flight per vserve rank")
    ap.add_argument("--rates", default="20,40,60,80,100,120,140", help="open loop: offered requests/s")
    ap.add_argument("--duration", type=float, default=10.0, help="open loop: seconds per rate")
    ap.add_argument("--queue", type=int, default=32, help="open loop: outstanding requests at most (all ranks together)")
    ap.add_argument("--open-loop-ranks", type=int, default=1, help="open loop: client processes sharing the offered rate")
    ap.add_argument("--cold", action="store_true", help="open loop: evict the corpus from the page cache before each rate")
    ap.add_argument("--out", default=str(REPO / "target" / "bench-results" / "reference"))
    ap.add_argument("--vserve-bin", default=str(REPO / "target" / "release" / "vserve"))
    ap.add_argument("--floor-bin", default=os.environ.get("FLOOR_BIN", ""))
    ap.add_argument("--no-floor", action="store_true", help="skip the floor (a smoke test without release builds)")
    ap.add_argument("--pss-period", type=float, default=PSS_PERIOD, help="seconds between memory samples in a trial (0: none)")
    args = ap.parse_args()
    PSS_PERIOD = args.pss_period
    args.variants = [v for v in args.variants.split(",") if v]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.systems = [s for s in args.systems.split(",") if s]
    args.rates = [float(r) for r in args.rates.split(",") if r]
    args.vserve_bin = Path(args.vserve_bin)
    args.floor_bin = Path(args.floor_bin) if args.floor_bin else None
    if args.command == "run":
        if "vserve" not in args.systems:
            ap.error("--systems must include vserve: the peers replay the clips vserve's stream draws")
        if args.floor_bin is None and not args.no_floor:
            ap.error("--floor-bin (or FLOOR_BIN) is required: benches/reference.sh sets it")
        cmd_run(args)
    else:
        cmd_open_loop(args)


if __name__ == "__main__":
    main()
