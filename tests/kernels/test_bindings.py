"""The ctypes binding against csrc/api.h, api_cuda.h and common.h: argument types from the headers,
constants Python shares with the kernels, checks before a pointer reaches C, and errors that name
the same row on every path."""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

from kernels import (
    CoordHashTable,
    CoordinateRangeError,
    DuplicateCoordinateError,
    arguments,
    backend,
    build,
    downsample,
    hashtable,
    submanifold_map,
    toolchain,
)
from tests.conftest import DEVICES


def header_constants() -> dict[str, int]:
    """Every `constexpr NAME = expr;` of common.h, evaluated in order (C integer syntax)."""
    text = re.sub(r"//[^\n]*", "", (build.CSRC / "common.h").read_text())
    values: dict[str, int] = {}
    for name, expr in re.findall(r"constexpr\s+\w+\s+(k\w+)\s*=\s*([^;]+);", text):
        expr = re.sub(r"(\d+)(?:ull|ll|u)\b", r"\1", expr)
        values[name] = eval(expr, {}, dict(values))  # noqa: S307 (our own header)
    return values


SHARED = {  # common.h name -> the Python value that must equal it
    "kCoordBits": hashtable.COORD_BITS,
    "kBatchBits": hashtable.BATCH_BITS,
    "kCoordMin": hashtable.COORD_MIN,
    "kCoordMax": hashtable.COORD_MAX,
    "kBatchMax": hashtable.BATCH_MAX,
    "kEmptyKey": hashtable.EMPTY,
    "kMiss": hashtable.EMPTY,
    "kMaxProbes": hashtable.MAX_PROBES,
    "kMaxOffsets": hashtable.MAX_OFFSETS,
    "kErrorRowBits": hashtable.ERROR_ROW_BITS,
    "kNoError": hashtable.NO_ERROR,
    "kStatusOk": backend.Status.OK,
    "kStatusOutOfRange": backend.Status.OUT_OF_RANGE,
    "kStatusDuplicate": backend.Status.DUPLICATE,
    "kStatusProbeLimit": backend.Status.PROBE_LIMIT,
    "kStatusBadArgument": backend.Status.BAD_ARGUMENT,
    "kStatusCudaError": backend.Status.CUDA_ERROR,
}


def test_every_constant_python_shares_matches_common_h():
    values = header_constants()
    assert set(values) == set(SHARED), "a constant was added to common.h: share it or list it"
    for name, python in SHARED.items():
        # all-ones words (kEmptyKey, kNoError) are -1 as the int64 tensors Python fills
        expected = values[name] - (1 << 64) if values[name] >= 1 << 63 else values[name]
        assert int(python) == expected, name
    assert set(backend.Status) == {v for k, v in SHARED.items() if k.startswith("kStatus")}


def test_the_voxelizer_constants_match_its_kernels():
    """kernels/voxel.py's key width and block shifts are the voxel kernels' (api.h once said
    3..5 while both sides allowed 6: nothing compared them)."""
    from kernels import voxel

    def constant(file: str, name: str) -> int:
        found = re.findall(rf"\b{name}\s*=\s*(\d+)", (build.CSRC / file).read_text())
        assert len(found) == 1, (file, name, found)
        return int(found[0])

    assert constant("voxel_keys.h", "kAxisBits") == voxel.AXIS_BITS
    assert constant("voxel_order_cpu.cpp", "kSubShift") == voxel.MIN_BLOCK_SHIFT
    assert constant("voxel_order_cpu.cpp", "kMaxShift") == voxel.MAX_BLOCK_SHIFT
    assert (
        f"{voxel.MIN_BLOCK_SHIFT}..{voxel.MAX_BLOCK_SHIFT};" in (build.CSRC / "api.h").read_text()
    )


def test_key_layout_matches_the_kernels():
    coords = torch.tensor(
        [[0, 0, 0, 0], [1022, -131072, 131071, -5], [7, 3, -2, 131071]], dtype=torch.int32
    )
    table = CoordHashTable.build(coords)
    stored = table.slots[table.slots[:, 0] != hashtable.EMPTY]
    assert len(stored) == 3
    by_value = stored[torch.argsort(stored[:, 1] & 0xFFFFFFFF)]
    assert torch.equal(by_value[:, 0], hashtable.pack_key(coords))
    assert table.slots.element_size() * table.slots.shape[1] == 16  # sizeof(lidarseg::Slot)


def test_every_declared_function_is_bound():
    text = arguments.API_H.read_text() + arguments.API_CUDA_H.read_text()
    declared = re.findall(r"LS_API\s+int\s+(ls_\w+)", text)
    sigs = arguments.signatures()
    assert sorted(declared) == sorted(sigs)
    lib = backend.library("cpu")
    for name, params in sigs.items():
        if name.endswith("_cpu"):
            assert len(getattr(lib, name).argtypes) == len(params), name


def test_wrong_argument_count_raises_before_c():
    coords = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(TypeError, match="ls_hash_build_cpu takes 5 arguments"):
        backend.call("hash_build", "cpu", coords, 2)
    with pytest.raises(TypeError):  # the raw ctypes function knows its arguments too
        backend.library("cpu").ls_hash_build_cpu(ctypes.c_void_p(coords.data_ptr()), 2)


def test_tensors_are_checked_before_their_pointer_goes_to_c():
    src = torch.zeros(4, 3)
    idx = torch.zeros(2, dtype=torch.int32)
    dst = torch.empty(2, 3)
    with pytest.raises(TypeError, match="src must be torch.float32, got torch.float64"):
        backend.call("gather_rows_f32", "cpu", src.double(), 4, 3, idx, 2, dst)
    with pytest.raises(TypeError, match="idx must be torch.int32"):
        backend.call("gather_rows_f32", "cpu", src, 4, 3, idx.long(), 2, dst)
    with pytest.raises(ValueError, match="dst is on meta, the op runs on cpu"):
        backend.call("gather_rows_f32", "cpu", src, 4, 3, idx, 2, dst.to("meta"))
    with pytest.raises(ValueError, match="src must be contiguous"):
        backend.call("gather_rows_f32", "cpu", torch.zeros(3, 4).t(), 4, 3, idx, 2, dst)
    with pytest.raises(ValueError, match="does not fit int32_t"):
        backend.call(
            "kmap_lookup",
            "cpu",
            torch.full((16, 2), -1),
            16,
            idx[:0],
            0,
            2**31,
            idx[:0],
            0,
            idx,
            torch.zeros(0, dtype=torch.int64),
        )
    with pytest.raises(TypeError, match="takes a number, got a tensor"):
        backend.call("gather_rows_f32", "cpu", src, torch.tensor(4), 3, idx, 2, dst)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_calls_take_the_same_checks():
    # backend._call_cuda's fast path lets only a contiguous tensor of the declared dtype on
    # the op's device through; anything else gets _convert's message, as on the CPU.
    src = torch.zeros(4, 3, device="cuda")
    idx = torch.zeros(2, dtype=torch.int32, device="cuda")
    dst = torch.empty(2, 3, device="cuda")
    with pytest.raises(TypeError, match="ls_gather_rows_f32_cuda takes 6 arguments"):
        backend.call("gather_rows_f32", "cuda", src, 4, 3, idx, 2)
    with pytest.raises(TypeError, match="src must be torch.float32, got torch.float64"):
        backend.call("gather_rows_f32", "cuda", src.double(), 4, 3, idx, 2, dst)
    with pytest.raises(ValueError, match="dst is on cpu, the op runs on cuda:0"):
        backend.call("gather_rows_f32", "cuda", src, 4, 3, idx, 2, dst.cpu())
    with pytest.raises(ValueError, match="src must be contiguous"):
        backend.call("gather_rows_f32", "cuda", src.t().contiguous().t(), 4, 3, idx, 2, dst)
    with pytest.raises(ValueError, match="does not fit int64_t"):
        backend.call("gather_rows_f32", "cuda", src, 2**63, 3, idx, 2, dst)
    src.copy_(torch.arange(12.0).view(4, 3))
    backend.call("gather_rows_f32", torch.device("cuda"), src, 4, 3, idx + 2, 2, dst)
    assert torch.equal(dst.cpu(), torch.tensor([[6.0, 7, 8], [6, 7, 8]]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_request_without_cuda_is_a_clear_error():
    coords = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(backend.KernelError, match="torch sees no CUDA device"):
        backend.call(
            "hash_build",
            "cuda",
            coords,
            2,
            torch.full((16, 2), -1),
            16,
            hashtable.new_error_buffer("cpu"),
        )


@pytest.mark.skipif(toolchain.nvcc_path() is None, reason="nvcc not found")
def test_cuda_library_exports_its_last_error_text(tmp_path, monkeypatch):
    # Without a GPU every CUDA call fails; the library must say which call and why.
    monkeypatch.setenv("LIDARSEG_BUILD_DIR", str(tmp_path))
    lib = backend.bind(build.build_cuda(("87", "90")), "cuda")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU (tests/kernels/test_cuda_parity.py covers it)")
    assert lib.ls_sync_cuda(None) == backend.Status.CUDA_ERROR
    buf = ctypes.create_string_buffer(512)
    assert lib.ls_last_error_cuda(buf, len(buf)) != 0
    assert buf.value.startswith(b"cudaStreamSynchronize: ")
    with pytest.raises(TypeError):
        lib.ls_sync_cuda()


def rows(*coords):
    return torch.tensor(coords, dtype=torch.int32).reshape(-1, 4)


MIXED = rows(
    (0, 5, 5, 5),
    (0, 1, 1, 1),
    (0, 1, 1, 1),
    (1023, 0, 0, 0),
    (0, 2, 2, 2),
    (0, 900000, 0, 0),
    (0, 2, 2, 2),
)


def every_map_path(coords: torch.Tensor):
    """Everything that validates coordinates: each CPU path, or the CUDA ones."""
    yield lambda: CoordHashTable.build(coords)
    yield lambda: submanifold_map(coords, None, 3)  # CPU: sorted or block path
    yield lambda: submanifold_map(coords, None, 5)  # hash path
    yield lambda: downsample(coords, None, 2, 2)  # CPU: sorted path or insert-min
    yield lambda: downsample(coords, None, 3, 2, 1)  # insert-min, then the hash table


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_errors_name_the_lowest_status_and_its_smallest_row(device):
    # Rows 3 and 5 are out of range, rows 1/2 and 4/6 are duplicates: out of range wins, row 3.
    coords = MIXED.to(device)
    for run in every_map_path(coords):
        with pytest.raises(CoordinateRangeError, match=r"\[1023, 0, 0, 0\] at row 3 "):
            run()
    in_range = coords[[0, 1, 2, 4, 6]]  # duplicates only: the first twinned row is 1
    for run in every_map_path(in_range):
        with pytest.raises(DuplicateCoordinateError, match=r"\[0, 1, 1, 1\].* rows \[1, 2\]"):
            run()
    # Rows in ascending order take the CPU's merge-join paths: the same errors.
    ascending = rows(
        (0, 1, 1, 1), (0, 1, 1, 1), (0, 2, 2, 2), (0, 2, 2, 2), (0, 900000, 0, 0), (1023, 0, 0, 0)
    ).to(device)
    for run in every_map_path(ascending):
        with pytest.raises(CoordinateRangeError, match=r"\[0, 900000, 0, 0\] at row 4 "):
            run()
    for run in every_map_path(ascending[:4]):
        with pytest.raises(DuplicateCoordinateError, match=r"rows \[0, 1\]"):
            run()


@pytest.mark.parametrize("device", DEVICES)
def test_errors_in_large_inputs_do_not_depend_on_the_schedule(device):
    # Big enough for every thread (or CUDA block) to see rows; errors placed far apart.
    gen = torch.Generator().manual_seed(0)
    coords = torch.unique(
        torch.randint(-60, 60, (40000, 4), generator=gen, dtype=torch.int32), dim=0
    )
    coords[:, 0] = 0
    coords = torch.unique(coords, dim=0)
    coords = coords[torch.randperm(len(coords), generator=gen)]
    coords[30000] = coords[9000]  # a duplicate pair, rows 9000 / 30000
    coords[12000] = coords[20000]  # another, rows 12000 / 20000
    coords[25000, 1] = 200000  # out of range
    coords[26000, 0] = -1  # out of range
    coords = coords.to(device)
    for run in every_map_path(coords):
        with pytest.raises(CoordinateRangeError, match="at row 25000 "):
            run()
    coords[25000, 1] = 0
    coords[26000, 0] = 0
    coords[25000] = coords[24999] + torch.tensor([0, 0, 0, 1000], device=device)
    coords[26000] = coords[25000] + torch.tensor([0, 0, 1000, 0], device=device)
    for run in list(every_map_path(coords))[:3]:
        with pytest.raises(DuplicateCoordinateError, match=r"rows \[9000, 30000\]"):
            run()
