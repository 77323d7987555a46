"""Runs the CPU kernel library on a real LiDAR frame with numpy and ctypes only (no torch: the
aarch64 torch wheel crashes under qemu-user here), for deploy/aarch64_check.sh.

    python3 harness.py LIB FRAME.bin reference OUT.npz   # x86-64: write the reference
    python3 harness.py LIB FRAME.bin compare REF.npz     # aarch64 (qemu): compare with it

Both sides voxelize the frame the same way (numpy, 0.1 m), then build the submanifold kernel-3
map three ways (hash table + look-up, 4x4x4 blocks, merge join on sorted rows), the stride-2
downsampling map, and run the fused convolution (27 offsets, bias, ReLU) with features and
weights taken from the reference file. Maps must be equal, features equal within float
tolerance (the vector width differs: AVX2 8 lanes, NEON 4).
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

VOXEL = 0.1
CIN, COUT = 16, 32
I64, P = ctypes.c_int64, ctypes.c_void_p


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return ctypes.c_void_p(a.ctypes.data)


def check(status: int, err: np.ndarray | None = None, what: str = "") -> None:
    if status != 0:
        raise SystemExit(f"{what}: status {status}, err {None if err is None else hex(err[0])}")


def voxelize(frame: str) -> np.ndarray:
    pts = np.fromfile(frame, dtype=np.float32).reshape(-1, 4)
    xyz = np.floor(pts[:, :3] / VOXEL).astype(np.int32)
    coords = np.unique(xyz, axis=0)  # lexicographic (x, y, z): ascending with batch 0 in front
    return np.ascontiguousarray(
        np.concatenate([np.zeros((len(coords), 1), np.int32), coords], axis=1)
    )


def offsets() -> np.ndarray:
    r = np.arange(3) - 1
    return np.ascontiguousarray(
        np.stack(np.meshgrid(r, r, r, indexing="ij"), -1).reshape(27, 3).astype(np.int32)
    )


def hash_map(lib, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(coords)
    capacity = max(16, 1 << int(np.ceil(np.log2(2 * n))))
    table = np.full((capacity, 2), -1, np.int64)
    err = np.full(1, -1, np.int64)
    check(
        lib.ls_hash_build_cpu(ptr(coords), I64(n), ptr(table), I64(capacity), ptr(err)),
        err,
        "hash_build",
    )
    nbr = np.empty((27, n), np.int32)
    counts = np.empty(27, np.int64)
    check(
        lib.ls_kmap_lookup_cpu(
            ptr(table),
            I64(capacity),
            ptr(coords),
            I64(n),
            ctypes.c_int32(1),
            ptr(offsets()),
            I64(27),
            ptr(nbr),
            ptr(counts),
        ),
        None,
        "lookup",
    )
    return nbr, counts


def block_map(lib, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(coords)
    nbr, counts, err = np.empty((27, n), np.int32), np.empty(27, np.int64), np.full(1, -1, np.int64)
    check(
        lib.ls_submanifold_nbr_cpu(
            ptr(coords), I64(n), ptr(offsets()), I64(27), ptr(nbr), ptr(counts), ptr(err)
        ),
        err,
        "submanifold_nbr",
    )
    return nbr, counts


def sorted_half_map(lib, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(coords)
    nbr, counts = np.empty((13, n), np.int32), np.empty(13, np.int64)
    applied, err = np.zeros(1, np.int64), np.full(1, -1, np.int64)
    check(
        lib.ls_sorted_submanifold_nbr_cpu(
            ptr(coords), I64(n), ptr(nbr), ptr(counts), ptr(applied), ptr(err)
        ),
        err,
        "sorted_nbr",
    )
    assert applied[0] == 1, "the sorted merge-join path did not apply"
    return nbr, counts


def downsample(lib, coords: np.ndarray) -> dict[str, np.ndarray]:
    n = len(coords)
    out = {
        "ds_coords": np.empty((n, 4), np.int32),
        "ds_in": np.empty(n, np.int32),
        "ds_out": np.empty(n, np.int32),
        "ds_counts": np.empty(8, np.int64),
    }
    num_out, applied, err = np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, -1, np.int64)
    check(
        lib.ls_sorted_downsample_cpu(
            ptr(coords),
            I64(n),
            ctypes.c_int32(2),
            ptr(out["ds_coords"]),
            ptr(out["ds_in"]),
            ptr(out["ds_out"]),
            ptr(out["ds_counts"]),
            ptr(num_out),
            ptr(applied),
            ptr(err),
        ),
        err,
        "sorted_downsample",
    )
    assert applied[0] == 1
    out["ds_coords"] = out["ds_coords"][: num_out[0]]
    return out


def fused_conv(
    lib, nbr: np.ndarray, counts: np.ndarray, x: np.ndarray, w: np.ndarray, bias: np.ndarray
) -> np.ndarray:
    n = nbr.shape[1]
    starts = np.ascontiguousarray(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    in_idx, out_idx = np.empty(starts[-1], np.int32), np.empty(starts[-1], np.int32)
    check(
        lib.ls_kmap_compact_cpu(ptr(nbr), I64(27), I64(n), ptr(starts), ptr(in_idx), ptr(out_idx)),
        None,
        "compact",
    )
    order = np.array([k for k in range(27) if k != 13], np.int32)
    out = np.empty((n, COUT), np.float32)
    check(
        lib.ls_fused_conv_f32_cpu(
            ptr(x),
            I64(CIN),
            ptr(w),
            I64(COUT),
            ptr(in_idx),
            ptr(out_idx),
            ptr(starts),
            ptr(order),
            I64(len(order)),
            ctypes.c_int32(13),
            ptr(bias),
            P(0),
            ctypes.c_int32(1),
            I64(n),
            ptr(out),
        ),
        None,
        "fused_conv",
    )
    return out


def run(lib_path: str, frame: str, inputs: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    lib = ctypes.CDLL(lib_path)
    coords = voxelize(frame)
    n = len(coords)
    if inputs is None:  # the reference side draws the features and weights
        rng = np.random.default_rng(0)
        inputs = {
            "x": rng.standard_normal((n, CIN), dtype=np.float32),
            "w": rng.standard_normal((27, CIN, COUT), dtype=np.float32) / 8,
            "bias": rng.standard_normal(COUT, dtype=np.float32),
        }
    nbr, counts = hash_map(lib, coords)
    block_nbr, block_counts = block_map(lib, coords)
    half_nbr, half_counts = sorted_half_map(lib, coords)
    result = {
        "coords": coords,
        "nbr": nbr,
        "counts": counts,
        "block_nbr": block_nbr,
        "block_counts": block_counts,
        "half_nbr": half_nbr,
        "half_counts": half_counts,
        **downsample(lib, coords),
        **inputs,
    }
    result["out"] = fused_conv(
        lib, nbr, counts, *(np.ascontiguousarray(inputs[k]) for k in ("x", "w", "bias"))
    )
    print(
        f"{n} voxels, {int(counts.sum())} map entries, {len(result['ds_coords'])} coarse voxels,"
        f" {lib.ls_fused_lanes_cpu()} lanes"
    )
    return result


def main() -> int:
    lib_path, frame, mode, npz = sys.argv[1:5]
    if mode == "reference":
        np.savez_compressed(npz, **run(lib_path, frame, None))
        return 0
    ref = dict(np.load(npz))
    got = run(lib_path, frame, {k: ref[k] for k in ("x", "w", "bias")})
    failures = [k for k in ref if k != "out" and not np.array_equal(ref[k], got[k])]
    assert np.array_equal(got["nbr"][:13], got["half_nbr"]), "sorted path != hash path (here)"
    assert np.array_equal(got["nbr"], got["block_nbr"]), "block path != hash path (here)"
    scale = float(np.abs(ref["out"]).max())
    diff = float(np.abs(ref["out"] - got["out"]).max())
    print(
        f"maps: {'equal' if not failures else 'DIFFER: ' + ', '.join(failures)}; "
        f"fused conv max |diff| {diff:.3g} (max |out| {scale:.3g})"
    )
    return 0 if not failures and diff <= 1e-5 * scale else 1


if __name__ == "__main__":
    sys.exit(main())
