"""Every measurement of 10 Hz on a CPU (issue 16's five items), in one command, on this machine.

    python -m bench.sensor_rate [--out DIR]
                                [--steps precision voxelize service stream scaling kernels]
                                [--quick] [--print]

Runs the steps one after the other (never two at once: they share the cores), each a benchmark
that prints ratios measured side by side in its own run:
  precision  bench.precision: fp32, bf16 and int8 (`auto`'s choice) on the four real frames, and
             int8 on each narrower kernel the CPU has, bf16 and int8 with AMX tiles off where it
             has AMX (item 1: speed against fp32, labels, mIoU)
  voxelize   bench.voxelize: the voxelize stage against numpy's sort-unique (item 2)
  service    bench.service on kitti00, access log off: HTTP against the network stage, JSON
             against binary (item 3), the frame time over HTTP (item 5)
  stream     bench.stream: KITTI scans posted at 10 Hz whatever the answers are doing, against
             the same posted one at a time (item 5 as a sensor drives it)
  scaling    bench.scaling: cr 1.0 fp32 on 1 and 2 threads, layer by layer (item 4)
  kernels    the tests that hold every int8 and bf16 kernel the CPU runs to its oracle and the
             kernels to each other bit for bit (tests/kernels/test_int8.py, test_bf16.py,
             tests/app/test_precision.py)
DIR/<step>.txt keeps each step's output and DIR/<step>.json its figures; DIR/summary.txt the
CPU, the commit, every step's command, exit status, time and output (the tests' last lines), and
the verdicts: each item of issue 16 judged against its bar from the unrounded medians
(bench/verdicts.py; PASS, FAIL or n/a). What a note on the issue needs from a machine kind seen
rarely (an Intel Xeon with AMX, a CPU with AVX_VNNI only). The exit status says whether every
step ran, not whether the bars were met. --quick runs each benchmark twice only (a check that
the steps run, not a measurement).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import REPO_ROOT
from bench.verdicts import verdicts
from kernels import precision as precision_mod

STEPS = ("precision", "voxelize", "service", "stream", "scaling", "kernels")
FRAMES = ("kitti00", "nuscenes", "ouster128", "kitti-spvnas")
KERNEL_TESTS = (
    "tests/kernels/test_int8.py",
    "tests/kernels/test_bf16.py",
    "tests/app/test_precision.py",
)


def precisions(features: Sequence[str]) -> list[str]:
    """What bench.precision compares here: fp32, bf16, int8, int8 on each narrower kernel the
    CPU offers, and bf16 and int8 without AMX tiles where it has them."""
    names = ["fp32", "bf16", "int8"]
    names += [f"int8@{k}" for k in ("avx_vnni", "avx2") if k.upper() in features]
    if any(f.startswith("AMX") for f in features):
        names += ["int8-avx512", "bf16-avx512"]
    return names


def commands(
    quick: bool, features: Sequence[str], out: Path | None = None
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each step's argv (after the interpreter) and the environment it adds; with `out`, the
    benchmarks write their figures to out/<step>.json for the verdicts."""
    runs = ["--runs", "2"] if quick else []
    kinds = precisions(features)

    def json_to(step: str) -> list[str]:
        return [] if out is None else ["--json", str(out / f"{step}.json")]

    return {
        "precision": (
            ["-m", "bench.precision", "--frames", *FRAMES, "--precisions", *kinds]
            + (runs or ["--runs", "9"])
            + json_to("precision"),
            {},
        ),
        "voxelize": (
            ["-m", "bench.voxelize"] + (runs or ["--runs", "15"]) + json_to("voxelize"),
            {},
        ),
        "service": (  # the CPU's figure even where a GPU is present
            "-m bench.service --frames kitti00 --device cpu".split()
            + (runs or ["--runs", "11"])
            + json_to("service"),
            {"LIDARSEG_ACCESS_LOG": "off"},
        ),
        "stream": (
            ["-m", "bench.stream", "--device", "cpu"]
            + (["--seconds", "2", "--sequential", "2"] if quick else [])
            + json_to("stream"),
            {},
        ),
        "scaling": (
            "-m bench.scaling --weights random --cr 1.0 --precision fp32".split()
            + (runs or ["--runs", "5"])
            + json_to("scaling"),
            {},
        ),
        "kernels": (["-m", "pytest", "-q", *KERNEL_TESTS], {}),
    }


def commit() -> str:
    """The checkout's last commit, or why it is unknown (no git: a bare machine, a tarball)."""
    try:
        done = subprocess.run(
            ["git", "log", "-1", "--format=%h %s"], cwd=REPO_ROOT, capture_output=True, text=True
        )
    except FileNotFoundError:
        return "unknown (no git on this machine)"
    return done.stdout.strip() or f"unknown ({done.stderr.strip() or 'not a git checkout'})"


def header(features: Sequence[str]) -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in cpu_info() if line.startswith("model name")),
        platform.processor() or "unknown",
    )
    return (
        f"# bench.sensor_rate {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n"
        f"# CPU {model}, {os.cpu_count()} logical CPUs; features {' '.join(features)}\n"
        f"# commit {commit()}\n"
    )


def cpu_info() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def command_line(argv: list[str], env: dict[str, str]) -> str:
    return " ".join([*(f"{k}={v}" for k, v in env.items()), "python", *argv])


def run_step(name: str, argv: list[str], env: dict[str, str], out: Path) -> tuple[str, int]:
    """Runs one step, its output into out/<name>.txt; (its summary block, its exit status)."""
    shown = command_line(argv, env)
    print(f"== {name}: {shown}", flush=True)
    t = time.monotonic()
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seconds = time.monotonic() - t
    (out / f"{name}.txt").write_text(proc.stdout)
    lines = proc.stdout.rstrip().splitlines()
    shown_lines = lines[-3:] if name == "kernels" else lines
    block = f"## {name}: {shown}\n# exit {proc.returncode}, {seconds:.0f} s\n"
    return block + "\n".join(shown_lines) + "\n", proc.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="sensor_rate")
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--print", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    features = precision_mod.cpu_features()
    out = Path(args.out)
    steps = commands(args.quick, features, out)
    if args.print:
        for name in args.steps:
            print(f"{name}: {command_line(*steps[name])}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    summary = header(features)
    failed = 0
    for name in args.steps:
        (out / f"{name}.json").unlink(missing_ok=True)  # no verdict from an earlier run's figures
        block, status = run_step(name, *steps[name], out)
        failed += status != 0
        summary += "\n" + block
        (out / "summary.txt").write_text(summary)
    summary += "\n" + verdicts(out, features)
    (out / "summary.txt").write_text(summary)
    print(summary)
    print(f"(outputs in {out}/)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
