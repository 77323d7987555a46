"""The GPU check's whole-suite step leaves out test files whose packages are missing, and only
those (deploy/gpu_check/skip_missing.py); prepare.sh's strip_fatbin.py keeps only the GPU's
machine code."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


def test_skip_missing_leaves_out_only_files_with_missing_packages(tmp_path):
    (tmp_path / "test_needs_missing.py").write_text(
        "import no_such_package_for_lidarseg\n\ndef test_never():\n    assert False\n"
    )
    (tmp_path / "test_plain.py").write_text("def test_runs():\n    assert True\n")
    (tmp_path / "test_our_bug.py").write_text("import kernels.no_such_module\n")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(REPO_ROOT / "deploy" / "gpu_check"), str(REPO_ROOT), str(tmp_path)]
        ),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "skip_missing",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert "test_needs_missing.py: needs no_such_package_for_lidarseg" in out
    assert "1 passed" in out
    # A missing module of our own is a real error, not excused.
    assert "test_our_bug.py" in out and "1 error" in out and proc.returncode != 0


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_strip_fatbin_keeps_only_the_gpus_machine_code(tmp_path, monkeypatch):
    """A real fat binary from nvcc (sm_87 and sm_90 machine code, PTX) embedded in other bytes,
    with a stray magic number before it: the sm_90 ELF stays byte for byte, the rest of its block
    turns to zeros, and the file keeps its size and every entry header."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "deploy" / "gpu_check"))  # for this test only
    import strip_fatbin

    (tmp_path / "k.cu").write_text("__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    gencode = [
        "-gencode=arch=compute_87,code=sm_87",
        "-gencode=arch=compute_90,code=[sm_90,compute_90]",
    ]
    subprocess.run(
        [NVCC, "-fatbin", *gencode, "-o", str(tmp_path / "k.fatbin"), str(tmp_path / "k.cu")],
        check=True,
        timeout=300,
    )
    fatbin = (tmp_path / "k.fatbin").read_bytes()
    stray = strip_fatbin.MAGIC + bytes(12)  # a magic number that starts no valid block
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF" + bytes(100) + stray + fatbin + b"tail" * 10)

    def listed(data):
        start = data.find(strip_fatbin.MAGIC, 104 + len(stray))
        size = strip_fatbin.BLOCK_HEADER.unpack_from(data, start)[3]
        return list(strip_fatbin.entries(data, start + 16, start + 16 + size))

    before = bytearray(lib.read_bytes())
    kinds = {(kind, arch) for kind, arch, _, _ in listed(before)}
    assert {(2, 87), (2, 90), (1, 90)} <= kinds, kinds
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "deploy/gpu_check/strip_fatbin.py"), "--arch", "90", lib],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    after = bytearray(lib.read_bytes())
    assert len(after) == len(before) and after.endswith(b"tail" * 10)
    for (kind, arch, offset, size), again in zip(listed(before), listed(after)):
        assert (kind, arch, offset, size) == again  # headers untouched
        payload = after[offset : offset + size]
        if kind == 2 and arch == 90:
            assert payload == before[offset : offset + size]
        else:
            assert payload == bytes(size), (kind, arch)
    # a library with no sm_80 code is left as it was, and says so
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "deploy/gpu_check/strip_fatbin.py"), "--arch", "80", lib],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "no fat binary block has sm_80" in r.stdout
    assert lib.read_bytes() == after
