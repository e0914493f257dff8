"""vserve_client.torch.VideoClipDataset, only where torch is installed (CI does not install it).

Most tests read the stand-in daemon (fake_daemon.py), whose batches are known exactly; one reads the real
daemon's StreamBatches (skipped while it answers UNIMPLEMENTED).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import vserve_client  # noqa: E402
from vserve_client._proto import vserve_pb2 as pb  # noqa: E402
from vserve_client.batch import Batch  # noqa: E402
from vserve_client.torch import VideoClipDataset  # noqa: E402
from test_fake_stream import expected  # noqa: E402

KW = dict(batch_size=4, num_frames_per_clip=2)


def batches_of(loader):
    return [(item["batch"], item) for item in loader]


def check_items(items, want):
    assert [b for b, _ in items] == [w["batch"] for w in want]
    for (_, item), w in zip(items, want):
        assert isinstance(item["video"], torch.Tensor) and item["video"].dtype == torch.uint8
        assert torch.equal(item["video"], torch.from_numpy(w["array"]))
        assert item["label"].tolist() == [s % 3 for s in w["samples"]]
        assert item["videos"] == [f"v{s}.mp4" for s in w["samples"]]
        assert item["batches_total"] == w["total"]


@pytest.fixture(autouse=True)
def no_rank_env(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def test_tensors_share_memory_with_the_batch():
    h = pb.BatchHeader(shape=[1, 1, 2, 2, 3], nbytes=12)
    h.clips.add(video="a.mp4", frame_indices=[0], pts=[0], pts_seconds=[0.0], label_index=2)
    batch = Batch(h, np.arange(12, dtype=np.uint8).reshape(1, 1, 2, 2, 3))
    ds = VideoClipDataset("unix:/unused.sock", "d", batch_size=1)
    item = ds._item(batch)
    assert item["video"].data_ptr() == batch.array.ctypes.data  # torch.from_numpy: no copy
    assert item["label"].tolist() == [2]
    ds_t = VideoClipDataset("unix:/unused.sock", "d", batch_size=1, output="tuple")
    video, label = ds_t._item(batch)
    assert video.shape == (1, 1, 2, 2, 3) and label.dtype == torch.int64


def test_single_process_loader(fake):
    ds = VideoClipDataset(fake.addr, "synthetic", seed=3, **KW)
    check_items(batches_of(DataLoader(ds, batch_size=None)), expected(seed=3))
    ds.set_epoch(1)
    check_items(batches_of(DataLoader(ds, batch_size=None)), expected(seed=3, epoch=1))


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_split_batches_in_order_without_duplicates(fake, workers):
    ds = VideoClipDataset(fake.addr, "synthetic", **KW)
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    check_items(batches_of(loader), expected())


def test_resume_with_workers(fake):
    ds = VideoClipDataset(fake.addr, "synthetic", **KW)
    ds.set_epoch(1, start_batch=3)
    items = batches_of(DataLoader(ds, batch_size=None, num_workers=2))
    check_items(items, expected(epoch=1)[3:])


def test_rank_from_environment(fake, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = VideoClipDataset(fake.addr, "synthetic", **KW)
    assert (ds.rank, ds.world_size) == (1, 2)
    check_items(batches_of(DataLoader(ds, batch_size=None, num_workers=2)), expected(rank=1, world=2))
    explicit = VideoClipDataset(fake.addr, "synthetic", rank=0, world_size=3, **KW)
    assert (explicit.rank, explicit.world_size) == (0, 3)


def test_tuple_output(fake):
    ds = VideoClipDataset(fake.addr, "synthetic", output="tuple", **KW)
    items = list(DataLoader(ds, batch_size=None))
    want = expected()
    assert len(items) == len(want)
    for (video, label), w in zip(items, want):
        assert torch.equal(video, torch.from_numpy(w["array"]))
        assert label.tolist() == [s % 3 for s in w["samples"]]


def test_bad_arguments_fail_at_construction():
    with pytest.raises(TypeError, match="bogus"):
        VideoClipDataset("unix:/x.sock", "d", batch_size=1, bogus=2)
    with pytest.raises(vserve_client.InvalidArgument):
        VideoClipDataset("unix:/x.sock", "d", batch_size=0)
    with pytest.raises(ValueError):
        VideoClipDataset("unix:/x.sock", "d", batch_size=1, output="list")


@pytest.mark.parametrize("workers", [0, 2])
def test_real_daemon_stream(daemon, workers):
    # Shared memory (the Unix socket's default) against inline bytes: workers copy each slot into a
    # torch shared-memory tensor before releasing it; the main process holds views, cloned here.
    kw = dict(batch_size=1, num_clips=3, num_frames_per_clip=2, size=(24, 32), seed=1)
    ds = VideoClipDataset(daemon.addr, "clips", **kw)
    try:
        items = [
            dict(item, video=item["video"].clone())
            for item in DataLoader(ds, batch_size=None, num_workers=workers)
        ]
    except vserve_client.Unimplemented:
        pytest.skip("the daemon answers UNIMPLEMENTED for StreamBatches (server side not landed yet)")
    with daemon.client(transport="inline") as inline, inline.stream("clips", **kw) as stream:
        want = list(stream)
    assert [i["batch"] for i in items] == [b.batch for b in want]
    for item, b in zip(items, want):
        assert torch.equal(item["video"], torch.from_numpy(b.array))
