"""gulpio2's own reader on DESIGN.md's `train` workload, for comparison with `cargo bench --bench streams`
run on the same GulpIO directory (see docs/BENCHMARKS.md, "GulpIO datasets").

  target/gulp-venv/bin/python benches/gulp_reader.py DIR [--workers N] [--clips-per-video 4] [--seed 0]

Per video `--clips-per-video` random clips of 8 frames with stride 4 (uniform start), read with
GulpDirectory[id, slice] (JPEG decode by simplejpeg, as gulpio2 does), random 224x224 crop and random
horizontal flip per clip, batches of 32 clips stacked into one uint8 [32, 8, 224, 224, 3] array, in a pool
of `--workers` processes (a PyTorch DataLoader's shape: each worker builds whole batches, which reach the
main process pickled through a pipe; `--no-transfer` keeps them in the workers). Frames are
stored at the size they are served (ingest --short-side 256), so no resize. Prints clips/s.
"""
import argparse
import multiprocessing as mp
import time

import numpy as np
from gulpio2 import GulpDirectory

_gd = None
_no_transfer = False


def _init(d, no_transfer):
    global _gd, _no_transfer
    _gd = GulpDirectory(d)
    _no_transfer = no_transfer


def _batch(job):
    seed, clips = job
    rng = np.random.default_rng(seed)
    out = []
    for vid, start in clips:
        frames, _ = _gd[vid, slice(start, start + 29, 4)]
        arr = np.stack(frames)
        _, h, w, _ = arr.shape
        y = rng.integers(0, h - 224 + 1)
        x = rng.integers(0, w - 224 + 1)
        arr = arr[:, y:y + 224, x:x + 224]
        if rng.random() < 0.5:
            arr = arr[:, :, ::-1]
        out.append(np.ascontiguousarray(arr))
    batch = np.stack(out)
    return batch.shape[0] if _no_transfer else batch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--clips-per-video", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--no-transfer", action="store_true")
    a = p.parse_args()
    gd = GulpDirectory(a.dir)
    lengths = {vid: len(m["frame_info"]) for vid, m in gd.merged_meta_dict.items()}
    rng = np.random.default_rng(a.seed)
    clips = []
    for vid in sorted(lengths):
        for _ in range(a.clips_per_video):
            clips.append((vid, int(rng.integers(0, max(1, lengths[vid] - 28)))))
    order = rng.permutation(len(clips))
    clips = [clips[i] for i in order]
    jobs = [(a.seed + i, clips[i:i + 32]) for i in range(0, len(clips), 32)]
    best = None
    for _ in range(a.repeat):
        with mp.Pool(a.workers, initializer=_init, initargs=(a.dir, a.no_transfer)) as pool:
            t0 = time.perf_counter()
            n = 0
            for batch in pool.imap(_batch, jobs):
                # The batch crossed to this process as a DataLoader's would (pickled through a pipe).
                n += batch if a.no_transfer else batch.shape[0]
            dt = time.perf_counter() - t0
        rate = n / dt
        best = rate if best is None else max(best, rate)
        print(f"gulpio2 reader: {n} clips in {dt:.2f} s: {rate:.1f} clips/s ({a.workers} workers)")
    print(f"best: {best:.1f} clips/s")


if __name__ == "__main__":
    main()
