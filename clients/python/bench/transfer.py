"""Batch delivery throughput to a Python consumer (issue 4's benchmark).

Streams batches of 32 clips x 8 frames x 224 x 224 x 3 uint8 (38.5 MB) from a running daemon; the consumer
touches every byte (sums the array). One warm-up epoch fills the daemon's frame cache, so the measured
epochs time delivery, not decoding. Prints GB/s per epoch and the median.

    python clients/python/bench/transfer.py --addr unix:/tmp/v.sock --dataset media [--transport inline]

A dataset with few videos still gives full batches: --clips-per-video (default 8) draws several clips per
video, and drop_last keeps every batch at 32 clips.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import vserve_client


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--addr", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--transport", default="auto", choices=["auto", "inline", "shm"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--clips-per-video", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()

    kw = dict(
        batch_size=args.batch_size,
        num_clips=args.clips_per_video,
        num_frames_per_clip=8,
        num_indices_between_frames=4,
        size=(224, 224),
        drop_last=True,
        seed=0,
        epoch=0,  # the same clips every epoch: after the warm-up, all cache hits
    )
    with vserve_client.Client(args.addr, transport=args.transport) as client:
        print(f"transport: {client.transport}")
        for _ in client.stream(args.dataset, **kw):
            pass  # warm-up: decode once into the daemon's cache
        rates = []
        for epoch in range(args.epochs):
            nbytes = 0
            checksum = 0
            t0 = time.perf_counter()
            for batch in client.stream(args.dataset, **kw):
                checksum += int(batch.array.sum(dtype=np.uint64))  # touch every byte
                nbytes += batch.array.nbytes
            dt = time.perf_counter() - t0
            rates.append(nbytes / dt / 1e9)
            print(f"epoch {epoch}: {nbytes / 1e6:.1f} MB in {dt:.3f} s = {rates[-1]:.3f} GB/s (checksum {checksum})")
        print(f"median: {statistics.median(rates):.3f} GB/s over {args.epochs} epochs")


if __name__ == "__main__":
    main()
