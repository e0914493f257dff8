"""client_exit: do Python clients that end without ``close()`` exit? (the grpcio finalizer hang).

Starts one ``vserve serve`` on the reference corpus (``benches/reference.sh`` encodes it into
``target/bench-corpus``), then runs ``--runs`` client processes one after the other. Each reads
``--videos`` whole videos through ``get_clips_many(..., max_in_flight=2)``, copies every reply, and ends
without closing its client; a process still alive after ``--timeout`` seconds is counted as hung and
killed. ``--client DIR`` picks the ``vserve_client`` package to test (default: this checkout's), so a
client before and after a change can be compared::

    target/bench-venv/bin/python benches/client_exit.py --runs 40
    target/bench-venv/bin/python benches/client_exit.py --runs 40 --client /path/to/old/clients/python

Measured 2026-11-27 (docs/BENCHMARKS.md): the client before the exit hook hung 5 times in 40, after it 0.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "target" / "bench-corpus" / "reference-v1"

CHILD = r"""
import sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
import numpy as np
from vserve_client import Client
dataset = sys.argv[5]
names = sorted(p.name for p in Path(sys.argv[3]).glob("*.mp4"))[: int(sys.argv[4])]
c = Client(sys.argv[1])
counts = {v: c.probe(dataset, v)["frame_count"] for v in names}
buf = None
for b in c.get_clips_many([(dataset, [(v, list(range(counts[v])))]) for v in names], max_in_flight=2):
    a = b.array
    if buf is None or buf.shape != a.shape:
        buf = np.empty(a.shape, a.dtype)
    np.copyto(buf, a)
    b.release()
# no c.close(): the interpreter's exit is what is tested
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=40.0, help="seconds a client process may take")
    ap.add_argument("--variant", default="gop250")
    ap.add_argument("--client", default=str(HERE.parent / "clients" / "python"), help="directory holding vserve_client")
    ap.add_argument("--vserve", default=str(HERE.parent / "target" / "release" / "vserve"))
    args = ap.parse_args()
    root = CORPUS / args.variant
    if not root.is_dir():
        sys.exit(f"no corpus at {root}: run benches/reference.sh run once to encode it")
    sys.path.insert(0, str(HERE))
    import reference

    d = Path(tempfile.mkdtemp(prefix="vserve-exit-"))
    daemon = reference.Daemon(Path(args.vserve), root, 2, "2G", d / "daemon.log")
    try:
        hung = 0
        for i in range(args.runs):
            child = [sys.executable, "-c", CHILD, daemon.addr, args.client, str(root), str(args.videos), reference.DATASET]
            try:
                subprocess.run(child, timeout=args.timeout, check=True)
            except subprocess.TimeoutExpired:
                hung += 1
                print(f"run {i}: still alive after {args.timeout:.0f} s (killed)", flush=True)
        print(f"runs {args.runs}, hung {hung}", flush=True)
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
