"""Grouped gather-matmul-scatter: out[q] = sum over map entries (p, q, k) of feats[p] @ W[k].

Weight-stationary: the identity offset is one mm over all rows; every other launch of the plan
(kernels/grouping.py) gathers its input rows into a buffer, runs one mm or bmm, and the partial
sums are scatter-added into the output. The dataflows by device and dtype, and the backward
pass: kernels/autograd_conv.py; CPU inference in bf16 and int8: kernels/bf16.py, kernels/int8.py.
Scratch buffers stay under EngineConfig.memory_cap (kernels/chunking.py): chunks keep the plan's
row order, so chunking changes no result except where a launch too big for the cap is split.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import cast

import torch

from . import backend, deferred
from .concat import MadeOnUse, RowConcat, concat_rows
from .chunking import Workspace, default_cap, rows_under_cap
from .autograd_conv import _SparseConvFunction
from .bf16 import conv_bf16
from .grouped import Run
from .grouping import ExecutionPlan, build_plan
from .int8 import NO_USE, OutputUse, conv_int8, int8_fits, memoized
from .kmap import KernelMap
from .precision import fallback
from .rows import HeadColumns
from .tuning import GroupingTable


@dataclass(frozen=True)
class EngineConfig:
    """How sparse convolutions execute. Load the tuned grouping once at start-up and share it."""

    deterministic: bool = False
    # CPU inference: fp32, bf16 or int8 (kernels/precision.py resolves auto)
    precision: str = "fp32"
    grouping: GroupingTable = field(default_factory=GroupingTable.load_default)
    workspace: Workspace = field(default_factory=Workspace, compare=False, repr=False)
    memory_cap: int | None = None  # scratch bytes per conv; None: chunking.default_cap(device)

    def plan(
        self, kmap: KernelMap, cin: int, cout: int, device: torch.device
    ) -> tuple[ExecutionPlan, bool]:
        """The plan of one conv shape (its tuned grouping), and whether the int8 kernel runs it
        (int8 precision and the shape's entry says "int8"; else the fallback precision does)."""
        epsilon, threshold, dataflow = self.grouping.choose(
            device.type, kmap.kernel_volume, cin, cout, self.precision
        )
        plan = build_plan(kmap, epsilon, threshold, fused=dataflow in ("fused", "int8"))
        return plan, self.precision == "int8" and dataflow == "int8"

    def scratch_cap(self, device: torch.device) -> int:
        """Scratch bytes a conv may use on `device`: memory_cap, else chunking.default_cap."""
        if self.memory_cap is not None:
            return self.memory_cap
        return default_cap(device, self.deterministic)

    def max_rows(self, cin: int, cout: int, dtype: torch.dtype, device: torch.device) -> int:
        """Buffer rows per chunk under the memory cap."""
        return rows_under_cap(self.scratch_cap(device), cin, cout, dtype)


def _check_args(feats, weight, kmap: KernelMap, bias, residual) -> None:
    if feats.dim() != 2 or feats.shape[0] != kmap.num_in:
        raise ValueError(f"feats must be [{kmap.num_in}, Cin], got {tuple(feats.shape)}")
    if (
        weight.dim() != 3
        or weight.shape[0] != kmap.kernel_volume
        or weight.shape[1] != feats.shape[1]
    ):
        raise ValueError(
            f"weight must be [{kmap.kernel_volume}, {feats.shape[1]}, Cout], "
            f"got {tuple(weight.shape)}"
        )
    if weight.dtype != feats.dtype:
        raise ValueError(f"weight dtype {weight.dtype} != feats dtype {feats.dtype}")
    if feats.dtype not in backend.DTYPE_SUFFIX or (
        feats.dtype == torch.float16 and feats.device.type != "cuda"
    ):
        raise ValueError(f"unsupported dtype {feats.dtype} on {feats.device.type}")
    if bias is not None and (bias.shape != (weight.shape[2],) or bias.dtype != weight.dtype):
        raise ValueError(
            f"bias must be [{weight.shape[2]}] {weight.dtype}, got {tuple(bias.shape)} {bias.dtype}"
        )
    if residual is not None and (
        residual.shape != (kmap.num_out, weight.shape[2]) or residual.dtype != weight.dtype
    ):
        raise ValueError(
            f"residual must be [{kmap.num_out}, {weight.shape[2]}] {weight.dtype}, "
            f"got {tuple(residual.shape)} {residual.dtype}"
        )
    device = feats.device
    others = (weight, kmap.in_idx, bias, residual)
    if any(t is not None and t.device != device for t in others):
        named = zip(("feats", "weight", "kernel map", "bias", "residual"), (feats, *others))
        raise ValueError(
            "sparse_conv arguments on different devices: "
            + ", ".join(f"{name} on {t.device}" for name, t in named if t is not None)
        )


def _stand_in_int8(
    feats, weight, plan, int8: bool, config: EngineConfig, bias, relu, residual, use
):
    """The int8 conv of a stand-in (kernels/concat.py: a RowConcat, an UnkeptOutput) where the
    plan gives the shape to int8 and no gradient is wanted, else None."""
    if config.precision != "int8" or not int8 or torch.is_grad_enabled():
        return None
    return conv_int8(feats, weight, plan, config.workspace, bias, relu, residual, use)


def _reduced_precision(
    src, weight, plan, int8: bool, config: EngineConfig, bias, relu, residual, use
):
    """The CPU inference conv in int8 or bf16 where config.precision asks for it and the conv
    takes it (kernels/int8.py, kernels/bf16.py; an int8 conv whose shape the tuner gave to the
    fallback precision, or that the int8 kernel does not take, runs as that precision does),
    else None: fp32."""
    precision = config.precision
    if precision == "int8":
        if int8:
            out = conv_int8(src, weight, plan, config.workspace, bias, relu, residual, use)
            if out is not None:
                return out
        precision = fallback(precision)
    if precision != "bf16":
        return None
    return conv_bf16(
        src, weight, plan, config.workspace, bias, relu, residual, config.scratch_cap(src.device)
    )


def sparse_conv(
    feats: torch.Tensor,
    weight: torch.Tensor,
    kmap: KernelMap,
    config: EngineConfig,
    bias: torch.Tensor | None = None,
    relu: bool = False,
    residual: torch.Tensor | None = None,
    only_next_reads: bool = False,
    then_concat: torch.Tensor | None = None,
    shortcut: tuple | None = None,
    head: HeadColumns | None = None,
) -> torch.Tensor:
    """feats [num_in, Cin], weight [K^3, Cin, Cout] -> [num_out, Cout] (autograd-aware), plus
    bias [Cout] and residual [num_out, Cout] when given, then ReLU when asked (all fused into
    the CPU kernel's epilogue in inference). feats may be a stand-in (kernels/concat.py: a
    RowConcat, whose two parts the int8 conv quantizes side by side; an UnkeptOutput, whose
    quantization it finds); any other conv makes the tensor. only_next_reads: the caller reads
    the output only as the input of the next conv (a residual block's first conv, a decoder's
    upsampling); in int8 the result may then be an UnkeptOutput, made (by this call again) only
    if something needs it. then_concat [num_out, C]: the result is the output concatenated with
    these rows, as concat_rows gives it (in int8, quantized side by side in the kernel).
    shortcut (feats, weight [1, C, Cout], bias, kmap of a 1x1 conv on the output's rows): the
    residual is that conv's output; an int8 conv adds it in its own kernel where both inputs'
    quantizations are on record (a residual block's shortcut, never written out), else it is
    computed first. head (kernels/rows.py HeadColumns): the caller wants the head's class of
    each output row; an int8 conv with a ReLU may then return a ClassifiedOutput (its
    `classes`, the rows made by this call again only if something needs them)."""
    # the rows again, for a stand-in made on use: this call with the arguments as given (bound
    # now: bias and residual are reassigned below where the shortcut is taken in)
    remake = (
        functools.partial(
            sparse_conv, feats, weight, kmap, config, bias, relu, residual, shortcut=shortcut
        )
        if only_next_reads or head is not None
        else None
    )
    sc_rows = None
    if shortcut is not None:
        fused = _fused_shortcut(feats, weight, kmap, config, bias, residual, shortcut)
        if fused is None:
            sc_feats, sc_weight, sc_bias, sc_kmap = shortcut
            residual = sparse_conv(sc_feats, sc_weight, sc_kmap, config, sc_bias)
        else:
            bias, sc_rows = fused
    _check_args(feats, weight, kmap, bias, residual)
    out = _forward(
        feats,
        weight,
        kmap,
        config,
        (bias, relu, residual),
        OutputUse(remake, then_concat, sc_rows, head)
        if remake is not None or then_concat is not None or sc_rows is not None
        else NO_USE,
    )
    if then_concat is None or isinstance(out, RowConcat):
        return out
    return cast(torch.Tensor, concat_rows(out, then_concat, config.precision))


def _fused_shortcut(feats, weight, kmap: KernelMap, config: EngineConfig, bias, residual, shortcut):
    """(the conv's bias plus the shortcut's, the shortcut's (q, row scales, weight)) where an
    int8 conv can add its shortcut in its own kernel: both convs int8, the shortcut 1x1 on the
    same rows, and both inputs' quantizations on record; else None."""
    sc_feats, sc_weight, sc_bias, sc_kmap = shortcut
    cin, cout = weight.shape[1], weight.shape[2]
    sc_cin = sc_weight.shape[1]
    if (
        config.precision != "int8"
        or torch.is_grad_enabled()
        or residual is not None
        or kmap.identity is None
        or sc_kmap.kernel_size != 1
        or sc_kmap.num_out != kmap.num_out
        or sc_weight.shape != (1, sc_cin, cout)
        or not int8_fits(cin, cout)
        or not int8_fits(sc_cin, cout)
        or not config.plan(kmap, cin, cout, feats.device)[1]
        or not config.plan(sc_kmap, sc_cin, cout, feats.device)[1]
    ):
        return None
    rows, sc_rows = memoized(feats, config.workspace), memoized(sc_feats, config.workspace)
    if rows is None or sc_rows is None:
        return None
    total = (
        None
        if bias is None and sc_bias is None
        else ((bias if bias is not None else 0) + (sc_bias if sc_bias is not None else 0))
    )
    return total, (*sc_rows, sc_weight)


def _forward(feats, weight, kmap: KernelMap, config: EngineConfig, epilogue, use: OutputUse):
    """sparse_conv's output (or the stand-in `use` lets the int8 conv return)."""
    bias, relu, residual = epilogue
    cin, cout = weight.shape[1], weight.shape[2]
    plan, int8 = config.plan(kmap, cin, cout, feats.device)
    if use.shortcut is not None:  # _fused_shortcut found the int8 kernel takes both convs
        out = conv_int8(feats, weight, plan, config.workspace, bias, relu, residual, use)
        if out is None:
            raise RuntimeError("the int8 conv that was to add its shortcut did not run")
        return out
    if isinstance(feats, MadeOnUse):
        out = _stand_in_int8(feats, weight, plan, int8, config, bias, relu, residual, use)
        if out is not None:
            return out
        feats = feats.tensor()
    feats = deferred.contiguous(feats)
    extras = [t for t in (bias, residual) if t is not None]
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in [feats, weight, *extras])
    if not grads and feats.device.type == "cpu" and feats.dtype == torch.float32:
        out = _reduced_precision(feats, weight, plan, int8, config, bias, relu, residual, use)
        if out is not None:
            return out
    max_rows = config.max_rows(cin, cout, feats.dtype, feats.device)
    if not grads:
        run = Run(config.deterministic, max_rows, config.workspace)
        return _SparseConvFunction.apply(feats, weight, plan, run, (bias, relu, residual))
    out = _SparseConvFunction.apply(
        feats, weight, plan, Run(config.deterministic, max_rows, None), None
    )
    for t in extras:
        out = out + t
    return torch.relu(out) if relu else out
