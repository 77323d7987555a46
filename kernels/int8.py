"""int8 inference on the CPU (kernels/precision.py says when it runs): a sparse conv's input rows
as uint8 with one scale per row, its weights as int8 with one scale per (offset, output channel),
products summed exactly in int32 by AVX512_VNNI dot products or AMX tiles
(csrc/fused_int8_cpu.cpp, amx_tiles.h), or on CPUs without AVX-512 by 256-bit AVX_VNNI or AVX2
(fused_int8_avx2_cpu.cpp), the same bits on every kernel (csrc/int8_kernels.h), each map
entry's sum scaled to fp32 and added into the fp32 output (bias, residual, ReLU in fp32).

Nothing is calibrated ahead of time: a row's scale is its own maximum / 255, measured as the row
is quantized (one pass, ls_quantize_rows_u8_cpu; for an int8 conv's ReLU output, by that
conv itself as it finishes each block of rows: _made_rows), so a frame from another sensor or
scene gets scales that fit it. Weights: scale = max |w| / 127 over the input channels of one
offset and output channel, values rounded to the nearest int8. On the default model this keeps
labels 99.66-99.91 % equal to fp32 on every real frame in shared/ (README, precision table).

Where it does not apply the conv runs as bf16 would (kernels/bf16.py: the fused bf16 kernel,
else fp32): the input layer (at most FP32_MAX_CIN channels: raw point features, some negative),
input rows with a negative value (every MinkUNet conv after the first reads ReLU outputs),
widths the kernel does not take (Cin not a multiple of 4, Cout not of its lanes: 16 on
AVX-512, 8 on the 256-bit kernels), a CPU without AVX2. The int8 kernel is the fused dataflow
only; the tuner's grouped / fused choice does not apply to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch

from . import backend, deferred
from .concat import ClassifiedOutput, MadeOnUse, RowConcat, UnkeptOutput
from .bf16 import FP32_MAX_CIN
from .chunking import Workspace
from .derived import derived
from .fused import fused_output, walk_args
from .grouping import ExecutionPlan
from .precision import fused_int8_lanes, int8_kernel
from .rows import HeadColumns


def int8_weights(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed int8 bytes, scales fp32 [K, Cout]) of a [K, Cin, Cout] weight (Cin a multiple of
    4) for the int8 kernel that runs (pack_weight), cached per weight tensor until it changes."""
    group = int8_group()
    return derived(weight, f"int8/{group}", lambda w: pack_weight(*quantize_weight(w), group))


def int8_group() -> int:
    """Input channels per int32 lane of the running kernel's packed weights (csrc/api.h): two
    int16 for AVX2's vpmaddwd, else four int8."""
    return 2 if int8_kernel() == "avx2" else 4


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per (offset, output channel): w ~ q * scale, q int8 [K, Cin, Cout] in
    [-127, 127], scale fp32 [K, Cout]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127  # [K, Cout]
    q = torch.round(w / scale.clamp_min(torch.finfo(torch.float32).tiny)[:, None, :])
    return q.clamp(-127, 127).to(torch.int8), scale.contiguous()


def pack_weight(
    q: torch.Tensor, scale: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [K, Cin, Cout] as the kernel reads it, packed[k][g][o][j] = q[k][group g + j][o]: int8
    quads [K, Cin/4, Cout, 4] (group 4), or int16 pairs [K, Cin/2, Cout, 2] (group 2) seen as
    their int8 bytes [K, Cin/2, Cout, 4]."""
    k, cin, cout = q.shape
    values = q if group == 4 else q.to(torch.int16)
    packed = values.view(k, cin // group, group, cout).transpose(2, 3).contiguous()
    return packed.view(torch.int8), scale


def quantize_rows(
    src: torch.Tensor | RowConcat, q: torch.Tensor, scale: torch.Tensor, workspace=None
) -> bool:
    """Fills q (uint8 [N, C]) and scale (fp32 [N]) from src (fp32 [N, C], or the two parts of
    a RowConcat side by side); False (q unusable) when src has a negative (-0.0 too), NaN or
    infinite value."""
    negative, found = (workspace or Workspace()).flag(NEGATIVE_FLAG)
    if isinstance(src, RowConcat):  # a part may be a stand-in too (an unkept upsampling)
        a, b = (p.tensor() if isinstance(p, MadeOnUse) else p for p in src.parts)
        backend.call(
            "quantize_concat_u8", "cpu", a, a.shape[1], b, b.shape[1], len(a), q, scale, negative
        )
    else:
        rows = src.tensor() if isinstance(src, MadeOnUse) else src
        n, c = rows.shape
        backend.call("quantize_rows_u8", "cpu", rows, n, c, q, scale, negative)
    deferred.settle()  # the flag is read now (where the call waited, it runs first)
    return not found[0]


# workspace slots: the last input quantized here (READ_SLOTS), and the ring of outputs that
# int8 convs quantized as they made them (MADE_SLOTS, three deep: a block's conv2 reads its
# conv1's output and, for a fused shortcut, the block's input, while it makes its own)
READ_SLOTS = (6, 7)
MADE_SLOTS = ((8, 9), (10, 11), (12, 13))
NEGATIVE_FLAG = 0  # flag slots: quantize_rows's, then one per MADE_SLOTS turn (FAILED_FLAGS)
FAILED_FLAGS = (1, 2, 3)


def _quantized(
    src: torch.Tensor | RowConcat, workspace
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q uint8 [N, C], row scales fp32 [N]) of src, or None where it has a negative value.
    Rows quantized before are not quantized again: the output of an int8 conv that quantized it
    as it made it (_made_rows), and the rows the int8 conv before read (a residual block's first
    conv, then its 1x1 shortcut). Each record holds src itself, so no other tensor can take its
    memory meanwhile, and src's version counter says whether it was written since."""
    found = memoized(src, workspace)
    if found is not None:
        return found
    memo = workspace.memo()
    memo.pop("int8_rows", None)  # its buffers are about to be overwritten
    n, cin = src.shape
    q = workspace.get(READ_SLOTS[0], n, cin, torch.uint8, src.device)
    row_scale = workspace.get(READ_SLOTS[1], n, 1, torch.float32, src.device).view(n)
    if not quantize_rows(src, q, row_scale, workspace):
        return None
    memo["int8_rows"] = (src, src._version, q, row_scale)
    return q, row_scale


def memoized(src, workspace) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q, row scales) of src where its quantization is on record (made by the int8 conv that
    made src, or by the last conv that read it), else None; nothing is quantized here."""
    memo = workspace.memo()
    for record in (memo.get("int8_rows"), *memo.get("int8_made", ())):
        if record is not None and record[0] is src and record[1] == src._version:
            return record[2], record[3]
    return None


def _made_rows(workspace, num_out: int, cout: int):
    """(q, scales, failed flag, keep) for a conv that quantizes its output as it makes it: the
    buffers of the ring slot that comes next (its record dropped now), and keep(dst) to record
    them once the conv has run."""
    memo = workspace.memo()
    ring = memo.setdefault("int8_made", [None] * len(MADE_SLOTS))
    turn = memo.get("int8_made_turn", 0)
    memo["int8_made_turn"] = (turn + 1) % len(MADE_SLOTS)
    ring[turn] = None  # its buffers are about to be overwritten
    q_slot, scale_slot = MADE_SLOTS[turn]
    q = workspace.get(q_slot, num_out, cout, torch.uint8, backend.CPU)
    scale = workspace.get(scale_slot, num_out, 1, torch.float32, backend.CPU).view(num_out)
    failed, failed_value = workspace.flag(FAILED_FLAGS[turn])

    def keep(dst: torch.Tensor) -> None:
        if deferred.deferring():  # the conv waits: its flag is checked once it has run
            deferred.check_after(failed_value)
        elif failed_value[0]:
            return
        ring[turn] = (dst, dst._version, q, scale)

    return q, scale, failed, keep


@dataclass(frozen=True)
class OutputUse:
    """What the caller of an int8 conv does with its output (engine.sparse_conv), and a
    residual it may compute itself.

    remake: given where the caller reads the output only as the next int8 conv's input; where
    the conv quantizes its output for it, the fp32 rows are then not kept, and the result is an
    UnkeptOutput that remake() makes if something else needs it after all.
    concat (fp32 [num_out, C], contiguous): the caller concatenates the output with these rows;
    a conv with a ReLU then quantizes the two side by side as it makes its rows and returns a
    RowConcat of them (else the output alone, for the caller to concatenate).
    shortcut (q uint8 [num_out, C], row scales [num_out], weight fp32 [1, C, Cout]): the
    residual is the 1x1 conv of those rows (a residual block's shortcut, its bias already in
    the conv's bias), added in the kernel right after the identity offset, never written out.
    Only for rows whose quantization is on record (memoized), so nothing overwrites them.
    head (kernels/rows.py HeadColumns, with remake): the caller wants only the head's class of
    each output row (the network's last conv); a conv with a ReLU then computes them as it makes
    its rows, never writing the rows, and returns a ClassifiedOutput."""

    remake: Callable[[], torch.Tensor] | None = None
    concat: torch.Tensor | None = None
    shortcut: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    head: HeadColumns | None = None


NO_USE = OutputUse()  # the output as it is (made once: a frame's 50 convs mostly pass this)


def int8_fits(cin: int, cout: int) -> bool:
    """Whether the int8 kernel that runs here takes a conv of these widths (not the input
    layer's few channels)."""
    lanes = fused_int8_lanes()
    return cin > FP32_MAX_CIN and cin % 4 == 0 and bool(lanes) and cout % lanes == 0


def _shortcut_args(shortcut) -> tuple:
    """The kernel's shortcut arguments (sc_q, sc_scale, sc_cin, sc_w, sc_w_scale)."""
    if shortcut is None:
        return (None, None, 0, None, None)
    q, scale, weight = shortcut
    packed, w_scale = int8_weights(weight)
    return (q, scale, q.shape[1], packed, w_scale)


def _head_here(use: OutputUse, relu: bool, concat, cout: int, plan: ExecutionPlan):
    """use.head where this conv computes the head's classes itself: a submanifold conv (its rows
    in order) with a ReLU, rows cout wide, nothing concatenated, and a remake for the rows."""
    head = use.head
    if head is None or not relu or concat is not None or use.remake is None:
        return None
    return head if head.features == cout and plan.kmap.identity is not None else None


def conv_int8(
    src: torch.Tensor | RowConcat,
    weight: torch.Tensor,
    plan: ExecutionPlan,
    workspace,
    bias=None,
    relu: bool = False,
    residual=None,
    use: OutputUse = NO_USE,
) -> torch.Tensor | UnkeptOutput | RowConcat | None:
    """The forward conv of engine.sparse_conv in int8 (src [N, Cin] fp32, or a RowConcat of
    two such parts -> [num_out, Cout] fp32), or None where it does not apply (see the module
    doc); `use` may let it return a stand-in instead (OutputUse)."""
    n, cin = src.shape
    cout = weight.shape[2]
    if not int8_fits(cin, cout):
        return None
    quantized = _quantized(src, workspace)
    if quantized is None:
        return None
    q, row_scale = quantized
    packed, w_scale = int8_weights(weight)
    concat = use.concat
    if not relu or not (isinstance(concat, torch.Tensor) and concat.dtype == torch.float32):
        concat = None  # rows that may be negative, or no fp32 tensor: the caller concatenates
    else:
        concat = deferred.contiguous(concat)
    # a conv's ReLU output is what the next int8 conv reads (an upsampling's beside the skip
    # rows): quantized in the kernel, block by block in cache, it need not be read back from
    # memory for it
    also = concat.shape[1] if concat is not None else 0
    head = _head_here(use, relu, concat, cout, plan)
    # a remake lets the rows go unmade: for the next conv alone, or beside the classes made
    # here; a head asked for but not computed here means the caller needs the rows
    remake = use.remake if use.head is None or head is not None else None
    made = _made_rows(workspace, plan.num_out, cout + also) if relu and head is None else None
    unkept = (made is not None or head is not None) and remake is not None
    dst = None if unkept else fused_output(plan.num_out, cout)
    classes = torch.empty(plan.num_out, dtype=torch.uint8) if head is not None else None
    backend.call(
        "fused_conv_int8",
        src.device,
        q,
        row_scale,
        cin,
        packed,
        w_scale,
        cout,
        *walk_args(plan.kmap, plan, bias, residual, relu, dst, plan.num_out),
        *(made[:3] if made else (None, None, None)),
        concat,
        also,
        *_shortcut_args(use.shortcut),
        *((head.weight, head.bias, head.classes) if head else (None, None, 0)),
        classes,
    )
    own: torch.Tensor | UnkeptOutput
    if classes is not None:
        own = ClassifiedOutput((plan.num_out, cout), remake, classes)
    else:
        own = UnkeptOutput((plan.num_out, cout), remake) if unkept else cast(torch.Tensor, dst)
    out = own if concat is None else RowConcat(own, concat)
    if made:
        made[3](out)
    return out
