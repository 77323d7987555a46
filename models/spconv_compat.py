"""Weight layout conversion between spconv 2.x and our layers.

spconv stores a conv weight as [Cout, K, K, K, Cin] on coordinates (batch, x, y, z), so
    ours = w.permute(1, 2, 3, 4, 0).reshape(K**3, Cin, Cout)
gives our [K^3, Cin, Cout] with kernel index k = a*K*K + b*K + c (see models/layers.py).

The 1x1 quirk: for kernel size 1 (stride 1) spconv skips its gather-scatter and runs
`features @ weight.view(Cin, Cout)`: it reads the [Cout, 1, 1, 1, Cin] buffer as [Cin, Cout]
without transposing. The function that weight computes is therefore the buffer's raw
reinterpretation, not its transpose, and the conversion follows suit.
"""

from __future__ import annotations

import torch


def cube_root(volume: int) -> int:
    """K of a kernel volume K^3; ValueError if it is not a cube."""
    k = round(volume ** (1 / 3))
    if k**3 != volume:
        raise ValueError(f"kernel volume {volume} is not a cube")
    return k


def weight_from_spconv(w: torch.Tensor) -> torch.Tensor:
    """spconv [Cout, K, K, K, Cin] -> ours [K^3, Cin, Cout] (same function, 1x1 quirk included)."""
    if w.dim() != 5 or not (w.shape[1] == w.shape[2] == w.shape[3]):
        raise ValueError(f"expected an spconv weight [Cout, K, K, K, Cin], got {tuple(w.shape)}")
    cout, k, cin = w.shape[0], w.shape[1], w.shape[4]
    if k == 1:
        return w.contiguous().view(1, cin, cout).clone()
    return w.permute(1, 2, 3, 4, 0).reshape(k**3, cin, cout).contiguous()


def weight_to_spconv(w: torch.Tensor) -> torch.Tensor:
    """ours [K^3, Cin, Cout] -> spconv [Cout, K, K, K, Cin]; inverse of weight_from_spconv."""
    volume, cin, cout = w.shape
    k = cube_root(volume)
    if k == 1:
        return w.contiguous().view(cout, 1, 1, 1, cin).clone()
    return w.reshape(k, k, k, cin, cout).permute(4, 0, 1, 2, 3).contiguous()


def native_algo():
    """spconv's Native algorithm (gather, GEMM, scatter), the one that runs on both the CPU and
    CUDA. A build of spconv with CUDA picks implicit GEMM by default, which refuses CPU tensors,
    so every spconv layer we build as a reference names this algorithm."""
    import spconv.pytorch as spconv  # lazy: spconv is an optional dependency

    return spconv.ConvAlgo.Native
