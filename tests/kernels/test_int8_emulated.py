"""The 256-bit AVX_VNNI int8 kernel on CPUs without AVX_VNNI: a build of the CPU kernels with its
one AVX_VNNI instruction emulated exactly (emulated_avx_vnni.h, force-included) runs it against
the AVX2 kernel of the same build, bit for bit, on single convs and on the whole network. Where
the CPU has AVX_VNNI, test_int8.py and tests/app/test_precision.py compare the real instruction.
The comparison runs in a child process that binds the emulated library (python -m
tests.kernels.test_int8_emulated LIBRARY)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import build, precision

EMULATION = Path(__file__).with_name("emulated_avx_vnni.h")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    "AVX2" not in precision.cpu_features() or shutil.which("g++") is None,
    reason="needs an AVX2 CPU and g++",
)
def test_the_avx_vnni_kernel_gives_the_avx2_kernels_bits(tmp_path):
    lib = tmp_path / "liblidarseg_cpu_emulated.so"
    flags = [*build.CXX_FLAGS, "-march=x86-64-v3", "-mtune=generic", "-include", str(EMULATION)]
    build.compile_shared("g++", flags, build.CPU_SOURCES, lib)
    probe = subprocess.run(
        [sys.executable, "-m", "tests.kernels.test_int8_emulated", str(lib)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert "convs equal: 21" in probe.stdout, probe.stdout


def compare(lib_path: str) -> None:
    """In the child: bind lib_path for every kernel call, then compare the two kernels."""
    import numpy as np
    import torch

    from kernels import backend

    lib = backend.bind(lib_path, "cpu")
    backend.library = lambda device_type: lib
    from kernels.engine import EngineConfig, sparse_conv
    from tests.kernels.kernel_helpers import INT8, case

    assert precision.int8_kernel("avx_vnni") == "avx_vnni"
    config = EngineConfig(precision="int8", grouping=INT8)
    equal = 0
    shapes = [(12, 16), (16, 32), (64, 64), (20, 80), (96, 48), (96, 24), (192, 128)]
    for kind in ("subm", "down", "up"):
        for cin, cout in shapes:
            kmap, x, w, bias, res = case(kind, cin, cout, seed=cin + cout)
            outs = []
            with torch.no_grad():
                for name in ("avx_vnni", "avx2"):
                    with precision.int8_kernel_set(name):
                        outs.append(sparse_conv(x, w, kmap, config, bias, True, res))
            assert torch.equal(outs[0], outs[1]), (kind, cin, cout)
            equal += 1
    print(f"convs equal: {equal}")
    from tests.app.frame_helpers import read, real_frames

    if "semantickitti/seq00_000000.bin" not in real_frames():
        print("no real frame: the network was not compared")
        return
    from app.inference.builder import load_model, pipeline_for

    model, meta = load_model("default")
    pipe = pipeline_for(model, meta, "cpu", precision="int8")
    points, sensor = read("semantickitti/seq00_000000.bin")
    got = {}
    for name in ("avx_vnni", "avx2"):
        with precision.int8_kernel_set(name):
            logits = pipe.segment(points, sensor, keep_logits=True).voxel_logits
            got[name] = (logits, pipe.segment(points, sensor).labels)
    assert torch.equal(got["avx_vnni"][0], got["avx2"][0])
    assert np.array_equal(got["avx_vnni"][1], got["avx2"][1])
    print("network logits and labels equal on seq00_000000")


if __name__ == "__main__":
    compare(sys.argv[1])
