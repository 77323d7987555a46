"""Parts (b)-(e) of bench.layers on one kernel map, per dtype and channel count C (Cin = Cout = C):
(b) the SubMConv3d forward, ours vs spconv (bench/layers_spconv.py), (c) our GFLOP/s against one
dense torch.mm of the same rows, (d) the tuned dataflow and grouping against the grouped dataflow
separate and dense and, on CPU, the fused dataflow, (e) deterministic mode (measured on CUDA).

Also the engine settings they compare and how a setting and a time ratio read, which part (a) in
bench/layers.py prints too.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from bench import layers_spconv
from kernels import KernelMap
from kernels.engine import EngineConfig, sparse_conv
from kernels.tuning import GroupingTable
from models.spconv_compat import weight_from_spconv

INF = math.inf


def ratio_text(ours: float, ref: float, ref_name: str = "spconv") -> str:
    r = ours / ref
    verdict = f"{1 / r:.1f}x faster" if r <= 1 else f"{r:.1f}x slower"
    return f"ours/{ref_name} = {r:.2f}x time ({verdict})"


def grouping_configs(deterministic: bool = False, fused: bool = True) -> dict[str, EngineConfig]:
    """tuned (the shipped table), grouped separate and dense, and (fused=True, CPU) fused."""
    table = GroupingTable.load_default()
    const = lambda e, s, d="grouped": GroupingTable(
        entries={}, defaults={"cpu": (e, s, d), "cuda": (e, s, d)}
    )
    configs = {
        "tuned": EngineConfig(deterministic=deterministic, grouping=table),
        "separate": EngineConfig(deterministic=deterministic, grouping=const(0.0, 0.0)),
        "dense": EngineConfig(deterministic=deterministic, grouping=const(1.0, INF)),
    }
    if fused:
        configs["fused"] = EngineConfig(
            deterministic=deterministic, grouping=const(0.0, 0.0, "fused")
        )
    return configs


def fmt_s(value) -> str:
    return "inf" if value == INF else f"{int(value)}"


def setting_text(eps: float, thr: float, dataflow: str) -> str:
    """How one (epsilon, S, dataflow) choice reads: the grouping only matters to the fused
    dataflow through its offset order, which is the same for every (epsilon, S)."""
    return "fused" if dataflow == "fused" else f"grouped eps={eps:g},S={fmt_s(thr)}"


@dataclasses.dataclass
class Layer:
    """One layer of (b)-(e): Cin = Cout = c in one dtype, its input features and its weights in
    both layouts, drawn from a generator seeded by c (which (c) draws its dense mm's operands
    from next)."""

    c: int
    dtype: torch.dtype
    gen: torch.Generator
    feats: torch.Tensor
    sp_w: torch.Tensor  # spconv's layout [C, 3, 3, 3, C], on the CPU in fp32
    weight: torch.Tensor  # ours [27, C, C], on the device in dtype

    @classmethod
    def draw(cls, c: int, dtype: torch.dtype, voxels: int, device: torch.device) -> Layer:
        gen = torch.Generator().manual_seed(c)
        feats = torch.randn(voxels, c, generator=gen).to(device, dtype)
        sp_w = torch.randn(c, 3, 3, 3, c, generator=gen) / math.sqrt(27 * c)
        weight = weight_from_spconv(sp_w).to(device, dtype)
        return cls(c, dtype, gen, feats, sp_w, weight)

    @property
    def dname(self) -> str:
        return {torch.float32: "fp32", torch.float16: "fp16"}[self.dtype]


class ConvFigures:
    """(b)-(e) on one kernel map of a frame's voxels, timed (t) and printed (out) by the
    bench.layers Bench that runs them."""

    def __init__(self, bench, kmap: KernelMap, voxels: int, sp_coords, spatial, threads: int):
        self.bench, self.kmap, self.voxels = bench, kmap, voxels
        self.sp_coords, self.spatial, self.threads = sp_coords, spatial, threads
        self.entries = sum(kmap.counts)
        self.configs = grouping_configs(fused=not bench.cuda)  # fused: a CPU-only dataflow
        self.det_configs = grouping_configs(deterministic=True, fused=False)

    def rows(self) -> list[dict]:
        """Every dtype (fp32; fp16 too on CUDA) and channel count: one row of figures each."""
        bench = self.bench
        dtypes = [torch.float32] + ([torch.float16] if bench.cuda else [])
        rows = []
        for dtype in dtypes:
            for c in bench.args.channels:
                layer = Layer.draw(c, dtype, self.voxels, bench.device)
                row = {"dtype": layer.dname, "C": c, "entries": self.entries}
                with torch.no_grad():
                    ours, tuned_text = self.forward(layer, row)
                    self.versus_mm(layer, ours, row)
                    self.grouping(layer, ours, tuned_text, row)
                    if bench.cuda:
                        self.deterministic(layer, ours, row)
                rows.append(row)
        if not bench.cuda:
            bench.out(
                "  (e) deterministic: CPU: no float atomics in either dataflow (fused kernel"
                " and per-offset scatter are race-free by construction), so deterministic"
                " mode is the default path: zero cost"
            )
        return rows

    def _ours(self, layer: Layer, config: EngineConfig):
        return lambda: sparse_conv(layer.feats, layer.weight, self.kmap, config)

    def forward(self, layer: Layer, row: dict) -> tuple[float, str]:
        """(b): ours with the tuned setting vs spconv; (our time, the tuned setting's text)."""
        bench, c, dname = self.bench, layer.c, layer.dname
        ours = bench.t(self._ours(layer, self.configs["tuned"]))
        out_ours = self._ours(layer, self.configs["tuned"])()
        row["ours_ms"] = ours * 1e3
        eps, thr, dataflow = self.configs["tuned"].grouping.choose(bench.device.type, 27, c, c)
        tuned_text = setting_text(eps, thr, dataflow)
        row["tuned"] = {"epsilon": eps, "S": fmt_s(thr), "dataflow": dataflow}
        line = f"  (b) C={c:<3d} {dname} fwd  ours {ours * 1e3:8.2f} ms [{tuned_text}]"
        if bench.sp_ok:
            conv, x = layers_spconv.submconv_with_pairs(
                layer.sp_w, layer.feats, self.sp_coords, self.spatial
            )
            out_sp = conv(x).features
            diff = (out_sp.float() - out_ours.float()).abs().max().item()
            sp = bench.t(lambda: conv(x))
            row.update(spconv_ms=sp * 1e3, ratio=ours / sp, maxdiff=diff)
            wrong = not bench.cuda and self.threads > 1
            row["spconv_incorrect"] = wrong
            tag = " [spconv: incorrect results, timing only]" if wrong else ""
            line += (
                f" | spconv {sp * 1e3:8.2f} ms | {ratio_text(ours, sp)} | maxdiff {diff:.1e}{tag}"
            )
        bench.out(line)
        return ours, tuned_text

    def versus_mm(self, layer: Layer, ours: float, row: dict) -> None:
        """(c): achieved GFLOP/s vs one dense mm of the same rows and channels."""
        bench, c, dtype, entries = self.bench, layer.c, layer.dtype, self.entries
        a = torch.randn(entries, c, generator=layer.gen).to(bench.device, dtype)
        b = torch.randn(c, c, generator=layer.gen).to(bench.device, dtype)
        o = torch.empty(entries, c, device=bench.device, dtype=dtype)
        mm = bench.t(functools.partial(torch.mm, a, b, out=o))
        del a, b, o
        flops = 2.0 * entries * c * c
        row.update(
            ours_gflops=flops / ours / 1e9,
            mm_ms=mm * 1e3,
            mm_gflops=flops / mm / 1e9,
            fraction_of_mm=mm / ours,
        )
        bench.out(
            f"  (c) C={c:<3d} {layer.dname} ours {flops / ours / 1e9:7.1f} GFLOP/s"
            f" | dense mm [{entries}x{c}]@[{c}x{c}] {flops / mm / 1e9:7.1f}"
            f" GFLOP/s ({mm * 1e3:.2f} ms) | ours reach {mm / ours:.0%} of it"
        )

    def grouping(self, layer: Layer, ours: float, tuned_text: str, row: dict) -> None:
        """(d): the tuned dataflow and grouping vs separate, dense and (CPU) fused."""
        g = {"tuned": ours}
        others = [n for n in ("separate", "dense", "fused") if n in self.configs]
        for name in others:
            g[name] = self.bench.t(self._ours(layer, self.configs[name]))
        row["grouping_ms"] = {k: v * 1e3 for k, v in g.items()}
        times = " | ".join(f"{n} {g[n] * 1e3:.2f} ms" for n in others)
        ratios = [("tuned", "separate"), ("tuned", "dense")]
        if "fused" in g:
            ratios += [("fused", "separate"), ("fused", "dense")]
        ratio_txt = ", ".join(f"{a}/{b} = {g[a] / g[b]:.2f}x" for a, b in ratios)
        self.bench.out(
            f"  (d) C={layer.c:<3d} {layer.dname} tuned[{tuned_text}]"
            f" {g['tuned'] * 1e3:.2f} ms | {times} | {ratio_txt}"
        )

    def deterministic(self, layer: Layer, ours: float, row: dict) -> None:
        """(e), CUDA: deterministic mode (an ordered CSR scatter) vs the default (atomics)."""
        run = self._ours(layer, self.det_configs["tuned"])
        det = self.bench.t(run)
        out_det = run()
        same = torch.equal(out_det, run())
        row.update(
            deterministic_ms=det * 1e3,
            deterministic_cost=det / ours,
            deterministic_repeatable=same,
        )
        self.bench.out(
            f"  (e) C={layer.c:<3d} {layer.dname} deterministic {det * 1e3:.2f} ms vs"
            f" default {ours * 1e3:.2f} ms = {det / ours:.2f}x time;"
            f" bitwise repeatable: {same}"
        )
