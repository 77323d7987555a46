"""spconv 2.x, the reference bench.layers compares ours with: the indice-pair generation that a
SubMConv3d(k=3) forward runs, called directly with the layer's own algorithm, and a SubMConv3d
whose pairs are already built, so that a forward times the conv alone.

spconv is imported when these are called, only where bench/common.py's spconv_available says it
is there; its coordinates are the shifted copy bench/common.py's spconv_coords gives.
"""

from __future__ import annotations

import torch

from bench import common


def pairs_fn(sp_coords: torch.Tensor, spatial: list[int]):
    """A call that builds the k3 submanifold pairs of these coordinates as a SubMConv3d forward
    on a fresh SparseConvTensor does: on CPU ops.get_indice_pairs (ConvAlgo.Native, the only CPU
    algorithm), on CUDA ops.get_indice_pairs_implicit_gemm (MaskImplicitGemm, is_train=False,
    as in inference)."""
    from spconv.core import ConvAlgo
    from spconv.pytorch import ops
    import spconv.pytorch as spconv

    algo = spconv.SubMConv3d(1, 1, 3, bias=False).algo  # the layer's own choice
    args = (sp_coords, 1, spatial, algo, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0])
    if algo == ConvAlgo.Native:
        return lambda: ops.get_indice_pairs(*args, subm=True, transpose=False)
    return lambda: ops.get_indice_pairs_implicit_gemm(
        *args, subm=True, transpose=False, is_train=False
    )


def submconv_with_pairs(sp_w: torch.Tensor, feats: torch.Tensor, sp_coords, spatial):
    """(conv, x): a SubMConv3d(k=3, no bias, eval) with the weights sp_w ([Cout, 3, 3, 3, Cin],
    spconv's layout) on feats' device and in its dtype, and its input tensor x, whose indice_dict
    already holds the pairs (built by one forward), so that every conv(x) reuses them."""
    import spconv.pytorch as spconv

    cout, cin = sp_w.shape[0], sp_w.shape[-1]
    conv = spconv.SubMConv3d(cin, cout, 3, bias=False, indice_key="subm1")
    conv.weight.data.copy_(sp_w)
    conv = conv.to(feats.device, feats.dtype).eval()
    x = common.spconv_tensor(feats, sp_coords, spatial)
    y = conv(x)  # builds the pairs once
    x.indice_dict = y.indice_dict  # every later forward reuses them
    return conv, x
