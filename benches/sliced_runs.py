"""Frames decoded to serve n consecutive frames of one GOP of a large video (probe D, session s49): a run
yields its thread every 10 ms slice and must continue where its decoder stopped, not decode again from
the keyframe. Prints, per n, the request's frames_decoded (n when each frame is decoded once) and time.

  python benches/sliced_runs.py target/release/vserve [SIZE=4096x4096] [FRAMES=10]

Makes its own clip (one GOP of FRAMES frames, libx264) in a temporary directory."""
import os, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
from vserve_client import Client  # noqa: E402

BIN = sys.argv[1]
SIZE = sys.argv[2] if len(sys.argv) > 2 else "4096x4096"
FRAMES = int(sys.argv[3]) if len(sys.argv) > 3 else 10
with tempfile.TemporaryDirectory() as d:
    subprocess.run(["ffmpeg", "-v", "error", "-f", "lavfi", "-i", f"testsrc=s={SIZE}:r=10", "-frames:v", str(FRAMES),
                    "-c:v", "libx264", "-preset", "ultrafast", "-g", "1000", f"{d}/big.mp4"], check=True)
    sock = f"{d}/s.sock"
    p = subprocess.Popen([BIN, "serve", "--listen", f"unix:{sock}", "--admin-listen", "none", "--state-dir", "none",
                          "--decode-threads", "2", "--dataset", f"c={d}"], stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(sock):
            time.sleep(0.02)
        with Client(f"unix:{sock}", transport="inline") as c:
            for n in sorted({1, 2, 4, FRAMES // 2, FRAMES}):
                t = time.time()
                b = c.get_clips("c", [("big.mp4", list(range(n)))], size=(36, 64), cache_policy="one_pass")
                print(f"{SIZE}, frames 0..{n - 1}: frames_decoded {b.stats['frames_decoded']}, {time.time() - t:.2f} s",
                      flush=True)
    finally:
        p.terminate()
        p.wait()
