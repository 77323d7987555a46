"""kernels/kmap.py sort_by_out: an output twice in one offset is refused even where the entries
already ascend (csrc/kmap_cpu.cpp copies such a segment as it is)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("twin", ["c", "torch"])
def test_an_output_twice_in_an_ascending_offset_is_refused(twin):
    from kernels.backend import KernelError
    from kernels.kmap import _sort_by_out_torch, sort_by_out

    sort = sort_by_out if twin == "c" else _sort_by_out_torch
    ins = torch.tensor([5, 6, 7], dtype=torch.int32)
    for outs in ([0, 2, 2], [1, 1, 3]):
        with pytest.raises(KernelError, match="bad argument"):
            sort(ins, torch.tensor(outs, dtype=torch.int32), (0, 3), 4)
    got = sort(ins, torch.tensor([0, 2, 3], dtype=torch.int32), (0, 3), 4)  # ascending: a copy
    assert got[0].tolist() == [5, 6, 7] and got[1].tolist() == [0, 2, 3]
