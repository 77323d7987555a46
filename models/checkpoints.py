"""Checkpoints: our own file format, and importers for reference MinkUNet state dicts.

Our format
----------
One `torch.save`d dict (loadable with `torch.load(..., weights_only=True)`):

    {"format": "lidarseg-checkpoint",
     "version": 1,
     "dtype": "float32" | "float16",          # storage precision of the floating tensors
     "model": {"arch": "MinkUNet", "in_channels": int, "num_classes": int, "cr": float,
               "encoder_blocks": [int] * 4, "decoder_blocks": [int] * 4,
               "bn_eps": float, "bn_momentum": float},
     "state_dict": {our MinkUNet state_dict},
     "meta": {"class_names": [str] * num_classes,
              "class_colors": [[r, g, b]] * num_classes,           # 0..255, RGB
              "voxel_size": 0.05,                                 # metres
              "input_features": ["x", "y", "z", "intensity"],
              "intensity_normalisation": {"kitti": "0-1", "nuscenes": "0-255 -> /255",
                                          "ouster": "0-255 -> /255"},
              "training_data": str, "version": str}}

With fp16 storage (`save_checkpoint(..., half=True)`) every floating tensor is stored as float16
(integer buffers such as BN's num_batches_tracked stay as they are); `load_checkpoint` casts them
back to float32.

Reference layouts (`import_state_dict` / `export_state_dict`)
-------------------------------------------------------------
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

torchsparse Conv3d (torchsparse/nn/modules/conv.py, torchsparse/nn/utils/kernel.py, <= 2.0) holds
`kernel` [K^3, Cin, Cout] ([Cin, Cout] for a 1x1 stride-1 conv) on (x, y, z), per-axis offsets
arange(-K//2 + 1, K//2 + 1) (so 0..K-1 for K = 2), enumerated with x FASTEST when K^3 is odd
(MinkowskiEngine's order, the reverse of ours) but with z fastest, like ours, when K^3 is even.
So a K = 3 kernel is reordered and a K = 2 kernel (the down / up convolutions) is not.
The transposed (up) conv keeps [K^3, Cin, Cout] with Cin the coarse side, as ours does.

"spconv-pointcept": Pointcept SpUNet-v1m1 is a different network, not a MinkUNet, so these
    functions refuse it (POINTCEPT_MISMATCH says why); it is imported into our SpUNet
    (models/spunet.py) by models.pointcept.import_pointcept / load_pointcept.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from .minkunet import MinkUNet, MinkUNetConfig
from .spconv_compat import weight_from_spconv, weight_to_spconv

FORMAT = "lidarseg-checkpoint"
VERSION = 1
ARCH = "MinkUNet"

SEMANTIC_KITTI_CLASSES: tuple[str, ...] = (
    "car", "bicycle", "motorcycle", "truck", "other-vehicle", "person", "bicyclist",
    "motorcyclist", "road", "parking", "sidewalk", "other-ground", "building", "fence",
    "vegetation", "trunk", "terrain", "pole", "traffic-sign",
)
# RGB, the palette mmdetection3d's SemanticKittiDataset uses (the semantic-kitti-api colour map,
# which is BGR there, in RGB order).
SEMANTIC_KITTI_COLORS: tuple[tuple[int, int, int], ...] = (
    (100, 150, 245), (100, 230, 245), (30, 60, 150), (80, 30, 180), (100, 80, 250),
    (155, 30, 30), (255, 40, 200), (150, 30, 90), (255, 0, 255), (255, 150, 255),
    (75, 0, 75), (175, 0, 75), (255, 200, 0), (255, 120, 50), (0, 175, 0),
    (135, 60, 0), (150, 240, 80), (255, 240, 150), (255, 0, 0),
)
INPUT_FEATURES: tuple[str, ...] = ("x", "y", "z", "intensity")
INTENSITY_NORMALISATION: dict[str, str] = {
    "kitti": "0-1", "nuscenes": "0-255 -> /255", "ouster": "0-255 -> /255"}
META_KEYS = ("class_names", "class_colors", "voxel_size", "input_features",
             "intensity_normalisation", "training_data", "version")
CONFIG_FIELDS = ("in_channels", "num_classes", "cr", "encoder_blocks", "decoder_blocks",
                 "bn_eps", "bn_momentum")

LAYOUTS = ("spconv-mmdet3d", "spconv-pointcept", "torchsparse-spvnas", "torchsparse-mmdet3d")

POINTCEPT_MISMATCH = (
    "layout 'spconv-pointcept' is Pointcept SpUNet-v1m1 "
    "(pointcept/models/sparse_unet/spconv_unet_v1m1_base.py), a different network from our "
    "MinkUNet, so it cannot be loaded into one: its stem is ONE SubMConv3d with kernel 5 (ours: "
    "two kernel-3 convs); its down-sampling SparseConv3d changes the channel count where ours "
    "keeps it; its default depth is (2, 3, 4, 6, 2, 2, 2, 2) with BN eps 1e-3 / momentum 0.01; "
    "its head is a 1x1 SubMConv3d with bias (`final`), not a Linear. Import it into our SpUNet "
    "with models.pointcept.import_pointcept (state dict) or models.pointcept.load_pointcept "
    "(model); models.pointcept.export_pointcept goes the other way.")


# ---- errors ----------------------------------------------------------------------------------

class CheckpointError(ValueError):
    """A file or state dict that is not what it claims to be (format, version, shapes, keys)."""


class MissingKeyError(KeyError):
    """A reference state dict lacks a key our model needs (the message names both)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


# ---- our checkpoint format --------------------------------------------------------------------

def make_meta(class_names=SEMANTIC_KITTI_CLASSES, class_colors=SEMANTIC_KITTI_COLORS, *,
              voxel_size: float = 0.05, input_features=INPUT_FEATURES,
              intensity_normalisation: Mapping[str, str] | None = None,
              training_data: str = "", version: str = "") -> dict:
    """A complete meta dict (defaults: SemanticKITTI classes and colours, 5 cm voxels)."""
    return {
        "class_names": [str(n) for n in class_names],
        "class_colors": [[int(v) for v in c] for c in class_colors],
        "voxel_size": float(voxel_size),
        "input_features": [str(f) for f in input_features],
        "intensity_normalisation": dict(INTENSITY_NORMALISATION if intensity_normalisation is None
                                        else intensity_normalisation),
        "training_data": str(training_data),
        "version": str(version),
    }


def check_meta(meta: Mapping[str, Any], num_classes: int) -> dict:
    """meta normalised to plain Python types; CheckpointError naming the first bad field."""
    if not isinstance(meta, Mapping):
        raise CheckpointError(f"meta must be a dict, got {type(meta).__name__}")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"meta lacks {missing} (required: {list(META_KEYS)}; "
                              "make_meta() fills the defaults)")
    names, colors = list(meta["class_names"]), [list(c) for c in meta["class_colors"]]
    if len(names) != num_classes or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"meta['class_names'] must be {num_classes} strings (num_classes), "
                              f"got {len(names)}")
    if len(colors) != num_classes or any(
            len(c) != 3 or not all(isinstance(v, int) and 0 <= v <= 255 for v in c)
            for c in colors):
        raise CheckpointError(f"meta['class_colors'] must be {num_classes} [r, g, b] triples of "
                              "ints in 0..255")
    voxel_size = meta["voxel_size"]
    if not isinstance(voxel_size, (int, float)) or not voxel_size > 0:
        raise CheckpointError(f"meta['voxel_size'] must be a positive number, got {voxel_size!r}")
    features = list(meta["input_features"])
    if not all(isinstance(f, str) for f in features):
        raise CheckpointError("meta['input_features'] must be a list of strings")
    norm = meta["intensity_normalisation"]
    if not isinstance(norm, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in norm.items()):
        raise CheckpointError("meta['intensity_normalisation'] must map str -> str")
    for key in ("training_data", "version"):
        if not isinstance(meta[key], str):
            raise CheckpointError(f"meta[{key!r}] must be a string")
    out = dict(meta)
    out.update(class_names=names, class_colors=[[int(v) for v in c] for c in colors],
               voxel_size=float(voxel_size), input_features=features,
               intensity_normalisation=dict(norm))
    return out


def config_to_dict(config: MinkUNetConfig) -> dict:
    d = {"arch": ARCH}
    for f in CONFIG_FIELDS:
        v = getattr(config, f)
        d[f] = list(v) if isinstance(v, tuple) else v
    return d


def config_from_dict(d: Mapping[str, Any]) -> MinkUNetConfig:
    if not isinstance(d, Mapping):
        raise CheckpointError(f"checkpoint 'model' must be a dict, got {type(d).__name__}")
    if d.get("arch") != ARCH:
        raise CheckpointError(f"checkpoint model arch {d.get('arch')!r} is not {ARCH!r}")
    missing = [f for f in CONFIG_FIELDS if f not in d]
    if missing:
        raise CheckpointError(f"checkpoint 'model' lacks config fields {missing}")
    kw = {f: d[f] for f in CONFIG_FIELDS}
    kw["encoder_blocks"] = tuple(int(b) for b in kw["encoder_blocks"])
    kw["decoder_blocks"] = tuple(int(b) for b in kw["decoder_blocks"])
    try:
        return MinkUNetConfig(**kw)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"invalid MinkUNet config in checkpoint: {e}") from e


def save_checkpoint(path, model: MinkUNet, meta: Mapping[str, Any], half: bool = False) -> None:
    """Write `model` (its config and state_dict) and `meta` in our format; half=True stores the
    floating tensors as float16."""
    if not isinstance(model, MinkUNet):
        raise TypeError(f"save_checkpoint expects a MinkUNet, got {type(model).__name__}")
    config = model.config
    meta = check_meta(meta, config.num_classes)
    state = {}
    for k, v in model.state_dict().items():
        v = v.detach().to("cpu")
        if half and v.is_floating_point():
            v = v.to(torch.float16)
        state[k] = v.clone().contiguous()
    torch.save({"format": FORMAT, "version": VERSION,
                "dtype": "float16" if half else "float32",
                "model": config_to_dict(config), "state_dict": state, "meta": meta},
               str(Path(path)))


def load_checkpoint(path, device="cpu") -> tuple[MinkUNet, dict]:
    """(model in eval mode on `device`, meta) from a file written by save_checkpoint."""
    path = Path(path)
    try:
        ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # pickle / zip errors: not a torch file we can read safely
        raise CheckpointError(f"{path}: not a readable lidarseg checkpoint ({e})") from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{path}: not a lidarseg checkpoint (format {found!r}, expected "
                              f"{FORMAT!r}); reference state dicts go through import_state_dict")
    version = ckpt.get("version")
    if version != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {version!r} is not supported "
                              f"(this code reads version {VERSION})")
    for key in ("model", "state_dict", "meta"):
        if key not in ckpt:
            raise CheckpointError(f"{path}: checkpoint lacks {key!r}")
    config = config_from_dict(ckpt["model"])
    meta = check_meta(ckpt["meta"], config.num_classes)
    state = {k: (v.to(torch.float32) if v.is_floating_point() else v)
             for k, v in ckpt["state_dict"].items()}
    model = MinkUNet(config=config)
    _load_exact(model, state, str(path))
    return model.to(device).eval(), meta


def _load_exact(model: torch.nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    if missing:
        raise MissingKeyError(f"{where}: state_dict misses {missing[:8]}"
                              + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    if extra:
        raise CheckpointError(f"{where}: state_dict has unexpected keys {extra[:8]}"
                              + (f" and {len(extra) - 8} more" if len(extra) > 8 else ""))
    for k, v in expected.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise CheckpointError(f"{where}: {k!r} has shape {tuple(state[k].shape)}, the model "
                                  f"needs {tuple(v.shape)}")
    model.load_state_dict(state, strict=True)


# ---- weight layouts ---------------------------------------------------------------------------

def _cube_root(volume: int) -> int:
    k = round(volume ** (1 / 3))
    if k**3 != volume:
        raise ValueError(f"kernel volume {volume} is not a cube")
    return k


def weight_from_torchsparse(w: torch.Tensor) -> torch.Tensor:
    """torchsparse Conv3d `kernel` -> ours [K^3, Cin, Cout].

    [Cin, Cout] (1x1, stride 1) -> [1, Cin, Cout]. [K^3, Cin, Cout] with odd K: torchsparse
    enumerates offsets with x fastest, k_ts = c*K*K + b*K + a for position (a, b, c) on (x, y, z),
    so the kernel axis is read as (c, b, a) and reversed. Even K (the stride-2 down / up convs):
    torchsparse enumerates z fastest, as we do, and the kernel is unchanged."""
    if w.dim() == 2:
        return w.contiguous().view(1, *w.shape).clone()
    if w.dim() != 3:
        raise ValueError(f"expected a torchsparse kernel [K^3, Cin, Cout] or [Cin, Cout], "
                         f"got {tuple(w.shape)}")
    volume, cin, cout = w.shape
    k = _cube_root(volume)
    if k % 2 == 0:
        return w.contiguous().clone()
    return w.reshape(k, k, k, cin, cout).permute(2, 1, 0, 3, 4).reshape(volume, cin, cout) \
        .contiguous()


def weight_to_torchsparse(w: torch.Tensor) -> torch.Tensor:
    """ours [K^3, Cin, Cout] -> torchsparse `kernel`; inverse of weight_from_torchsparse."""
    if w.dim() != 3:
        raise ValueError(f"expected our weight [K^3, Cin, Cout], got {tuple(w.shape)}")
    volume, cin, cout = w.shape
    k = _cube_root(volume)
    if k == 1:
        return w.contiguous().view(cin, cout).clone()
    if k % 2 == 0:
        return w.contiguous().clone()
    # the reversal of three axes is its own inverse
    return w.reshape(k, k, k, cin, cout).permute(2, 1, 0, 3, 4).reshape(volume, cin, cout) \
        .contiguous()


def _spconv_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    volume, cin, cout = shape
    k = _cube_root(volume)
    return (cout, k, k, k, cin)


def _torchsparse_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    volume, cin, cout = shape
    return (cin, cout) if volume == 1 else tuple(shape)


@dataclasses.dataclass(frozen=True)
class _Codec:
    conv_param: str                                    # "weight" (spconv) or "kernel"
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
    return {"net.0": f"{base}.conv1", "net.1": f"{base}.bn1", "net.3": f"{base}.conv2",
            "net.4": f"{base}.bn2", "shortcut.0": f"{base}.downsample.0",
            "shortcut.1": f"{base}.downsample.1"}


def _block_ref_torchsparse(base: str) -> dict[str, str]:
    return {"net.0": f"{base}.net.0", "net.1": f"{base}.net.1", "net.3": f"{base}.net.3",
            "net.4": f"{base}.net.4", "shortcut.0": f"{base}.downsample.0",
            "shortcut.1": f"{base}.downsample.1"}


def _names_mmdet3d(site, layer: str, block_ref: Callable[[str], dict[str, str]]) -> dict[str, str]:
    """mmdet3d's MinkUNet naming; its spconv and torchsparse backends differ only in where a
    conv/BN pair lives inside its module (`layer`: ".{0,1}" or ".net.{0,1}") and in the blocks."""
    kind = site[0]
    roots = {"stem": "backbone.conv_input.{}", "down": "backbone.encoder.{}.0",
             "up": "backbone.decoder.{}.0"}
    if kind in roots:
        root = roots[kind].format(site[1])
        return {str(k): f"{root}{layer}.{k}" for k in (0, 1)}
    if kind == "block":
        _, part, i, j, _ = site
        base = (f"backbone.encoder.{i}.{j + 1}" if part == "enc"
                else f"backbone.decoder.{i}.1.{j}")
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
    ours: str                    # our state_dict key
    ref: str                     # the reference key
    shape: tuple[int, ...]       # our shape
    conv: bool                   # a sparse conv weight (layout conversion applies)


def _sites(config: MinkUNetConfig) -> Iterator[tuple[str, tuple, dict[str, str]]]:
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
            yield from _block(f"decoder.{i}.blocks.{j}", ("dec", i, j),
                              cout + skip if j == 0 else cout, cout)
    yield "head", ("head",), {"": ("linear", cs[8], config.num_classes)}


def _block(prefix: str, where: tuple, cin: int, cout: int):
    layers = {"net.0": ("conv", 3, cin, cout), "net.1": ("bn", cout),
              "net.3": ("conv", 3, cout, cout), "net.4": ("bn", cout)}
    if cin != cout:
        layers.update({"shortcut.0": ("conv", 1, cin, cout), "shortcut.1": ("bn", cout)})
    yield prefix, ("block", *where, cin != cout), layers


def _entries(layout: str, config: MinkUNetConfig) -> tuple[_Codec, list[_Entry], tuple[str, ...]]:
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
                out.append(_Entry(f"{ours}.weight", f"{ref}.{codec.conv_param}",
                                  (k**3, cin, cout), True))
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
    _, entries, _ = _entries(layout, config)
    return {e.ours: e.ref for e in entries}


def unwrap_state_dict(obj: Any) -> dict[str, torch.Tensor]:
    """The state dict inside a reference checkpoint: obj["state_dict"] (mmdet3d / mmengine),
    obj["model"] (SPVNAS) or obj itself, with a DataParallel "module." prefix removed."""
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model"):
            if key in obj and isinstance(obj[key], Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"no state dict found in a {type(obj).__name__}")
    sd = dict(obj)
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def import_state_dict(sd: Mapping[str, torch.Tensor], layout: str, config: MinkUNetConfig,
                      strict: bool = True) -> dict[str, torch.Tensor]:
    """A reference state dict (`layout`, see the module docstring) -> our MinkUNet state_dict.

    MissingKeyError (a KeyError) names the missing reference key and our key it feeds; a wrong
    shape is a CheckpointError (ValueError) naming both; reference keys that map to nothing are
    an error listing them unless strict=False (keys the layout knows to be unused, such as
    SPVNAS's point_transforms, are always dropped). A missing BN num_batches_tracked (older
    checkpoints) becomes 0. spconv-pointcept is a CheckpointError (POINTCEPT_MISMATCH):
    it is not a MinkUNet; models.pointcept.import_pointcept imports it into a SpUNet."""
    codec, entries, ignored = _entries(layout, config)
    out: dict[str, torch.Tensor] = {}
    missing = []
    for e in entries:
        if e.ref not in sd:
            if e.ours.endswith("num_batches_tracked"):
                out[e.ours] = torch.tensor(0, dtype=torch.long)
                continue
            missing.append(e)
            continue
        v = sd[e.ref]
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"{layout}: {e.ref!r} is a {type(v).__name__}, not a tensor")
        want = codec.ref_shape(e.shape) if e.conv else e.shape
        if tuple(v.shape) != tuple(want):
            raise CheckpointError(
                f"{layout}: wrong shape for key {e.ref!r} (for our {e.ours!r}): got "
                f"{tuple(v.shape)}, expected {tuple(want)} for this config")
        v = v.detach()
        out[e.ours] = codec.to_ours(v) if e.conv else v.clone()
    if missing:
        first = missing[0]
        more = f" (and {len(missing) - 1} more: {[m.ref for m in missing[1:6]]}" \
               f"{' ...' if len(missing) > 6 else ''})" if len(missing) > 1 else ""
        raise MissingKeyError(f"{layout}: missing key {first.ref!r} for {first.ours!r}{more}")
    if strict:
        used = {e.ref for e in entries}
        extra = sorted(k for k in sd if k not in used and not k.startswith(ignored))
        if extra:
            raise CheckpointError(
                f"{layout}: {len(extra)} unexpected keys {extra[:10]}"
                f"{' ...' if len(extra) > 10 else ''} (wrong layout or config? pass strict=False "
                "to ignore them)")
    return out


def export_state_dict(our_sd: Mapping[str, torch.Tensor], layout: str,
                      config: MinkUNetConfig) -> dict[str, torch.Tensor]:
    """Our state_dict -> the reference layout's names and layouts (inverse of import_state_dict).
    SPVNAS's unused point_transforms are not produced."""
    codec, entries, _ = _entries(layout, config)
    out = {}
    for e in entries:
        if e.ours not in our_sd:
            raise MissingKeyError(f"our state_dict misses {e.ours!r} (needed for {e.ref!r})")
        v = our_sd[e.ours].detach()
        if tuple(v.shape) != tuple(e.shape):
            raise CheckpointError(f"our {e.ours!r} has shape {tuple(v.shape)}, the config "
                                  f"needs {tuple(e.shape)}")
        out[e.ref] = codec.from_ours(v) if e.conv else v.clone()
    return out


def import_model(sd: Mapping[str, torch.Tensor], layout: str, config: MinkUNetConfig,
                 strict: bool = True) -> MinkUNet:
    """A MinkUNet (eval mode) holding an imported reference state dict."""
    model = MinkUNet(config=config)
    _load_exact(model, import_state_dict(unwrap_state_dict(sd), layout, config, strict),
                f"import from {layout}")
    return model.eval()


__all__ = [
    "CONFIG_FIELDS", "CheckpointError", "FORMAT", "INPUT_FEATURES", "INTENSITY_NORMALISATION",
    "LAYOUTS", "META_KEYS", "MissingKeyError", "POINTCEPT_MISMATCH", "SEMANTIC_KITTI_CLASSES",
    "SEMANTIC_KITTI_COLORS", "VERSION", "check_meta", "config_from_dict", "config_to_dict",
    "export_state_dict", "import_model", "import_state_dict", "key_map", "load_checkpoint",
    "make_meta", "save_checkpoint", "unwrap_state_dict", "weight_from_torchsparse",
    "weight_to_torchsparse",
]
