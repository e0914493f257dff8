"""recall_cost: per-Probe time on a fresh daemon whose store already holds every video's record (the recall
path, where a stored table's content digest is checked), for two builds alternated, each with its own state
directory::

    target/py-venv/bin/python benches/recall_cost.py OLD_BIN NEW_BIN target/bench-corpus/reference-v1/gop250 4
"""
import os, shutil, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
import vserve_client

old, new, corpus, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
videos = sorted(f for f in os.listdir(corpus) if f.endswith(".mp4"))
root = tempfile.mkdtemp()

def daemon(binary, state):
    sock = f"{root}/s.sock"
    p = subprocess.Popen([binary, "--dataset", f"c={corpus}", "--listen", f"unix:{sock}", "--admin-listen", "none",
                          "--state-dir", state], stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    time.sleep(0.2)
    return p, vserve_client.Client(f"unix:{sock}")

def probe_all(binary, state):
    p, c = daemon(binary, state)
    t = time.perf_counter()
    for v in videos:
        c.probe("c", v)
    dt = time.perf_counter() - t
    c.close(); p.terminate(); p.wait()
    return dt / len(videos) * 1e3

states = {b: f"{root}/state-{i}" for i, b in enumerate((old, new))}
for b in (old, new):
    probe_all(b, states[b])  # builds and stores every table
for r in range(rounds):
    for b in ((old, new) if r % 2 == 0 else (new, old)):
        print(f"round {r} {'NEW' if b == new else 'OLD'}: {probe_all(b, states[b]):.3f} ms per Probe (recall)", flush=True)
shutil.rmtree(root, ignore_errors=True)
