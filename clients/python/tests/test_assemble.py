"""Chunk reassembly on fake message sequences: the wire rules of batch.py, without a daemon."""

from __future__ import annotations

import numpy as np
import pytest

from vserve_client import ProtocolError
from vserve_client._proto import vserve_pb2 as pb
from vserve_client.batch import assemble_batches, assemble_one

NP_TO_WIRE = {np.dtype("u1"): pb.DTYPE_UINT8, np.dtype("<f2"): pb.DTYPE_FLOAT16, np.dtype("<f4"): pb.DTYPE_FLOAT32}


def header_for(array: np.ndarray, batch: int = 0, total: int = 0, layout=pb.LAYOUT_THWC) -> pb.BatchHeader:
    h = pb.BatchHeader(
        shape=list(array.shape),
        dtype=NP_TO_WIRE[array.dtype],
        layout=layout,
        nbytes=array.nbytes,
        batch=batch,
        batches_total=total,
    )
    for i in range(array.shape[0]):
        t = array.shape[1]
        h.clips.add(
            video=f"v{i}.mp4",
            frame_indices=list(range(i, i + t)),
            pts=[100 * k for k in range(t)],
            pts_seconds=[0.5 * k for k in range(t)],
            label=f"class{i}",
            label_index=i,
            sample=10 + i,
            clip=0,
        )
    h.stats.frames_decoded = 7
    return h


def messages_for(array: np.ndarray, chunk: int, first_carries_data: bool, cls=pb.StreamBatchesResponse, **hdr):
    """The messages the daemon sends for one array: header first, then chunks of ``chunk`` bytes."""
    data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    msgs = [cls(header=header_for(array, **hdr))]
    offsets = range(0, len(data), chunk)
    for i, off in enumerate(offsets):
        piece = data[off : off + chunk]
        if i == 0 and first_carries_data:
            msgs[0].offset = off
            msgs[0].data = piece
        else:
            msgs.append(cls(offset=off, data=piece))
    return msgs


def sample_array(dtype, shape=(2, 3, 4, 5, 3), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "u":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    return rng.standard_normal(size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["u1", "<f2", "<f4"])
@pytest.mark.parametrize("chunk", [1, 7, 64, 10**6])
@pytest.mark.parametrize("first_carries_data", [False, True])
def test_one_batch_reassembles_exactly(dtype, chunk, first_carries_data):
    want = sample_array(dtype)
    batch = assemble_one(messages_for(want, chunk, first_carries_data, cls=pb.GetClipsResponse))
    assert batch.array.dtype == want.dtype
    assert batch.array.shape == want.shape
    assert np.array_equal(batch.array, want)
    # One allocation of exactly nbytes, viewed as the dtype: the chunks were copied into it, not joined.
    assert batch.array.base is not None and batch.array.base.nbytes == want.nbytes
    assert batch.array.flags.c_contiguous and batch.array.flags.writeable


def test_batch_metadata_from_header():
    want = sample_array("u1", shape=(2, 3, 2, 2, 3))
    batch = assemble_one(messages_for(want, 5, True, batch=4, total=9, layout=pb.LAYOUT_TCHW))
    assert batch.videos == ["v0.mp4", "v1.mp4"]
    assert batch.labels == ["class0", "class1"]
    assert batch.label_indices.tolist() == [0, 1]
    assert batch.frames.tolist() == [[0, 1, 2], [1, 2, 3]]
    assert batch.frames.dtype == np.int64
    assert batch.pts.tolist() == [[0, 100, 200]] * 2
    assert batch.pts_seconds.tolist() == [[0.0, 0.5, 1.0]] * 2
    assert (batch.batch, batch.batches_total) == (4, 9)
    assert batch.layout == "TCHW"
    assert batch.stats["frames_decoded"] == 7 and batch.stats["cache_hits"] == 0
    assert batch.clips[1]["sample"] == 11 and batch.clips[1]["replaced_by"] is None
    assert batch.skipped == []
    assert len(batch) == 2


def test_skipped_samples_are_dicts():
    want = sample_array("u1", shape=(1, 1, 1, 1, 3))
    msgs = messages_for(want, 100, True)
    msgs[0].header.skipped.add(sample=3, video="bad.mp4", code="DATA_LOSS", message="corrupt")
    msgs[0].header.clips[0].replaced_by = 3
    batch = assemble_one(msgs)
    assert batch.skipped == [{"sample": 3, "video": "bad.mp4", "code": "DATA_LOSS", "message": "corrupt"}]
    assert batch.clips[0]["replaced_by"] == 3


def test_stream_of_batches_yields_each_when_complete():
    arrays = [sample_array("u1", seed=s) for s in range(3)] + [sample_array("<f4", shape=(1, 2, 3, 2, 3))]
    msgs = []
    for i, a in enumerate(arrays):
        msgs += messages_for(a, 50, first_carries_data=i % 2 == 0, batch=i, total=len(arrays))
    consumed = []

    def feed():
        for m in msgs:
            consumed.append(m)
            yield m

    it = assemble_batches(feed())
    ends = []
    for i, batch in enumerate(it):
        assert batch.batch == i
        assert np.array_equal(batch.array, arrays[i])
        ends.append(len(consumed))
    # Each batch came out right after its last chunk, not when the next header arrived.
    per_batch = [len(messages_for(a, 50, i % 2 == 0)) for i, a in enumerate(arrays)]
    assert ends == list(np.cumsum(per_batch))


def test_empty_array_batch():
    want = np.zeros((0, 8, 4, 4, 3), dtype=np.uint8)
    batch = assemble_one([pb.GetClipsResponse(header=header_for(want))])
    assert batch.array.shape == (0, 8, 4, 4, 3)
    assert batch.batches_total is None  # 0 on the wire: unknown / not a stream


def test_empty_stream_has_no_batches():
    assert list(assemble_batches([])) == []


def _bad(msgs, match):
    with pytest.raises(ProtocolError, match=match) as e:
        list(assemble_batches(msgs))
    assert e.value.code == "INTERNAL"


def test_chunk_out_of_order_is_refused():
    msgs = messages_for(sample_array("u1"), 64, False)
    msgs[1], msgs[2] = msgs[2], msgs[1]
    _bad(msgs, "offset 64 but 0 bytes received")


def test_missing_chunk_is_refused():
    msgs = messages_for(sample_array("u1"), 64, False)
    del msgs[-1]
    _bad(msgs, "stream ended after")


def test_overflow_is_refused():
    msgs = messages_for(sample_array("u1"), 64, False)
    msgs.append(pb.StreamBatchesResponse(offset=360, data=b"x" * 10))
    _bad(msgs, "chunk of 10 bytes at offset 360 before any batch header")
    msgs = messages_for(sample_array("u1"), 64, False)
    msgs[-1].data = msgs[-1].data + b"extra"
    _bad(msgs, "exceed the announced 360 bytes")


def test_header_in_the_middle_of_a_batch_is_refused():
    a = sample_array("u1")
    msgs = messages_for(a, 64, False)
    _bad(msgs[:3] + messages_for(a, 64, False), "batch header arrived after 128 of 360 bytes")


def test_chunk_before_header_is_refused():
    _bad([pb.StreamBatchesResponse(offset=0, data=b"abc")], "before any batch header")


def test_header_size_mismatch_is_refused():
    h = header_for(sample_array("u1"))
    h.nbytes += 1
    _bad([pb.StreamBatchesResponse(header=h)], "announces 361 bytes but shape")


def test_unknown_dtype_is_refused():
    h = header_for(sample_array("u1"))
    h.dtype = 7
    _bad([pb.StreamBatchesResponse(header=h)], "unknown dtype 7")


def test_get_clips_reply_must_have_one_batch():
    a = sample_array("u1")
    with pytest.raises(ProtocolError, match="more than one batch header"):
        assemble_one(messages_for(a, 64, True) + messages_for(a, 64, True))
    with pytest.raises(ProtocolError, match="empty reply stream"):
        assemble_one([])
