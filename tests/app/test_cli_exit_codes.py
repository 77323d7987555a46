"""Exit statuses of `python -m app` in process: a precision this CPU cannot run is a setting
(2, as argparse's), and a load run of the client fails (1) unless every answer was a 200."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from app import cli
from app import client as client_mod
from kernels.precision import PrecisionError


@pytest.fixture()
def handlers():
    """cli.main gives SIGTERM and SIGINT their default handling back: restored after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_precision_the_cpu_cannot_run_exits_2(monkeypatch, capsys, handlers):
    def refuse(args):
        raise PrecisionError("bf16 needs AVX512_BF16 or AMX_BF16, which this CPU lacks")

    monkeypatch.setattr(cli, "cmd_segment", refuse)
    assert cli.main(["segment", "frame.bin"]) == 2
    assert capsys.readouterr().err.startswith("lidarseg: bf16 needs")

    def missing(args):
        raise FileNotFoundError("frame.bin")

    monkeypatch.setattr(cli, "cmd_segment", missing)
    assert cli.main(["segment", "frame.bin"]) == 1  # the user's file: 1


def load_args(tmp_path) -> SimpleNamespace:
    frame = tmp_path / "f.bin"
    frame.write_bytes(b"\0" * 16)
    return SimpleNamespace(frame=str(frame), format="kitti", api_key=None, sensor=None,
                           deadline_ms=None, stream_id=None, url="http://127.0.0.1:9",
                           repeat=4, concurrency=2, binary=False)  # fmt: skip


@pytest.mark.parametrize(
    "statuses,code", [({"200": 4}, 0), ({"200": 3, "503": 1}, 1), ({"504": 4}, 1)]
)
def test_a_load_run_fails_unless_every_answer_was_a_200(monkeypatch, tmp_path, statuses, code):
    def run(client, body, fmt, repeat, concurrency, binary=True):
        assert (repeat, concurrency, binary) == (4, 2, True)
        times = {"p50": 1.0, "p95": 2.0, "p99": 3.0, "throughput_rps": 1.0, "wall_s": 4.0}
        return {"requests": repeat, "concurrency": concurrency, "statuses": statuses, **times}

    monkeypatch.setattr(client_mod, "load_run", run)
    assert client_mod.main(load_args(tmp_path)) == code
