"""The client's StreamBatches path over a real gRPC channel, against the stand-in daemon (fake_daemon.py):
multi-chunk batches, rank shards, worker splitting, errors in the middle of a stream."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest

import vserve_client
from fake_daemon import FRAME, SAMPLES, clip_value


def expected(seed=0, epoch=0, rank=0, world=1, batch_size=4, t=2, drop_last=False, shuffle=True) -> List[dict]:
    """What the fake daemon's rules give, batch by batch."""
    mine = [i for i in range(SAMPLES) if i % world == rank]
    if shuffle and epoch % 2 == 1:
        mine.reverse()
    total = len(mine) // batch_size if drop_last else -(-len(mine) // batch_size)
    out = []
    for b in range(total):
        samples = mine[b * batch_size : (b + 1) * batch_size]
        arr = np.stack(
            [np.full((t, *FRAME), clip_value(seed, s, epoch), dtype=np.uint8) for s in samples]
        )
        out.append({"batch": b, "total": total, "samples": samples, "array": arr})
    return out


def check(batches: List[vserve_client.Batch], want: List[dict], t: int = 2) -> None:
    assert [b.batch for b in batches] == [w["batch"] for w in want]
    for b, w in zip(batches, want):
        assert b.batches_total == w["total"]
        assert [c["sample"] for c in b.clips] == w["samples"]
        assert b.videos == [f"v{s}.mp4" for s in w["samples"]]
        assert b.frames.tolist() == [list(range(s, s + t)) for s in w["samples"]]
        assert b.label_indices.tolist() == [s % 3 for s in w["samples"]]
        assert b.labels == [f"class{s % 3}" for s in w["samples"]]
        assert np.array_equal(b.array, w["array"]), f"batch {b.batch}"


def test_stream_reassembles_each_batch(fake):
    with vserve_client.Client(fake.addr) as c:
        batches = list(c.stream("synthetic", batch_size=4, num_frames_per_clip=2, seed=5, epoch=1))
    check(batches, expected(seed=5, epoch=1))
    assert batches[0].array.nbytes > 5 * 100  # spanned several chunks


def test_ranks_get_disjoint_covering_shards(fake):
    seen = []
    with vserve_client.Client(fake.addr) as c:
        for rank in range(3):
            batches = list(c.stream("synthetic", batch_size=3, num_frames_per_clip=2, rank=rank, world_size=3))
            check(batches, expected(rank=rank, world=3, batch_size=3))
            seen += [c["sample"] for b in batches for c in b.clips]
    assert sorted(seen) == list(range(SAMPLES))


def test_resume_and_drop_last(fake):
    with vserve_client.Client(fake.addr) as c:
        tail = list(c.stream("synthetic", batch_size=4, num_frames_per_clip=2, start_batch=4))
        full = expected()
        check(tail, full[4:])
        dropped = list(c.stream("synthetic", batch_size=4, num_frames_per_clip=2, drop_last=True))
        check(dropped, expected(drop_last=True))


@pytest.mark.parametrize("n, start", [(2, 0), (3, 0), (4, 2)])
def test_worker_split_over_grpc(fake, n, start):
    full = {w["batch"]: w for w in expected()}
    got = {}
    before = len(fake.calls())
    with vserve_client.Client(fake.addr) as c:
        for w in range(n):
            for b in c.stream("synthetic", batch_size=4, num_frames_per_clip=2, start_batch=start, worker=(w, n)):
                assert (b.batch - start) % n == w and b.batch not in got
                got[b.batch] = b
    assert sorted(got) == [b for b in sorted(full) if b >= start]
    for b, batch in got.items():
        check([batch], [full[b]])
    calls = fake.calls()[before:]
    # One call per worker, naming its share.
    assert sorted((call[4], call[5]) for call in calls) == [(w, n) for w in range(n)]


def test_error_in_the_middle_of_a_stream(fake):
    with vserve_client.Client(fake.addr) as c:
        stream = c.stream("fails-after-1", batch_size=4, num_frames_per_clip=2)
        first = next(stream)
        assert first.batch == 0
        with pytest.raises(vserve_client.DataLoss) as e:
            next(stream)
        assert e.value.code == "DATA_LOSS" and "v3.mp4" in e.value.message
        with pytest.raises(vserve_client.NotFound, match="no-such"):
            list(c.stream("no-such", batch_size=1))


def test_closing_a_stream_early_leaves_the_client_usable(fake):
    with vserve_client.Client(fake.addr) as c:
        with c.stream("synthetic", batch_size=1, num_frames_per_clip=2) as stream:
            assert next(stream).batch == 0
        again = list(c.stream("synthetic", batch_size=8, num_frames_per_clip=2))
        check(again, expected(batch_size=8))


def test_worker_split_without_a_known_total(fake):
    kw = dict(batch_size=4, num_frames_per_clip=2, sampler="regular-timestamps", seconds_between_clip_starts=1.0)
    with vserve_client.Client(fake.addr) as c:
        full = list(c.stream("synthetic", **kw))
        assert all(b.batches_total is None for b in full)
        got = sorted((b.batch for w in range(3) for b in c.stream("synthetic", worker=(w, 3), **kw)))
    assert got == [b.batch for b in full] == list(range(len(expected())))
