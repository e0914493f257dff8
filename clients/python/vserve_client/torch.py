"""PyTorch: :class:`VideoClipDataset`, a ``torch.utils.data.IterableDataset`` over StreamBatches.

The only module of vserve_client that imports torch. The daemon samples, decodes, augments and batches;
the dataset yields whole batches, so use it with ``DataLoader(dataset, batch_size=None)``::

    ds = VideoClipDataset("unix:/run/vserve/vserve.sock", "kin", batch_size=32, num_frames_per_clip=8,
                          num_indices_between_frames=4, short_side=256, random_crop=224, random_hflip=True,
                          dtype="float32", mean=[0.45] * 3, std=[0.225] * 3, layout="CTHW", seed=0)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    len(loader)                                           # batches of this rank's epoch
    for epoch in range(epochs):
        ds.set_epoch(epoch)                               # reaches persistent workers too
        for item in loader:
            video, label = item["video"], item["label"]   # [32, 3, 8, 224, 224] float32, [32] int64

Rank and world size come from torch.distributed when it is initialised, else from the RANK and
WORLD_SIZE environment variables (torchrun sets both), else 0 and 1; pass ``rank``/``world_size`` to
override. They are read as each iteration starts, also in DataLoader workers, so a dataset built before
``init_process_group`` (mp.spawn-style launches) still reads its rank's shard. Each rank receives its own
shard from the daemon.

Workers: with ``num_workers = n`` each DataLoader worker opens its own connection and worker ``w`` takes the
rank's batches ``b`` with ``(b - start_batch) % n == w`` (``b % n == w`` from a fresh start), so no batch is
delivered twice and the loader yields them in order (see :mod:`vserve_client.workers`). With
``in_order=False`` (torch >= 2.6) every batch is still delivered once per epoch, in whatever order the
workers finish; mid-epoch resume assumes in-order delivery, so use the default ``in_order=True`` for
resumable runs (torchdata's StatefulDataLoader makes no promise for ``in_order=False`` either).

Epochs: :meth:`VideoClipDataset.set_epoch` writes to a small shared-memory tensor that every worker
reads when an epoch's iteration starts, so persistent workers (``persistent_workers=True``) see each new
epoch; nothing needs re-creating.

Resume (:meth:`~VideoClipDataset.state_dict` / :meth:`~VideoClipDataset.load_state_dict`, torchdata's
``Stateful`` protocol):

- ``torchdata.stateful_dataloader.StatefulDataLoader`` with the same world size and worker count:
  ``loader.load_state_dict(saved)``. The loader hands each worker its own state; every worker resumes
  after the last batch the loader yielded from it, so the run continues with exactly the batches the
  uninterrupted run would have yielded next.
- A different world size (or worker count): ``ds.load_state_dict(saved)`` with the loader's whole saved
  state (or a dataset state from ``num_workers=0``), before making the new loader (whose own state is not
  loaded). The dataset turns the rank's progress into a global sample offset: the samples of the epoch's
  order that all ranks consumed together (ranks step together, as in data-parallel training). The new
  ranks shard the rest; every remaining sample keeps the clips and augmentation of the uninterrupted
  epoch, none is read twice or skipped (when batch_size·batches is a multiple of num_clips; otherwise
  the sample a batch boundary split is read again in full). Not for regular-timestamps sampling.
- A plain DataLoader: items carry ``"batch"``; ``ds.set_epoch(epoch, start_batch=last_batch + 1)``, or
  ``ds.load_state_dict(ds.state_for(epoch, last_batch + 1))`` when the world size may change.

The tensors the loader yields are the caller's, as a DataLoader's items are. With the shared-memory
transport (the default on a Unix socket) each batch is copied once out of the daemon's arena slot and the
slot is released at once: in DataLoader workers into a torch shared-memory tensor (what sending it to the
main process needs anyway), in the main process (``num_workers=0``) into a plain tensor. With
``zero_copy=True`` the main process gets the slot itself instead (``Batch.to_torch``, no copy), which the
daemon overwrites a few batches later: only for loops that use each batch before asking for the next and
keep nothing of it. Inline batches are always the caller's own memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from . import errors
from .batch import Batch
from .client import Client, _pem
from .request import rename_deprecated, stream_kwargs_names, stream_request
from .workers import batches_in_epoch, global_offset, resolve_rank

#: Version of the state dicts this module writes.
STATE_VERSION = 1


def _distributed() -> Optional[Tuple[int, int]]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


#: Run by _dataset_info_elsewhere in a child interpreter: one ListDatasets call, the answer as JSON.
_INFO_SCRIPT = """
import json, sys
from vserve_client import Client, VServeError
a = json.load(sys.stdin)
try:
    ca = a["tls_ca"].encode("ascii") if a["tls_ca"] is not None else None
    with Client(a["addr"], transport="inline", token=a["token"], tls_ca=ca) as c:
        print(json.dumps({"info": c.dataset_info(a["dataset"], labels=a["labels"])}))
except VServeError as e:
    print(json.dumps({"error": type(e).__name__, "code": e.code, "message": e.message}))
"""


def _dataset_info_elsewhere(
    addr: str, token: Optional[str], tls_ca: Optional[bytes], dataset: str, labels: bool
) -> Dict[str, Any]:
    """The dataset's ListDatasets entry, asked by a short-lived child interpreter, so that this process
    (a trainer's main process) opens no gRPC channel of ours before DataLoader forks its workers: gRPC's
    threads and locks do not survive fork(), and a worker forked while they are busy can hang."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    run = subprocess.run(
        [sys.executable, "-c", _INFO_SCRIPT],
        input=json.dumps(
            {
                "addr": addr,
                "token": token,
                "tls_ca": tls_ca.decode("ascii") if tls_ca is not None else None,
                "dataset": dataset,
                "labels": labels,
            }
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
    )
    if run.returncode != 0:
        raise RuntimeError(f"asking the daemon for dataset {dataset!r} failed:\n{run.stderr[-2000:]}")
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    if "error" in answer:
        cls = getattr(errors, answer["error"], errors.VServeError)
        raise cls(answer["message"], code=answer["code"])
    return answer["info"]


_U64 = (1 << 64) - 1


def _worker() -> Tuple[int, int]:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class VideoClipDataset(IterableDataset):
    """Batches of clips from a vserve daemon as tensors.

    Args:
        addr: the daemon (``unix:/path.sock`` or ``host:port``).
        dataset: the dataset name the daemon serves.
        output: ``"dict"`` (default) yields ``{"video", "label", "frames", "pts_seconds", "duration_seconds",
            "videos", "labels", "batch", "batches_total", "skipped"}``; ``"tuple"`` yields ``(video, label)``.
        transport, token, tls_ca: as for :class:`~vserve_client.Client` (the CA read once, here).
        rank, world_size: override the detected ones (give both).
        epoch, start_batch, start_sample: where to start (see :meth:`set_epoch`).
        zero_copy: with ``num_workers=0`` and shared memory, yield views of the daemon's slots instead of
            copies (valid only until a few batches later; see the module's notes). Default False.
        **stream_kwargs: everything else :meth:`vserve_client.Client.stream` takes (batch_size is required;
            TorchCodec's sampler names, sizes as (height, width), layout "THWC" | "TCHW" | "CTHW", dtype
            "uint8" | "float16" | "float32" | "bfloat16").
    """

    def __init__(
        self,
        addr: str,
        dataset: str,
        *,
        output: str = "dict",
        transport: str = "auto",
        token: Optional[str] = None,
        tls_ca: Union[None, str, bytes, "os.PathLike[str]"] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        epoch: int = 0,
        start_batch: int = 0,
        start_sample: int = 0,
        zero_copy: bool = False,
        **stream_kwargs: Any,
    ):
        super().__init__()
        if output not in ("dict", "tuple"):
            raise ValueError(f"output={output!r}: expected 'dict' or 'tuple'")
        unknown = set(stream_kwargs) - set(stream_kwargs_names())
        if unknown:
            raise TypeError(f"VideoClipDataset: unknown stream arguments {sorted(unknown)}")
        stream_kwargs = rename_deprecated(stream_kwargs)
        if "batch_size" not in stream_kwargs:
            raise TypeError(
                "VideoClipDataset: batch_size is required (the daemon batches; give the DataLoader batch_size=None)"
            )
        # Validate now, in the main process, rather than in a worker.
        stream_request(dataset, **stream_kwargs)
        self.addr = addr
        self.dataset = dataset
        self.output = output
        self.transport = transport
        self.token = token
        # Read now, in the main process: the PEM travels to the workers with the dataset.
        self.tls_ca = _pem(tls_ca)
        self.zero_copy = bool(zero_copy)
        self.stream_kwargs = dict(stream_kwargs)
        self._explicit = (rank, world_size)
        self.rank, self.world_size = resolve_rank(rank, world_size, _distributed(), os.environ)
        # (epoch, start_batch, start_sample), shared with every worker process, persistent ones included:
        # set_epoch writes it, each iteration reads it when it starts. Then (epoch + 1, fingerprint): the
        # sample list the first stream of that epoch was planned over, which every later worker's stream
        # of the epoch pins (a catalogue reload between two workers' starts would otherwise give them
        # different epoch orders, repeating and dropping samples).
        self._shared = torch.tensor([int(epoch), int(start_batch), int(start_sample), 0, 0], dtype=torch.int64)
        self._shared.share_memory_()
        # This process's place in its current iteration (see state_dict), and a resume point loaded
        # into a worker by StatefulDataLoader (used by the next iteration only).
        self._position: Optional[Dict[str, Any]] = None
        self._resume: Optional[Dict[str, Any]] = None
        self._info: Optional[Dict[str, Any]] = None

    # -- where to start --------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return int(self._shared[0])

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.set_epoch(value)

    @property
    def start_batch(self) -> int:
        return int(self._shared[1])

    @property
    def start_sample(self) -> int:
        return int(self._shared[2])

    def set_epoch(self, epoch: int, start_batch: Optional[int] = None, start_sample: Optional[int] = None) -> None:
        """Reads ``epoch`` next (a new shuffle and new augmentation draws), from ``start_batch`` on (and
        leaving out the epoch's first ``start_sample`` samples: see :meth:`load_state_dict`). Reaches every
        DataLoader worker, persistent ones included, at the start of its next iteration.

        Omitted ``start_batch``/``start_sample`` are 0 for a new epoch, and kept when ``epoch`` is the one
        already set, so a loop calling ``set_epoch(epoch)`` after :meth:`load_state_dict` resumes."""
        epoch = int(epoch)
        same = epoch == self.epoch
        if start_batch is None:
            start_batch = self.start_batch if same else 0
        if start_sample is None:
            start_sample = self.start_sample if same else 0
        for name, v in (("epoch", epoch), ("start_batch", start_batch), ("start_sample", start_sample)):
            if isinstance(v, bool) or int(v) < 0:
                raise ValueError(f"{name}={v!r}: expected an int >= 0")
        self._shared[:3].copy_(torch.tensor([epoch, int(start_batch), int(start_sample)], dtype=torch.int64))

    # -- the dataset's facts ---------------------------------------------------------------------------

    def _dataset_info(self, labels: bool = False) -> Dict[str, Any]:
        """The dataset's ListDatasets entry, asked once; with its labels when ``labels`` (a dataset of a
        million distinct labels makes them an 18 MB reply, which its length does not need)."""
        if self._info is None or (labels and "classes" not in self._info):
            if get_worker_info() is not None:
                with Client(self.addr, transport="inline", token=self.token, tls_ca=self.tls_ca) as c:
                    self._info = c.dataset_info(self.dataset, labels=labels)
            else:
                self._info = _dataset_info_elsewhere(self.addr, self.token, self.tls_ca, self.dataset, labels)
        return self._info

    @property
    def classes(self) -> List[str]:
        """The dataset's labels ordered by label index (torchvision's ``ImageFolder.classes``)."""
        return list(self._dataset_info(labels=True)["classes"])

    @property
    def class_to_idx(self) -> Dict[str, int]:
        """Label -> the label index items carry (torchvision's ``ImageFolder.class_to_idx``)."""
        return dict(self._dataset_info(labels=True)["class_to_idx"])

    def _fixed_clips(self) -> bool:
        sampler = str(self.stream_kwargs.get("sampler", "random-indices")).replace("_", "-")
        return sampler != "regular-timestamps"

    def __len__(self) -> int:
        """Batches of this rank's epoch (the daemon's ``batches_total``; counting from ``start_sample``
        after a resume with another world size). Asks the daemon for the dataset's sample count once
        (from a child interpreter: see :func:`_dataset_info_elsewhere`).
        Regular-timestamps sampling has no length known ahead: TypeError, as for a dataset without one."""
        if not self._fixed_clips():
            raise TypeError("VideoClipDataset with regular-timestamps sampling has no length known ahead")
        rank, world = self._rank()
        kw = self.stream_kwargs
        return batches_in_epoch(
            int(self._dataset_info()["samples"]),
            batch_size=int(kw["batch_size"]),
            num_clips=int(kw.get("num_clips", 1)),
            rank=rank,
            world_size=world,
            shard_remainder=str(kw.get("shard_remainder", "uneven")),
            drop_last=bool(kw.get("drop_last", False)),
            start_sample=self.start_sample,
        )

    def _rank(self) -> Tuple[int, int]:
        if get_worker_info() is None:
            # In the main process torch.distributed may have been initialised after construction.
            self.rank, self.world_size = resolve_rank(*self._explicit, _distributed(), os.environ)
        elif self._explicit == (None, None):
            # A DataLoader worker: a forked one inherits the main process's process group, initialised
            # after this dataset was built or not (mp.spawn-style launches set no RANK/WORLD_SIZE); a
            # spawned one has none, and holds what the main process saw when it pickled the dataset for
            # it (__getstate__). Without this every rank's workers read the whole epoch.
            distributed = _distributed()
            if distributed is not None:
                self.rank, self.world_size = resolve_rank(None, None, distributed, os.environ)
        return self.rank, self.world_size

    def __getstate__(self) -> Dict[str, Any]:
        # Pickled for a spawned (or forkserver) DataLoader worker, in the main process as its iterator
        # starts: the rank and world size as they are now, torch.distributed included.
        if get_worker_info() is None:
            self._rank()
        return self.__dict__.copy()

    # -- iteration -------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        w, n = _worker()
        rank, world = self._rank()
        resume, self._resume = self._resume, None
        if resume is not None:
            # This worker's own place (StatefulDataLoader): its next batch, then every n-th.
            epoch, start_sample, first = resume["epoch"], resume["start_sample"], resume["next_batch"]
            start_batch, share = first, (0, n)
        else:
            epoch, start_batch, start_sample = (int(v) for v in self._shared[:3].tolist())
            first, share = start_batch + w, (w, n)
        self._position = {"epoch": epoch, "start_sample": start_sample, "next_batch": first, "last_batch": None}
        client = Client(self.addr, transport=self.transport, token=self.token, tls_ca=self.tls_ca)
        pinned_epoch, pinned = (int(v) for v in self._shared[3:].tolist())
        stream = client.stream(
            self.dataset,
            rank=rank,
            world_size=world,
            epoch=epoch,
            start_batch=start_batch,
            start_sample=start_sample,
            worker=share,
            samples_fingerprint=(pinned & _U64) if pinned_epoch == epoch + 1 else None,
            **self.stream_kwargs,
        )
        try:
            for batch in stream:
                if pinned_epoch != epoch + 1:
                    # The epoch's first stream: the others of this epoch plan over its list.
                    fp = batch.samples_fingerprint
                    if fp and int(self._shared[3]) != epoch + 1:
                        self._shared[4] = fp - (1 << 64) if fp >= 1 << 63 else fp
                        self._shared[3] = epoch + 1
                    pinned_epoch = epoch + 1
                item = self._item(batch)
                self._position.update(last_batch=batch.batch, next_batch=batch.batch + n)
                yield item
        finally:
            stream.close()
            client.close()

    def _item(self, batch: Batch) -> Any:
        tensor = batch.to_torch()
        in_worker = get_worker_info() is not None
        if batch.shared and (in_worker or not self.zero_copy):
            # A worker's queue pickles the item later, on another thread, while this generator may already
            # have released the slot; and in the main process the daemon rewrites the slot a few batches
            # on, under a tensor the caller may have kept. Copy now (in a worker straight into shared
            # memory) and release.
            video = torch.empty(tensor.shape, dtype=tensor.dtype)
            if in_worker:
                video.share_memory_()
            video.copy_(tensor)
            batch.release()
        else:
            video = tensor
        label = torch.from_numpy(batch.label_indices)
        if self.output == "tuple":
            return video, label

        def per_clip(a: Any) -> Any:
            return a if isinstance(a, list) else torch.from_numpy(a)

        item: Dict[str, Any] = {
            "video": video,
            "label": label,
            "frames": per_clip(batch.frames),
            "pts_seconds": per_clip(batch.pts_seconds),
            "duration_seconds": per_clip(batch.duration_seconds),
            "videos": batch.videos,
            "labels": batch.labels,
            "batch": batch.batch,
            "batches_total": batch.batches_total,
            "skipped": batch.skipped,
        }
        return item

    # -- state -----------------------------------------------------------------------------------------

    def _identity(self) -> Dict[str, Any]:
        kw = self.stream_kwargs
        return {
            "dataset": self.dataset,
            "seed": int(kw.get("seed", 0)),
            "batch_size": int(kw["batch_size"]),
            "num_clips": int(kw.get("num_clips", 1)),
            "sampler": str(kw.get("sampler", "random-indices")).replace("_", "-"),
            "shuffle": bool(kw.get("shuffle", True)),
        }

    def state_dict(self) -> Dict[str, Any]:
        """This process's place in the epoch (torchdata's ``Stateful``): in a DataLoader worker, the
        worker's (StatefulDataLoader collects one per worker); in the main process with ``num_workers=0``,
        the rank's. ``next_batch`` is the first batch of this process's share not yielded yet."""
        w, n = _worker()
        rank, world = self._rank()
        if self._resume is not None:
            p = dict(self._resume, last_batch=None)
        elif self._position is not None:
            p = self._position
        else:
            p = {
                "epoch": self.epoch,
                "start_sample": self.start_sample,
                "next_batch": self.start_batch + w,
                "last_batch": None,
            }
        return {
            "vserve_client": STATE_VERSION,
            **self._identity(),
            "rank": rank,
            "world_size": world,
            "worker": w,
            "num_workers": n,
            "epoch": int(p["epoch"]),
            "start_sample": int(p["start_sample"]),
            "next_batch": int(p["next_batch"]),
            "last_batch": p["last_batch"],
        }

    def state_for(self, epoch: int, next_batch: int) -> Dict[str, Any]:
        """The state of this rank after it consumed batches ``0 .. next_batch - 1`` of ``epoch`` (for a
        plain DataLoader: ``next_batch`` = the last item's ``"batch"`` + 1), to save and later pass to
        :meth:`load_state_dict`, whatever the world size then."""
        rank, world = self._rank()
        return {
            "vserve_client": STATE_VERSION,
            **self._identity(),
            "rank": rank,
            "world_size": world,
            "worker": 0,
            "num_workers": 1,
            "epoch": int(epoch),
            "start_sample": self.start_sample if int(epoch) == self.epoch else 0,
            "next_batch": int(next_batch),
            "last_batch": int(next_batch) - 1 if next_batch > 0 else None,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes from a saved state (torchdata's ``Stateful``): a state of :meth:`state_dict` or
        :meth:`state_for`, or a whole ``StatefulDataLoader.state_dict()``.

        In a DataLoader worker (StatefulDataLoader restoring its workers) the state must come from the same
        worker of the same world size; the worker resumes at its own next batch. In the main process the
        rank's progress becomes the next iteration's start, for every worker: with the same world size,
        ``start_batch``; with another, the global sample offset ``start_sample`` (see the module doc)."""
        if not isinstance(state, dict):
            raise TypeError(f"expected a state dict, got {type(state).__name__}")
        if "vserve_client" not in state:
            self._load_loader_state(state)
            return
        self._check_state(state)
        info = get_worker_info()
        if info is not None:
            rank, world = self._rank()
            if (state["world_size"], state["num_workers"], state["worker"]) != (world, info.num_workers, info.id):
                raise ValueError(
                    f"a worker state of worker {state['worker']} of {state['num_workers']} at world size "
                    f"{state['world_size']} cannot resume worker {info.id} of {info.num_workers} at world size "
                    f"{world}: load the loader's whole state into the dataset instead (ds.load_state_dict("
                    "saved_loader_state)) and do not load it into the new loader"
                )
            self._resume = {
                "epoch": int(state["epoch"]),
                "start_sample": int(state["start_sample"]),
                "next_batch": int(state["next_batch"]),
            }
            return
        if state["num_workers"] != 1:
            raise ValueError(
                f"this is the state of DataLoader worker {state['worker']} of {state['num_workers']}: one "
                "worker's place is not the rank's; load the loader's whole state (StatefulDataLoader.state_dict())"
            )
        self._resume_rank(state, int(state["next_batch"]))

    def _check_state(self, state: Dict[str, Any]) -> None:
        if state.get("vserve_client") != STATE_VERSION:
            raise ValueError(f"state version {state.get('vserve_client')!r}: this client reads {STATE_VERSION}")
        mine = self._identity()
        differ = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if differ:
            raise ValueError(
                "the state was saved by a dataset reading other batches: "
                + ", ".join(f"{k} {a!r} (saved) != {b!r}" for k, (a, b) in differ.items())
            )

    def _resume_rank(self, state: Dict[str, Any], frontier: int) -> None:
        """Starts the next iteration after the rank's batches ``< frontier`` of the saved numbering."""
        _, world = self._rank()
        epoch, start_sample = int(state["epoch"]), int(state["start_sample"])
        if state["world_size"] == world:
            self.set_epoch(epoch, start_batch=frontier, start_sample=start_sample)
            return
        if not self._fixed_clips():
            raise ValueError(
                f"saved at world size {state['world_size']}, now {world}: regular-timestamps sampling has no "
                "world-size-independent resume point (its clip count per video is known only while reading)"
            )
        offset = global_offset(
            frontier,
            batch_size=int(state["batch_size"]),
            num_clips=int(state["num_clips"]),
            world_size=int(state["world_size"]),
            start_sample=start_sample,
        )
        self.set_epoch(epoch, start_batch=0, start_sample=offset)

    def _load_loader_state(self, state: Dict[str, Any]) -> None:
        """A whole StatefulDataLoader state: the rank's frontier is the batch after the last one the loader
        yielded (its workers' latest, plus the steps taken since the snapshot)."""
        if "dataset_state" in state:  # num_workers=0: the dataset's own state, taken live
            inner = state["dataset_state"]
            if inner is None:
                raise ValueError("the loader's state holds no dataset state (was it saved with this dataset?)")
            self.load_state_dict(inner)
            return
        snapshot = state.get("_snapshot")
        if not isinstance(snapshot, dict) or "_worker_snapshots" not in snapshot:
            raise ValueError(
                "not a state of this dataset nor of a StatefulDataLoader (expected 'vserve_client', "
                "'dataset_state' or '_snapshot' keys)"
            )
        states = [w.get("dataset_state") for w in snapshot["_worker_snapshots"].values()]
        if not states or any(s is None for s in states):
            raise ValueError("the loader's state lacks a worker's dataset state")
        for s in states:
            self._check_state(s)
        first = states[0]
        if any((s["epoch"], s["start_sample"], s["world_size"]) != (first["epoch"], first["start_sample"], first["world_size"]) for s in states):
            raise ValueError("the workers' states disagree on the epoch, start_sample or world size")
        yielded = [s["last_batch"] for s in states if s["last_batch"] is not None]
        if yielded:
            frontier = max(yielded) + 1 + int(state.get("_steps_since_snapshot", 0))
        else:
            frontier = min(s["next_batch"] for s in states) + int(state.get("_steps_since_snapshot", 0))
        self._resume_rank(first, frontier)


__all__ = ["VideoClipDataset"]
