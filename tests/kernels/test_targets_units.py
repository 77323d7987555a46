"""kernels/targets.py's choice of a CUDA library at the edges of a compute capability: machine
code for exactly the device's version, for an older minor of its major only, PTX for exactly the
device's version, and machine code preferred over PTX when both cover the device."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels import targets


@pytest.mark.parametrize(
    "archs,ptx,cap,expected",
    [
        (["90"], None, (9, 0), True),  # machine code for exactly this device
        (["89"], None, (8, 9), True),
        (["80"], None, (9, 0), False),  # another major: never, even an older one
        (["86"], None, (9, 0), False),
        (["75"], None, (8, 6), False),
        ([], "90", (9, 0), True),  # PTX for exactly this device
        ([], "86", (8, 6), True),
        ([], "87", (8, 6), False),
    ],
)
def test_covers_at_the_exact_capability(archs, ptx, cap, expected):
    assert targets.covers(archs, ptx, cap) is expected


def test_machine_code_is_preferred_over_ptx():
    def lib(name, archs, ptx):
        manifest = {"kind": "cuda", "machine": "x86_64", "archs": archs, "ptx": ptx}
        return targets.Built(Path(name), manifest)

    jit, native = lib("jit", ["80"], "80"), lib("native", ["90"], None)
    assert targets.best_cuda([jit, native], "x86_64", (9, 0)) is native
    assert targets.best_cuda([jit, native], "x86_64", (8, 0)) is jit
    assert targets.best_cuda([jit, native], "aarch64", (9, 0)) is None


def test_a_cpu_library_of_another_machine_is_never_chosen():
    arm = targets.Built(Path("arm"), {"kind": "cpu", "machine": "aarch64", "requires": []})
    assert targets.best_cpu([arm], "x86_64", {"avx2"}) is None
    assert targets.best_cpu([arm], "aarch64", set()) is arm
