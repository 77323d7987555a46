"""Reference MinkUNet checkpoint layouts: their parameter names and conv weight codecs.

`layout_entries(layout, config)` lists, for every key of our MinkUNet state_dict, the reference
key, the shape and whether it is a sparse conv weight, with the layout's weight codec;
models/importers.py imports and exports state dicts through it, `key_map` shows the names.

Reference layouts (`import_state_dict` / `export_state_dict` of models/importers.py)
------------------------------------------------------------------------------------
All three importable layouts are the same MinkUNet topology as ours (models/minkunet.py); only
parameter names and conv weight layouts differ. Names below are for encoder stage i, its residual
block j, decoder stage i, its block j (all 0-based); BN keys are the usual weight / bias /
running_mean / running_var / num_batches_tracked.

"spconv-mmdet3d": mmdetection3d MinkUNet with `sparseconv_backend='spconv'`
    (mmdet3d/models/backbones/minkunet_backbone.py, mmdet3d/models/layers/sparse_block.py,
    mmdet3d/models/decode_heads/minkunet_head.py). make_sparse_convmodule is a SparseSequential
    (conv "0", norm "1", act "2"); SparseBasicBlock is mmdet's BasicBlock (conv1, bn1, conv2, bn2,
    downsample = make_sparse_convmodule(k=1, order=(conv, norm)) or None).
        stem s          backbone.conv_input.{s}.0.weight, backbone.conv_input.{s}.1.*
        down i          backbone.encoder.{i}.0.0.weight, backbone.encoder.{i}.0.1.*
        encoder block   backbone.encoder.{i}.{j+1}.conv1.weight / bn1 / conv2 / bn2
                        / downsample.0.weight / downsample.1.*
        up i            backbone.decoder.{i}.0.0.weight, backbone.decoder.{i}.0.1.*
        decoder block   backbone.decoder.{i}.1.{j}.conv1 ... (as above)
        head            decode_head.conv_seg.weight / .bias (nn.Linear)
    Conv weights are spconv 2.x [Cout, K, K, K, Cin] on (x, y, z) (the mmdet3d minkunet
    voxeliser puts x, y, z after the batch column); converted with weight_from_spconv, which
    includes spconv's 1x1 quirk (models/spconv_compat.py).

"torchsparse-mmdet3d": mmdetection3d MinkUNet with `sparseconv_backend='torchsparse'`
    (mmdet3d/models/layers/torchsparse_block.py: TorchSparseConvModule.net = [Conv3d, BN, ReLU];
    TorchSparseBasicBlock.net = [Conv3d, BN, ReLU, Conv3d, BN], .downsample = [Conv3d k1, BN]
    or nn.Identity when channels match).
        stem s          backbone.conv_input.{s}.net.0.kernel, backbone.conv_input.{s}.net.1.*
        down i          backbone.encoder.{i}.0.net.0.kernel, backbone.encoder.{i}.0.net.1.*
        encoder block   backbone.encoder.{i}.{j+1}.net.{0,3}.kernel, .net.{1,4}.*,
                        .downsample.0.kernel, .downsample.1.*
        up i            backbone.decoder.{i}.0.net.0.kernel, backbone.decoder.{i}.0.net.1.*
        decoder block   backbone.decoder.{i}.1.{j}.net... (as above)
        head            decode_head.conv_seg.weight / .bias

"torchsparse-spvnas": SPVNAS MinkUNet (mit-han-lab/spvnas core/models/semantic_kitti/minkunet.py)
        stem            stem.0.kernel, stem.1.*, stem.3.kernel, stem.4.*
        down i          stage{i+1}.0.net.0.kernel, stage{i+1}.0.net.1.*
        encoder block   stage{i+1}.{j+1}.net.{0,3}.kernel, .net.{1,4}.*, .downsample.{0,1}
        up i            up{i+1}.0.net.0.kernel, up{i+1}.0.net.1.*
        decoder block   up{i+1}.1.{j}.net... (as above)
        head            classifier.0.weight / .bias
    SPVNAS's MinkUNet also holds `point_transforms.*` (Linear + BN1d), which its forward never
    uses; the importer drops them.

Kernel layouts: models/spconv_compat.py, models/torchsparse_compat.py.

"spconv-pointcept": Pointcept SpUNet-v1m1 is a different network, not a MinkUNet, so these
    tables refuse it (POINTCEPT_MISMATCH says why); it is imported into our SpUNet
    (models/spunet.py) by models.pointcept.import_pointcept / load_pointcept.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Literal, TypeAlias

import torch

from .checkpoint_errors import CheckpointError
from .minkunet import MinkUNetConfig
from .spconv_compat import cube_root, weight_from_spconv, weight_to_spconv
from .torchsparse_compat import weight_from_torchsparse, weight_to_torchsparse

LAYOUTS = ("spconv-mmdet3d", "spconv-pointcept", "torchsparse-spvnas", "torchsparse-mmdet3d")

POINTCEPT_MISMATCH = (
    "layout 'spconv-pointcept' is Pointcept SpUNet-v1m1 "
    "(pointcept/models/sparse_unet/spconv_unet_v1m1_base.py), a different network from our "
    "MinkUNet, so it cannot be loaded into one: its stem is ONE SubMConv3d with kernel 5 (ours: "
    "two kernel-3 convs); its down-sampling SparseConv3d changes the channel count where ours "
    "keeps it; its default depth is (2, 3, 4, 6, 2, 2, 2, 2) with BN eps 1e-3 / momentum 0.01; "
    "its head is a 1x1 SubMConv3d with bias (`final`), not a Linear. Import it into our SpUNet "
    "with models.pointcept.import_pointcept (state dict) or models.pointcept.load_pointcept "
    "(model); models.pointcept.export_pointcept goes the other way."
)


# ---- weight layouts ---------------------------------------------------------------------------


def _spconv_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    volume, cin, cout = shape
    k = cube_root(volume)
    return (cout, k, k, k, cin)


def _torchsparse_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    volume, cin, cout = shape
    return (cin, cout) if volume == 1 else tuple(shape)


@dataclasses.dataclass(frozen=True)
class _Codec:
    conv_param: str  # "weight" (spconv) or "kernel"
    to_ours: Callable[[torch.Tensor], torch.Tensor]
    from_ours: Callable[[torch.Tensor], torch.Tensor]
    ref_shape: Callable[[tuple[int, ...]], tuple[int, ...]]


_SPCONV = _Codec("weight", weight_from_spconv, weight_to_spconv, _spconv_shape)
_TORCHSPARSE = _Codec("kernel", weight_from_torchsparse, weight_to_torchsparse, _torchsparse_shape)


# ---- parameter naming -------------------------------------------------------------------------
# A "site" is one layer of our MinkUNet, described independently of naming:
#   ("stem", s), ("down", i), ("up", i), ("block", "enc" | "dec", i, j, has_shortcut), ("head",)
# Each layout maps a site's sub-layers to reference module prefixes.

_BN_PARAMS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _block_ref_mmdet3d_spconv(base: str) -> dict[str, str]:
    return {
        "net.0": f"{base}.conv1",
        "net.1": f"{base}.bn1",
        "net.3": f"{base}.conv2",
        "net.4": f"{base}.bn2",
        "shortcut.0": f"{base}.downsample.0",
        "shortcut.1": f"{base}.downsample.1",
    }


def _block_ref_torchsparse(base: str) -> dict[str, str]:
    return {
        "net.0": f"{base}.net.0",
        "net.1": f"{base}.net.1",
        "net.3": f"{base}.net.3",
        "net.4": f"{base}.net.4",
        "shortcut.0": f"{base}.downsample.0",
        "shortcut.1": f"{base}.downsample.1",
    }


def _names_mmdet3d(site, layer: str, block_ref: Callable[[str], dict[str, str]]) -> dict[str, str]:
    """mmdet3d's MinkUNet naming; its spconv and torchsparse backends differ only in where a
    conv/BN pair lives inside its module (`layer`: ".{0,1}" or ".net.{0,1}") and in the blocks."""
    kind = site[0]
    roots = {
        "stem": "backbone.conv_input.{}",
        "down": "backbone.encoder.{}.0",
        "up": "backbone.decoder.{}.0",
    }
    if kind in roots:
        root = roots[kind].format(site[1])
        return {str(k): f"{root}{layer}.{k}" for k in (0, 1)}
    if kind == "block":
        _, part, i, j, _ = site
        base = f"backbone.encoder.{i}.{j + 1}" if part == "enc" else f"backbone.decoder.{i}.1.{j}"
        return block_ref(base)
    return {"": "decode_head.conv_seg"}


def _names_spconv_mmdet3d(site) -> dict[str, str]:
    return _names_mmdet3d(site, "", _block_ref_mmdet3d_spconv)


def _names_torchsparse_mmdet3d(site) -> dict[str, str]:
    return _names_mmdet3d(site, ".net", _block_ref_torchsparse)


def _names_torchsparse_spvnas(site) -> dict[str, str]:
    kind = site[0]
    if kind == "stem":
        s = site[1]
        return {"0": f"stem.{3 * s}", "1": f"stem.{3 * s + 1}"}
    if kind == "down":
        return {"0": f"stage{site[1] + 1}.0.net.0", "1": f"stage{site[1] + 1}.0.net.1"}
    if kind == "up":
        return {"0": f"up{site[1] + 1}.0.net.0", "1": f"up{site[1] + 1}.0.net.1"}
    if kind == "block":
        _, part, i, j, _ = site
        base = f"stage{i + 1}.{j + 1}" if part == "enc" else f"up{i + 1}.1.{j}"
        return _block_ref_torchsparse(base)
    return {"": "classifier.0"}


_LAYOUTS: dict[str, tuple[_Codec, Callable, tuple[str, ...]]] = {
    # layout: (weight codec, naming, prefixes of reference keys known to be unused and dropped)
    "spconv-mmdet3d": (_SPCONV, _names_spconv_mmdet3d, ()),
    "torchsparse-mmdet3d": (_TORCHSPARSE, _names_torchsparse_mmdet3d, ()),
    "torchsparse-spvnas": (_TORCHSPARSE, _names_torchsparse_spvnas, ("point_transforms.",)),
}


@dataclasses.dataclass(frozen=True)
class _Entry:
    ours: str  # our state_dict key
    ref: str  # the reference key
    shape: tuple[int, ...]  # our shape
    conv: bool  # a sparse conv weight (layout conversion applies)


# one layer of a site: ("conv", kernel size, cin, cout), ("bn", channels) or ("linear", cin, cout)
_Layer: TypeAlias = (
    tuple[Literal["conv"], int, int, int]
    | tuple[Literal["bn"], int]
    | tuple[Literal["linear"], int, int]
)


def _sites(config: MinkUNetConfig) -> Iterator[tuple[str, tuple, dict[str, _Layer]]]:
    """(our module prefix, site, {our sub-layer: (kind, channels...)}) for every layer."""
    cs = config.channels
    for s in range(2):
        cin = config.in_channels if s == 0 else cs[0]
        yield f"stem.{s}", ("stem", s), {"0": ("conv", 3, cin, cs[0]), "1": ("bn", cs[0])}
    for i in range(4):
        c = cs[i]
        yield f"encoder.{i}.down", ("down", i), {"0": ("conv", 2, c, c), "1": ("bn", c)}
        for j in range(config.encoder_blocks[i]):
            cin = cs[i] if j == 0 else cs[i + 1]
            yield from _block(f"encoder.{i}.blocks.{j}", ("enc", i, j), cin, cs[i + 1])
    for i in range(4):
        cin, skip, cout = cs[4 + i], cs[3 - i], cs[5 + i]
        yield f"decoder.{i}.up", ("up", i), {"0": ("conv", 2, cin, cout), "1": ("bn", cout)}
        for j in range(config.decoder_blocks[i]):
            yield from _block(
                f"decoder.{i}.blocks.{j}", ("dec", i, j), cout + skip if j == 0 else cout, cout
            )
    yield "head", ("head",), {"": ("linear", cs[8], config.num_classes)}


def _block(
    prefix: str, where: tuple, cin: int, cout: int
) -> Iterator[tuple[str, tuple, dict[str, _Layer]]]:
    layers: dict[str, _Layer] = {
        "net.0": ("conv", 3, cin, cout),
        "net.1": ("bn", cout),
        "net.3": ("conv", 3, cout, cout),
        "net.4": ("bn", cout),
    }
    if cin != cout:
        layers.update({"shortcut.0": ("conv", 1, cin, cout), "shortcut.1": ("bn", cout)})
    yield prefix, ("block", *where, cin != cout), layers


def layout_entries(
    layout: str, config: MinkUNetConfig
) -> tuple[_Codec, list[_Entry], tuple[str, ...]]:
    """(weight codec, one entry per key of our state_dict, prefixes of reference keys known to be
    unused) for `layout` and `config`; spconv-pointcept is a CheckpointError (POINTCEPT_MISMATCH),
    an unknown layout a ValueError."""
    if layout == "spconv-pointcept":
        raise CheckpointError(POINTCEPT_MISMATCH)
    if layout not in _LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {list(LAYOUTS)}")
    codec, naming, ignored = _LAYOUTS[layout]
    out = []
    for prefix, site, layers in _sites(config):
        names = naming(site)
        for sub, spec in layers.items():
            ours = f"{prefix}.{sub}" if sub else prefix
            ref = names[sub]
            if spec[0] == "conv":
                _, k, cin, cout = spec
                out.append(
                    _Entry(f"{ours}.weight", f"{ref}.{codec.conv_param}", (k**3, cin, cout), True)
                )
            elif spec[0] == "bn":
                c = spec[1]
                for p in _BN_PARAMS:
                    shape = () if p == "num_batches_tracked" else (c,)
                    out.append(_Entry(f"{ours}.{p}", f"{ref}.{p}", shape, False))
            else:  # linear
                _, cin, cout = spec
                out.append(_Entry(f"{ours}.weight", f"{ref}.weight", (cout, cin), False))
                out.append(_Entry(f"{ours}.bias", f"{ref}.bias", (cout,), False))
    return codec, out, ignored


def key_map(layout: str, config: MinkUNetConfig) -> dict[str, str]:
    """{our state_dict key: reference key} for a layout (for inspection and error reports)."""
    _, entries, _ = layout_entries(layout, config)
    return {e.ours: e.ref for e in entries}
