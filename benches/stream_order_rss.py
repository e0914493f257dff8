"""RSS each open stream holds for its sample order (probe E, session s49; fixed in s50): a manifest of N rows
naming one real clip, S streams each read one batch and held open, /proc's VmRSS before and after.

  python benches/stream_order_rss.py target/release/vserve [N=1000000] [S=16] [WORLD=1]

Builds its files under /tmp/vserve-sor (removed at the end)."""
import os, sys, time, subprocess, shutil
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))
from vserve_client import Client
BIN = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 1000000
S = int(sys.argv[3]) if len(sys.argv) > 3 else 16
W = int(sys.argv[4]) if len(sys.argv) > 4 else 1
R = "/tmp/vserve-sor"; shutil.rmtree(R, ignore_errors=True); os.makedirs(R + "/root")
shutil.copy(os.path.join(HERE, "..", "..", "shared", "media", "gulpio", "test.mp4"), R + "/root/v.mp4")
with open(R + "/m.csv", "w") as f:
    f.write("path,label\n"); f.write("".join(f"v.mp4,{i % 400}\n" for i in range(N)))
sock = R + "/s.sock"
p = subprocess.Popen([BIN, "serve", "--listen", "unix:" + sock, "--admin-listen", "none", "--decode-threads", "2",
                      "--state-dir", "none", "--cache-bytes", "64MiB", "--dataset", f"d={R}/root:manifest={R}/m.csv"],
                     stderr=open(R + "/log", "w"))
rss = lambda: int([l for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS")][0].split()[1]) // 1024
try:
    while not os.path.exists(sock): time.sleep(0.02)
    c = Client("unix:" + sock)
    kw = dict(batch_size=2, num_frames_per_clip=1, size=(8, 8), world_size=W, prefetch=1)
    s = c.stream("d", epoch=999, **kw); next(iter(s)); s.close(); time.sleep(5)   # warm: table, cache, arenas
    base = rss(); held = []
    for e in range(S):
        s = c.stream("d", epoch=e, **kw); next(iter(s)); held.append(s)
    time.sleep(1); r = rss()
    print(f"{N} samples, world {W}: RSS {base} MiB -> {r} MiB with {S} streams open: {(r - base) / S:.1f} MiB a stream, "
          f"{(r - base) * 2**20 / S / N:.1f} bytes a sample a stream")
    for s in held: s.close()
finally:
    p.terminate(); p.wait(); shutil.rmtree(R, ignore_errors=True)
