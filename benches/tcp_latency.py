"""Latency of GetClips replies over the Unix socket and over TCP, each with shared memory forced.

    target/py-venv/bin/python benches/tcp_latency.py [--vserve target/debug/vserve] [--requests 200] \
        [--clips 4] [--frames 8] [--size 224]

Starts one daemon (`--vserve`) listening on a private Unix socket and on 127.0.0.1 (a free port), serving
tests/data/demo; warms the cache with the clips used, then times `--requests` sequential GetClips
(`--clips` x `--frames`, `--size` square, uint8; 4.8 MB by default) per address, alternating in rounds of
20 so load on the machine hits both alike. Prints per address the median, p90 and mean milliseconds per
reply, and TCP ÷ Unix. The reply's array is read once (summed), as a consumer would.

Before TCP_NODELAY was set on accepted connections such a reply took ~52 ms over TCP against ~9 ms on the
Unix socket (Nagle's algorithm held the reply's last small segment until the client's delayed ACK).
No timing is asserted: this prints.
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from vserve_client import Client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(addr: str, deadline: float) -> None:
    while time.time() < deadline:
        try:
            with Client(addr, transport="inline") as c:
                c.list_datasets()
                return
        except Exception:  # noqa: BLE001 - not listening yet
            time.sleep(0.1)
    raise SystemExit(f"daemon not answering on {addr}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vserve", default=os.path.join(ROOT, "target/debug/vserve"))
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--size", type=int, default=224, help="output side in pixels")
    ap.add_argument("--video", default="nasa_13013.mp4")
    ap.add_argument("--clips", type=int, default=4, help="clips per request (each --frames frames)")
    ap.add_argument("--frames", type=int, default=8, help="frames per clip")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="vserve-tcp-")
    sock = os.path.join(tmp, "s.sock")
    port = free_port()
    log = open(os.path.join(tmp, "daemon.log"), "w")
    daemon = subprocess.Popen(
        [
            args.vserve,
            "serve",
            "--listen",
            f"unix:{sock}",
            "--listen",
            f"127.0.0.1:{port}",
            "--dataset",
            f"demo={ROOT}/tests/data/demo",
            "--admin-listen",
            "none",
            "--state-dir",
            "none",
            "--decode-threads",
            "1",
        ],
        stdout=log,
        stderr=log,
    )
    try:
        addrs = {"unix": f"unix:{sock}", "tcp": f"127.0.0.1:{port}"}
        for a in addrs.values():
            wait_ready(a, time.time() + 60)
        clients = {name: Client(a, transport="shm") for name, a in addrs.items()}
        clips = [(args.video, list(range(args.frames)))] * args.clips
        for c in clients.values():  # warm: every reply below is a cache hit
            c.get_clips("demo", clips, size=(args.size, args.size))
        times = {name: [] for name in clients}
        done = 0
        while done < args.requests:
            for name, c in clients.items():
                for i in range(20):
                    t0 = time.perf_counter()
                    b = c.get_clips("demo", clips, size=(args.size, args.size))
                    int(b.array.sum())
                    times[name].append(time.perf_counter() - t0)
                    del b
            done += 20
        for c in clients.values():
            c.close()
        ms = {name: [t * 1000 for t in v] for name, v in times.items()}
        mb = args.clips * args.frames * args.size * args.size * 3 / 1e6
        print(
            f"{args.requests} GetClips per address, {args.clips} clips x {args.frames} frames of "
            f"{args.size}x{args.size} uint8 ({mb:.1f} MB), shared memory, warm cache"
        )
        print(f"load average: {os.getloadavg()[0]:.2f}")
        for name, v in ms.items():
            q = statistics.quantiles(v, n=10)
            print(f"{name:5s} median {statistics.median(v):7.2f} ms  p90 {q[8]:7.2f} ms  mean {statistics.mean(v):7.2f} ms")
        print(f"tcp / unix (median): {statistics.median(ms['tcp']) / statistics.median(ms['unix']):.2f}")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
