"""Deferred CPU kernel calls (kernels/deferred.py): when they run, in what order, and what
happens to errors and to a flag assumed clear."""

import pytest
import torch

from kernels import backend, deferred
from kernels.precision import fused_int8_lanes
from kernels.rows import gather_rows

# the deferrable call these tests make is the int8 quantizer (AVX2 at least); the network's
# deferred calls in fp32 and bf16 are tested on every CPU (tests/app/test_deferred_network.py)
pytestmark = pytest.mark.skipif(not fused_int8_lanes(), reason="this CPU has no int8 kernel (AVX2)")


def quantize_call(rows: torch.Tensor):
    """A deferrable call: (q, scale, negative flag) that ls_quantize_rows_u8_cpu fills."""
    n, c = rows.shape
    q = torch.zeros(n, c, dtype=torch.uint8)
    scale = torch.zeros(n)
    negative = torch.zeros(1, dtype=torch.int64)
    backend.call("quantize_rows_u8", "cpu", rows, n, c, q, scale, negative)
    return q, scale, negative


@pytest.fixture
def rows():
    return torch.rand(64, 8, generator=torch.Generator().manual_seed(3)) + 0.5


def test_deferrable_calls_wait_until_the_block_ends(rows):
    expected, _, _ = quantize_call(rows)
    with torch.no_grad(), deferred.calls_deferred():
        assert deferred.deferring()
        q, scale, _ = quantize_call(rows)
        assert not q.any() and not scale.any()  # not run yet
    assert not deferred.deferring()
    assert torch.equal(q, expected)


def test_another_kernel_runs_after_the_waiting_calls(rows):
    """gather_rows is not deferrable: the quantizer waiting before it runs first, so it reads
    the scales the quantizer wrote."""
    _, expected, _ = quantize_call(rows)
    idx = torch.tensor([5, 0, 63], dtype=torch.int32)
    with torch.no_grad(), deferred.calls_deferred():
        _, scale, _ = quantize_call(rows)
        picked = gather_rows(scale.view(-1, 1), idx)
    assert torch.equal(picked.view(-1), expected[idx.long()])


def test_eager_blocks_and_settle_run_the_waiting_calls(rows):
    expected, _, _ = quantize_call(rows)
    with torch.no_grad(), deferred.calls_deferred():
        q, _, _ = quantize_call(rows)
        with deferred.eager():
            assert torch.equal(q, expected)  # ran on the way in
            assert not deferred.deferring()
            q2, _, _ = quantize_call(rows)
            assert torch.equal(q2, expected)  # ran at once
        q3, _, _ = quantize_call(rows)
        assert not q3.any()
        deferred.settle()
        assert torch.equal(q3, expected)


def test_at_most_max_pending_calls_wait(rows, monkeypatch):
    monkeypatch.setattr(deferred, "MAX_PENDING", 3)
    with torch.no_grad(), deferred.calls_deferred():
        made = [quantize_call(rows)[0] for _ in range(4)]
        assert [bool(q.any()) for q in made] == [True, True, True, False]


def test_a_bad_status_raises_from_the_settle_and_drops_the_calls_after_it(rows):
    n, c = rows.shape
    q, scale, negative = (torch.zeros(n, c, dtype=torch.uint8), torch.zeros(n), torch.zeros(1))
    with pytest.raises(backend.KernelError, match="ls_quantize_rows_u8_cpu: bad argument"):
        with torch.no_grad(), deferred.calls_deferred():
            backend.call("quantize_rows_u8", "cpu", rows, -1, c, q, scale, negative.long())
            after, _, _ = quantize_call(rows)
    assert not after.any()
    assert deferred.pending() is None
    with torch.no_grad(), deferred.calls_deferred():  # and the next block starts clean
        again, _, _ = quantize_call(rows)
    assert again.any()


def test_a_bad_argument_raises_where_the_call_is_made(rows):
    with torch.no_grad(), deferred.calls_deferred():
        with pytest.raises(TypeError):
            backend.call("quantize_rows_u8", "cpu", rows, 64)
        with pytest.raises(TypeError, match="must be torch.float32, got torch.float64"):
            backend.call("quantize_rows_u8", "cpu", rows.double(), 64, 8, None, None, None)
        assert deferred.pending() == []  # neither waits


def test_a_block_that_raises_drops_its_waiting_calls(rows):
    with pytest.raises(ValueError), torch.no_grad(), deferred.calls_deferred():
        q, _, _ = quantize_call(rows)
        raise ValueError("a layer's own error")
    assert not q.any()
    assert deferred.pending() is None


def test_a_flag_assumed_clear_is_checked_once_its_kernel_ran(rows):
    bad = rows.clone()
    bad[7, 2] = float("inf")  # the quantizer sets its flag
    with pytest.raises(deferred.AssumptionFailed), torch.no_grad():
        with deferred.calls_deferred():
            _, _, negative = quantize_call(bad)
            deferred.check_after(negative.numpy())
    with torch.no_grad(), deferred.calls_deferred():  # clear: no error
        _, _, negative = quantize_call(rows)
        deferred.check_after(negative.numpy())
    assert negative.item() == 0


def test_nothing_waits_where_autograd_records_or_in_another_thread(rows):
    import threading

    expected, _, _ = quantize_call(rows)
    with torch.enable_grad(), deferred.calls_deferred():
        assert not deferred.deferring()
        q, _, _ = quantize_call(rows)
        assert torch.equal(q, expected)
    seen = []
    with torch.no_grad(), deferred.calls_deferred():
        thread = threading.Thread(target=lambda: seen.append(deferred.deferring()))
        thread.start()
        thread.join()
    assert seen == [False]


def test_nested_blocks_are_one_block(rows):
    with torch.no_grad(), deferred.calls_deferred():
        with deferred.calls_deferred():
            q, _, _ = quantize_call(rows)
        assert not q.any()  # the inner block's end settles nothing
    assert q.any()


def test_a_copy_of_waiting_rows_is_made_once_they_are_written(rows):
    expected, _, _ = quantize_call(rows)
    with torch.no_grad(), deferred.calls_deferred():
        q, scale, _ = quantize_call(rows)
        assert deferred.contiguous(scale) is scale  # no copy: nothing to wait for
        assert not q.any()
        copied = deferred.contiguous(q.t(), torch.float32)
    assert torch.equal(copied, expected.t().float())
