"""The inference worker's batching, with a stand-in pipeline: a batch waits max_wait_s for more
frames (within its deadlines, cut short by a stop or a frame that cannot join), and holds at most
max_batch_points."""

from __future__ import annotations

import time


from app.service.worker import InferenceWorker, WorkerStats
from tests.app.worker_helpers import FakePipeline, batched, frame, wait_until_taken


def test_a_frame_submitted_while_the_first_waits_joins_its_batch():
    """The auditor's case: the worker took the first frame with the queue empty; one submitted
    next, within max_wait_s, runs in the same batch (ed17c00's worker waited only while frames
    were queued, so it ran them one by one)."""
    sizes: list[int] = []
    pipe = FakePipeline()
    w = InferenceWorker(
        pipe, 4, max_batch=4, max_wait_s=2.0, stats=WorkerStats(on_batch=sizes.append)
    )
    first = w.submit(frame(1, 10), "kitti", time.monotonic() + 30)
    wait_until_taken(w)  # the queue is empty now: the worker holds the first frame
    second = w.submit(frame(2, 10), "kitti", time.monotonic() + 30)
    assert first.future.result(30) == second.future.result(30) == 10
    assert sizes == [2] and pipe.ran == [1, 2]
    w.stop(30)


def test_without_max_wait_a_lone_frame_runs_at_once():
    """max_wait_s = 0 (the default): the worker runs a lone frame without waiting for another,
    however large max_batch; the next frame, submitted while the first one runs, runs alone."""
    sizes: list[int] = []
    pipe = FakePipeline()
    pipe.gate.clear()  # hold the first run
    w = InferenceWorker(pipe, 4, max_batch=4, stats=WorkerStats(on_batch=sizes.append))
    first = w.submit(frame(1, 10), "kitti", time.monotonic() + 30)
    wait_until_taken(w)
    second = w.submit(frame(2, 10), "kitti", time.monotonic() + 30)
    pipe.gate.set()
    assert first.future.result(30) == second.future.result(30) == 10
    assert sizes == [1, 1] and pipe.ran == [1, 2]
    w.stop(30)


def test_stop_ends_the_wait_and_the_held_frame_still_runs():
    """stop() during a 60 s wait: the thread ends well before the wait would have (within stop's
    30 s), after running the frame it held (stop finishes the queued work)."""
    pipe = FakePipeline()
    w = InferenceWorker(pipe, 4, max_batch=4, max_wait_s=60.0)
    job = w.submit(frame(1, 10), "kitti", time.monotonic() + 600)
    wait_until_taken(w)
    assert not w.idle  # a held frame keeps the worker busy (the drain waits for it)
    w.stop(30)
    assert not w.alive
    assert job.future.result(0) == 10 and pipe.ran == [1]


def test_the_wait_leaves_room_for_the_deadline():
    """A 60 s wait and a frame due in 3 s: the frame is held only for its share of the slack
    (WAIT_SLACK_SHARE), then runs in time (not DeadlineExceeded), within result's 30 s."""
    sizes: list[int] = []
    pipe = FakePipeline()
    w = InferenceWorker(
        pipe, 4, max_batch=4, max_wait_s=60.0, stats=WorkerStats(on_batch=sizes.append)
    )
    job = w.submit(frame(1, 10), "kitti", time.monotonic() + 3)
    assert job.future.result(30) == 10 and sizes == [1]
    w.stop(30)


def test_a_frame_that_cannot_join_ends_the_wait():
    """A frame with layer timing never shares a batch with others; arriving while a batch waits,
    it ends that wait (holding the batch would only delay it), then waits in a batch of its own
    (ended here by stop)."""
    sizes: list[int] = []
    pipe = FakePipeline()
    stats = WorkerStats(on_batch=sizes.append)
    w = InferenceWorker(pipe, 4, max_batch=4, max_wait_s=60.0, stats=stats)
    first = w.submit(frame(1, 10), "kitti", time.monotonic() + 600)
    wait_until_taken(w)
    timed = w.submit(frame(2, 10), "kitti", time.monotonic() + 600, layer_timing=True)
    assert first.future.result(30) == 10  # long before the 60 s wait's end
    assert sizes == [1] and pipe.ran == [1]
    w.stop(30)
    assert timed.future.result(0) == 10 and sizes == [1, 1] and pipe.ran == [1, 2]


def test_a_frame_cancelled_while_its_batch_waits_never_runs():
    """A client that leaves has its job's future cancelled (the route's wait_result; the worker's
    cancel only removes queued jobs): a frame held by a waiting batch is then dropped as the batch
    starts, and the frame that filled the batch runs."""
    sizes, drops = [], []
    pipe = FakePipeline()
    stats = WorkerStats(on_batch=sizes.append, on_drop=drops.append)
    w = InferenceWorker(pipe, 4, max_batch=2, max_wait_s=60.0, stats=stats)
    gone = w.submit(frame(1, 10), "kitti", time.monotonic() + 600)
    wait_until_taken(w)
    assert not w.cancel(gone, "client_gone")  # as the route: not queued any more
    assert gone.future.cancel()
    kept = w.submit(frame(2, 10), "kitti", time.monotonic() + 600)  # fills the batch
    assert kept.future.result(30) == 10
    assert pipe.ran == [2] and sizes == [1] and drops == ["client_gone"]
    w.stop(30)


def test_a_batch_holds_at_most_max_batch_points():
    """Four queued frames of 40 points under a 100-point bound run as batches of 2, 2 (the
    service passes LIDARSEG_MAX_POINTS: a batch's peak memory is that of one frame at the limit,
    where four 2 M-point frames in one forward took 6 GB); a frame alone over it still runs."""
    assert batched(150, [40] * 4, 100) == ([150, 40, 40, 40, 40], [1, 2, 2], [0, 1, 2, 3, 4])
    # a first frame over the bound takes no company (it was 'no bound' before)
    assert batched(10, [150, 60], 100)[:2] == ([10, 150, 60], [1, 1, 1])


def test_a_batch_may_fill_max_batch_points_exactly():
    """Frames of 50 points under a 100-point bound run two by two: a frame that fills the room
    left to the last point joins (a `<=` there ran them one by one)."""
    assert batched(10, [50] * 4, 100) == ([10, 50, 50, 50, 50], [1, 2, 2], [0, 1, 2, 3, 4])
