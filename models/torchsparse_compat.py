"""Weight layout conversion between torchsparse Conv3d kernels and our layers.

torchsparse Conv3d (torchsparse/nn/modules/conv.py, torchsparse/nn/utils/kernel.py, <= 2.0) holds
`kernel` [K^3, Cin, Cout] ([Cin, Cout] for a 1x1 stride-1 conv) on (x, y, z), per-axis offsets
arange(-K//2 + 1, K//2 + 1) (so 0..K-1 for K = 2), enumerated with x FASTEST when K^3 is odd
(MinkowskiEngine's order, the reverse of ours) but with z fastest, like ours, when K^3 is even.
So a K = 3 kernel is reordered and a K = 2 kernel (the down / up convolutions) is not.
The transposed (up) conv keeps [K^3, Cin, Cout] with Cin the coarse side, as ours does.
"""

from __future__ import annotations

import torch

from .spconv_compat import cube_root


def weight_from_torchsparse(w: torch.Tensor) -> torch.Tensor:
    """torchsparse Conv3d `kernel` -> ours [K^3, Cin, Cout].

    [Cin, Cout] (1x1, stride 1) -> [1, Cin, Cout]. [K^3, Cin, Cout] with odd K: torchsparse
    enumerates offsets with x fastest, k_ts = c*K*K + b*K + a for position (a, b, c) on (x, y, z),
    so the kernel axis is read as (c, b, a) and reversed. Even K (the stride-2 down / up convs):
    torchsparse enumerates z fastest, as we do, and the kernel is unchanged."""
    if w.dim() == 2:
        return w.contiguous().view(1, *w.shape).clone()
    if w.dim() != 3:
        raise ValueError(
            f"expected a torchsparse kernel [K^3, Cin, Cout] or [Cin, Cout], got {tuple(w.shape)}"
        )
    volume, cin, cout = w.shape
    k = cube_root(volume)
    if k % 2 == 0:
        return w.contiguous().clone()
    return (
        w.reshape(k, k, k, cin, cout).permute(2, 1, 0, 3, 4).reshape(volume, cin, cout).contiguous()
    )


def weight_to_torchsparse(w: torch.Tensor) -> torch.Tensor:
    """ours [K^3, Cin, Cout] -> torchsparse `kernel`; inverse of weight_from_torchsparse."""
    if w.dim() != 3:
        raise ValueError(f"expected our weight [K^3, Cin, Cout], got {tuple(w.shape)}")
    volume, cin, cout = w.shape
    k = cube_root(volume)
    if k == 1:
        return w.contiguous().view(cin, cout).clone()
    if k % 2 == 0:
        return w.contiguous().clone()
    # the reversal of three axes is its own inverse
    return (
        w.reshape(k, k, k, cin, cout).permute(2, 1, 0, 3, 4).reshape(volume, cin, cout).contiguous()
    )
