"""Splitting one rank's batches among data-loader worker processes, without torch.

A rank's epoch is a numbered sequence of batches ``0 .. batches_total - 1`` (the daemon's StreamBatches
numbering). With ``n`` workers and resuming at ``start_batch``, worker ``w`` takes the batches ``b >=
start_batch`` with ``(b - start_batch) % n == w``; from a fresh start (``start_batch = 0``) that is
``b % n == w``. Every batch goes to exactly one worker, and since PyTorch's DataLoader takes one item from
each worker in turn (worker 0, 1, ..., n-1, 0, ...), the loader yields the batches in their order
``start_batch, start_batch + 1, ...``: a trainer that records the last batch number it consumed resumes with
``start_batch = batch + 1`` and gets neither a repeat nor a gap. (Counting from ``start_batch`` rather than
from 0 keeps that order when resuming: with ``b % n == w`` a resume at 5 with two workers would yield 6 first.)

Fetching: each worker opens one StreamBatches call for the rank with ``worker``/``num_workers`` set; the
daemon plans the rank's whole epoch and prepares and sends only that worker's batches (numbered as in the
rank's stream), with the call's prefetch.
"""

from __future__ import annotations

from typing import Mapping, Optional, Tuple


def worker_batches(start_batch: int, batches_total: int, worker: int, num_workers: int) -> range:
    """The batch numbers worker ``worker`` of ``num_workers`` takes (see the module doc)."""
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} of {num_workers}: need 0 <= worker < num_workers")
    return range(start_batch + worker, max(batches_total, start_batch + worker), num_workers)


def resolve_rank(
    rank: Optional[int],
    world_size: Optional[int],
    distributed: Optional[Tuple[int, int]],
    env: Mapping[str, str],
) -> Tuple[int, int]:
    """This process's (rank, world size): given explicitly, else torch.distributed's when it is initialised
    (``distributed`` = its (rank, world size), None when not), else the RANK and WORLD_SIZE environment
    variables torchrun sets, else (0, 1)."""
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError(f"rank={rank} world_size={world_size}: give both or neither")
        r, n = int(rank), int(world_size)
    elif distributed is not None:
        r, n = distributed
    elif env.get("RANK") is not None or env.get("WORLD_SIZE") is not None:
        try:
            r, n = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
        except ValueError:
            raise ValueError(f"RANK={env.get('RANK')!r} WORLD_SIZE={env.get('WORLD_SIZE')!r}: expected ints") from None
    else:
        r, n = 0, 1
    if n < 1 or not 0 <= r < n:
        raise ValueError(f"rank {r} of world size {n}: need 0 <= rank < world_size")
    return r, n


def shard_size(samples: int, rank: int, world_size: int, shard_remainder: str = "uneven") -> int:
    """How many samples rank ``rank`` of ``world_size`` reads from an epoch of ``samples`` (the daemon's
    sharding: rank r takes positions r, r + W, ... of the epoch's order; "pad" repeats the order's first
    samples so every rank gets ceil(N / W), "drop" leaves out the last N mod W)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world size {world_size}: need 0 <= rank < world_size")
    n = max(int(samples), 0)
    if shard_remainder == "uneven":
        return len(range(rank, n, world_size))
    if shard_remainder == "pad":
        return -(-n // world_size) if n else 0
    if shard_remainder == "drop":
        return n // world_size
    raise ValueError(f"shard_remainder={shard_remainder!r}: expected 'uneven', 'pad' or 'drop'")


def batches_in_epoch(
    samples: int,
    *,
    batch_size: int,
    num_clips: int = 1,
    rank: int = 0,
    world_size: int = 1,
    shard_remainder: str = "uneven",
    drop_last: bool = False,
    start_sample: int = 0,
) -> int:
    """The number of batches of one rank's epoch, as the daemon numbers them (``batches_total``): the
    rank's samples times ``num_clips`` clips, cut into batches of ``batch_size`` (the last one partial
    unless ``drop_last``). ``start_sample`` samples of the epoch's order are left out first. Samplers
    with a fixed clip count only (not regular timestamps)."""
    clips = shard_size(max(samples - start_sample, 0), rank, world_size, shard_remainder) * num_clips
    return clips // batch_size if drop_last else -(-clips // batch_size)


def global_offset(
    next_batch: int, *, batch_size: int, num_clips: int = 1, world_size: int = 1, start_sample: int = 0
) -> int:
    """The samples of the epoch's order that every rank has consumed when each has taken its batches
    ``0 .. next_batch - 1`` (ranks step together, as in data-parallel training): a resume point that does
    not depend on the world size (StreamBatches' ``start_sample``).

    Rank r's k-th sample is the epoch order's position ``start_sample + r + k·W``, so after m whole samples
    per rank the first ``start_sample + m·W`` positions are consumed. m counts whole samples: when
    ``next_batch · batch_size`` is not a multiple of ``num_clips`` the sample a batch boundary cut in two
    is read again in full after the resume."""
    return start_sample + (next_batch * batch_size // num_clips) * world_size
