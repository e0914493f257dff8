"""RSS of a daemon against the frame tables in its index cache (probe E, session s49): N hard links of a tiny
VP9 clip, one epoch through two streams with a 1 MiB frame cache, the vserve_index_cache_* gauges and
/proc's VmRSS every N/6 videos.

  python benches/index_cache_rss.py target/release/vserve N INDEX_CACHE_BYTES   (e.g. 60000 16MiB)

Builds its tree under /tmp/vserve-icr (kept for the next run)."""
import os, sys, time, subprocess, shutil, threading, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
from vserve_client import Client
BIN, N, IDX = sys.argv[1], int(sys.argv[2]), sys.argv[3]
R = "/tmp/vserve-icr"; os.makedirs(R, exist_ok=True); root = R + "/root"
if not os.path.isdir(root) or len(os.listdir(root)) * 2500 < N:
    shutil.rmtree(root, ignore_errors=True); os.makedirs(root)
    for i in range(N):
        if i % 60000 == 0: src = f"{R}/src{i // 60000}.webm"; shutil.copy2(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "media", "fate", "vp9", "vp90-2-02-size-08x10.webm"), src)
        d = f"{root}/c{i // 2500:03d}"; os.makedirs(d, exist_ok=True); os.link(src, f"{d}/v{i:07d}.webm")
sock = R + "/s.sock"
if os.path.exists(sock): os.unlink(sock)
p = subprocess.Popen([BIN, "serve", "--listen", "unix:" + sock, "--admin-listen", "127.0.0.1:19777", "--decode-threads", "2",
                      "--state-dir", "none", "--rescan-interval", "0", "--cache-bytes", "1MiB", "--index-cache-bytes", IDX, "--dataset", f"d={root}"],
                     stderr=open(R + "/log", "w"))
def rss(): return int([l for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS")][0].split()[1]) // 1024
def met():
    t = urllib.request.urlopen("http://127.0.0.1:19777/metrics").read().decode()
    g = lambda n: float([l for l in t.splitlines() if l.startswith(n + " ")][0].split()[1])
    return int(g("vserve_index_cache_tables")), int(g("vserve_index_cache_bytes"))
try:
    while not os.path.exists(sock): time.sleep(0.02)
    c = Client("unix:" + sock)
    while c.list_datasets()[0]["building"]: time.sleep(0.1)
    r0 = rss(); print(f"ready: {c.list_datasets()[0]['samples']} videos, RSS {r0} MiB", flush=True)
    n = 0
    def one(w):
        global n
        cl = Client("unix:" + sock)
        for b in cl.stream("d", batch_size=64, num_frames_per_clip=1, size=(8, 8), shuffle=False, worker=(w, 2)):
            n += len(b.clips)
            if n >= N: break
    ts = [threading.Thread(target=one, args=(w,)) for w in range(2)]; [t.start() for t in ts]
    nxt = N // 6
    while any(t.is_alive() for t in ts):
        time.sleep(1)
        if n >= nxt:
            t_, b_ = met(); r = rss(); print(f"videos {n:>7} tables {t_:>7} weight {b_>>20} MiB ({b_/max(t_,1):.0f} B/table) RSS {r} MiB (+{(r-r0)*1048576/max(t_,1):.0f} B/table)", flush=True); nxt += N // 6
    time.sleep(2); t_, b_ = met(); r = rss(); print(f"end: tables {t_} weight {b_>>20} MiB RSS {r} MiB (+{(r-r0)*1048576/max(t_,1):.0f} B/table)")
finally:
    p.terminate(); p.wait()
