"""A stand-in daemon for the client's streaming path: a Python gRPC server whose StreamBatches follows the
proto's wire rules with synthetic batches, so the client side (chunked batches over a real channel,
cancellation, errors mid-stream, worker splitting, the torch dataset) is tested whatever the real daemon
serves. Pixels are never compared with FFmpeg here; test_stream.py does that against the real daemon.

Run as a separate process (``python fake_daemon.py unix:/path.sock``) so DataLoader workers can fork
without inheriting live gRPC server threads.

Synthetic dataset: SAMPLES samples; rank r of world n gets samples ``i`` with ``i % n == r`` (in order, or
reversed for odd epochs when shuffling); clip ``c`` of batch ``b`` has every byte equal to
``(seed + 7 * sample + epoch) % 251`` and frame indices ``[sample, sample + 1, ...]``.
Datasets: ``synthetic``; ``fails-after-1`` (DATA_LOSS after the first batch); anything else NOT_FOUND.
The ``prefetch`` of every call is appended to a log file next to the socket (``<socket>.calls``).
"""

from __future__ import annotations

import sys
import time
from concurrent import futures

import grpc

from vserve_client._proto import vserve_pb2 as pb
from vserve_client._proto import vserve_pb2_grpc as pb_grpc

SAMPLES = 23
FRAME = (4, 6, 3)  # H, W, C
CHUNK = 100  # bytes per chunk: every batch spans many messages


def clip_value(seed: int, sample: int, epoch: int) -> int:
    return (seed + 7 * sample + epoch) % 251


class Servicer(pb_grpc.VServeServicer):
    def __init__(self, calls_log: str):
        self.calls_log = calls_log

    def ListDatasets(self, request, context):
        return pb.ListDatasetsResponse(
            datasets=[pb.DatasetInfo(name="synthetic", root="/fake", video_count=SAMPLES, samples=SAMPLES)]
        )

    def StreamBatches(self, request, context):
        with open(self.calls_log, "a") as f:
            f.write(
                f"{request.rank} {request.world_size} {request.start_batch} {request.prefetch} "
                f"{request.worker} {request.num_workers}\n"
            )
        if request.dataset not in ("synthetic", "fails-after-1"):
            context.abort(grpc.StatusCode.NOT_FOUND, f'dataset "{request.dataset}" not served')
        world = request.world_size or 1
        if request.rank >= world:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"rank {request.rank} >= world_size {world}")
        mine = [i for i in range(SAMPLES) if i % world == request.rank]
        if not request.no_shuffle and request.epoch % 2 == 1:
            mine.reverse()
        bs = request.batch_size
        if bs == 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "batch_size 0")
        total = len(mine) // bs if request.drop_last else -(-len(mine) // bs)
        t = request.sampler.frames_per_clip or 1
        workers = max(request.num_workers, 1)
        for b in range(request.start_batch, total):
            if (b - request.start_batch) % workers != request.worker:
                continue
            if request.dataset == "fails-after-1" and b > request.start_batch + request.worker:
                context.abort(grpc.StatusCode.DATA_LOSS, 'video "v3.mp4" is corrupt at frame 4')
            samples = mine[b * bs : (b + 1) * bs]
            header = pb.BatchHeader(
                shape=[len(samples), t, *FRAME],
                dtype=pb.DTYPE_UINT8,
                nbytes=len(samples) * t * FRAME[0] * FRAME[1] * FRAME[2],
                batch=b,
                # As the daemon: 0 (unknown ahead) for regular timestamps.
                batches_total=0 if request.sampler.kind == pb.SAMPLER_REGULAR_TIMESTAMPS else total,
            )
            data = bytearray()
            for s in samples:
                header.clips.add(
                    video=f"v{s}.mp4",
                    frame_indices=list(range(s, s + t)),
                    pts=[512 * k for k in range(s, s + t)],
                    pts_seconds=[k / 25 for k in range(s, s + t)],
                    label=f"class{s % 3}",
                    label_index=s % 3,
                    sample=s,
                )
                data += bytes([clip_value(request.seed, s, request.epoch)]) * (t * FRAME[0] * FRAME[1] * FRAME[2])
            # The header's message carries the first chunk, as the proto allows.
            yield pb.StreamBatchesResponse(header=header, offset=0, data=bytes(data[:CHUNK]))
            for off in range(CHUNK, len(data), CHUNK):
                if not context.is_active():
                    return
                yield pb.StreamBatchesResponse(offset=off, data=bytes(data[off : off + CHUNK]))


def main() -> None:
    addr = sys.argv[1]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_VServeServicer_to_server(Servicer(addr[len("unix:") :] + ".calls"), server)
    server.add_insecure_port(addr)
    server.start()
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
