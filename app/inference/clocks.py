"""The pipeline's clocks (pipeline.py): the wall time of each stage of a run (StageClock) and,
with layer_timing, of each leaf layer of the network (layer_clock, through forward hooks), CUDA
synchronised before every reading so that GPU times are true.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch
from torch import nn


class StageClock:
    """Wall-clock per stage; synchronises CUDA before each reading."""

    def __init__(self, device: torch.device):
        self.device, self.ms = device, {}  # type: torch.device, dict[str, float]

    @contextlib.contextmanager
    def stage(self, name: str):
        self._sync()
        start = time.perf_counter()
        yield
        self._sync()
        self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - start) * 1e3

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


LEAF_TYPES = ("SubMConv3d", "SparseConv3d", "SparseInverseConv3d", "BatchNorm", "ReLU", "Linear")


@contextlib.contextmanager
def layer_clock(model: nn.Module, device: torch.device):
    """Times every leaf layer (forward hooks); yields the dict it fills (name -> ms)."""
    times: dict[str, float] = defaultdict(float)
    starts: dict[str, float] = {}
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    handles = []
    for name, module in model.named_modules():
        if type(module).__name__ in LEAF_TYPES:

            def pre(_m, _inp, name=name):
                sync()
                starts[name] = time.perf_counter()

            def post(_m, _inp, _out, name=name):
                sync()
                times[name] += (time.perf_counter() - starts[name]) * 1e3

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        yield times
    finally:
        for h in handles:
            h.remove()
