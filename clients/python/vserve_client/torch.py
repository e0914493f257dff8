"""PyTorch: :class:`VideoClipDataset`, a ``torch.utils.data.IterableDataset`` over StreamBatches.

The only module of vserve_client that imports torch. The daemon samples, decodes, augments and batches;
the dataset yields whole batches, so use it with ``DataLoader(dataset, batch_size=None)``::

    ds = VideoClipDataset("unix:/run/vserve/vserve.sock", "kin", batch_size=32, frames_per_clip=8,
                          frame_stride=4, short_side=256, random_crop=224, random_hflip=True,
                          dtype="float32", mean=[0.45] * 3, std=[0.225] * 3, layout="TCHW", seed=0)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for item in loader:
            video, label = item["video"], item["label"]   # [32, 8, 3, 224, 224] float32, [32] int64

Rank and world size come from torch.distributed when it is initialised, else from the RANK and
WORLD_SIZE environment variables (torchrun sets both), else 0 and 1; pass ``rank``/``world_size`` to
override. Each rank receives its own shard from the daemon.

Workers: with ``num_workers = n`` each DataLoader worker opens its own connection and worker ``w`` takes the
rank's batches ``b`` with ``(b - start_batch) % n == w`` (``b % n == w`` from a fresh start), so no batch is
delivered twice and the loader yields them in order (see :mod:`vserve_client.workers`).

Resume: items carry ``"batch"``, the batch's number in the rank's epoch; after a restart call
``set_epoch(epoch, start_batch=last_batch + 1)``.

Arrays become tensors with ``torch.from_numpy`` (no copy). With the shared-memory transport (the default
on a Unix socket) a tensor in the main process (``num_workers=0``) is a view of the daemon's arena slot and
stays valid until the next batch is requested: clone what you keep across iterations. In DataLoader
workers each batch is copied once into a torch shared-memory tensor (what sending it to the main process
needs anyway) and the slot is released at once, so the tensors the loader yields are owned.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from .batch import Batch

#: numpy dtype strings of the wire dtypes -> torch dtypes.
_TORCH_DTYPES = {"|u1": torch.uint8, "<f2": torch.float16, "<f4": torch.float32}
from .client import Client
from .request import stream_kwargs_names, stream_request
from .workers import resolve_rank

_OWN = ("rank", "world_size", "epoch", "start_batch")


def _distributed() -> Optional[Tuple[int, int]]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


class VideoClipDataset(IterableDataset):
    """Batches of clips from a vserve daemon as tensors.

    Args:
        addr: the daemon (``unix:/path.sock`` or ``host:port``).
        dataset: the dataset name the daemon serves.
        output: ``"dict"`` (default) yields ``{"video", "label", "frames", "pts_seconds", "videos", "labels",
            "batch", "batches_total", "skipped"}``; ``"tuple"`` yields ``(video, label)``.
        transport, token: as for :class:`~vserve_client.Client`.
        rank, world_size: override the detected ones (give both).
        epoch, start_batch: the epoch to read and the batch to start from (see :meth:`set_epoch`).
        **stream_kwargs: everything else :meth:`vserve_client.Client.stream` takes (batch_size is required).
    """

    def __init__(
        self,
        addr: str,
        dataset: str,
        *,
        output: str = "dict",
        transport: str = "auto",
        token: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        epoch: int = 0,
        start_batch: int = 0,
        **stream_kwargs: Any,
    ):
        super().__init__()
        if output not in ("dict", "tuple"):
            raise ValueError(f"output={output!r}: expected 'dict' or 'tuple'")
        unknown = set(stream_kwargs) - set(stream_kwargs_names())
        if unknown:
            raise TypeError(f"VideoClipDataset: unknown stream arguments {sorted(unknown)}")
        # Validate now, in the main process, rather than in a worker.
        stream_request(dataset, **stream_kwargs)
        self.addr = addr
        self.dataset = dataset
        self.output = output
        self.transport = transport
        self.token = token
        self.stream_kwargs = dict(stream_kwargs)
        self._explicit = (rank, world_size)
        self.rank, self.world_size = resolve_rank(rank, world_size, _distributed(), os.environ)
        self.epoch = int(epoch)
        self.start_batch = int(start_batch)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Reads ``epoch`` next (a new shuffle and new augmentation draws), from ``start_batch`` on."""
        self.epoch = int(epoch)
        self.start_batch = int(start_batch)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is None:
            # In the main process torch.distributed may have been initialised after construction.
            self.rank, self.world_size = resolve_rank(*self._explicit, _distributed(), os.environ)
            worker = (0, 1)
        else:
            worker = (info.id, info.num_workers)
        client = Client(self.addr, transport=self.transport, token=self.token)
        stream = client.stream(
            self.dataset,
            rank=self.rank,
            world_size=self.world_size,
            epoch=self.epoch,
            start_batch=self.start_batch,
            worker=worker,
            **self.stream_kwargs,
        )
        try:
            for batch in stream:
                yield self._item(batch)
        finally:
            stream.close()
            client.close()

    def _item(self, batch: Batch) -> Any:
        if batch.shared and get_worker_info() is not None:
            # The worker's queue pickles the item later, on another thread, while this generator may
            # already have released the slot: copy now, straight into shared memory, and release.
            video = torch.empty(batch.array.shape, dtype=_TORCH_DTYPES[batch.array.dtype.str]).share_memory_()
            video.copy_(torch.from_numpy(batch.array))
            batch.release()
        else:
            video = torch.from_numpy(batch.array)
        label = torch.from_numpy(batch.label_indices)
        if self.output == "tuple":
            return video, label
        item: Dict[str, Any] = {
            "video": video,
            "label": label,
            "frames": torch.from_numpy(batch.frames) if not isinstance(batch.frames, list) else batch.frames,
            "pts_seconds": (
                torch.from_numpy(batch.pts_seconds) if not isinstance(batch.pts_seconds, list) else batch.pts_seconds
            ),
            "videos": batch.videos,
            "labels": batch.labels,
            "batch": batch.batch,
            "batches_total": batch.batches_total,
            "skipped": batch.skipped,
        }
        return item
