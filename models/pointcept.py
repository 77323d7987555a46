"""Import and export Pointcept SpUNet-v1m1 state dicts ("spconv-pointcept") for models/spunet.py.

Our SpUNet has Pointcept's module tree (pointcept/models/sparse_unet/spconv_unet_v1m1_base.py),
so the keys are the same, one for one:
    conv_input.0.weight, conv_input.1.*                     stem SubM k5, BN
    down.{s}.0.weight, down.{s}.1.*                         SparseConv3d k2 s2, BN
    enc.{s}.block{i}.conv1.weight / bn1.* / conv2.weight / bn2.*
    up.{s}.0.weight, up.{s}.1.*                             SparseInverseConv3d k2, BN
    dec.{s}.block{i}.conv1 ... and dec.{s}.block0.proj.0.weight / proj.1.*   (1x1 SubM, BN)
    final.weight, final.bias                                SubM k1 with bias
(BN * = weight, bias, running_mean, running_var, num_batches_tracked). Only the conv weights
differ: Pointcept's are spconv 2.x [Cout, K, K, K, Cin] (KRSC), ours [K^3, Cin, Cout], converted
by weight_from_spconv / weight_to_spconv (models/spconv_compat.py). For the 1x1 convs (proj.0,
final) spconv multiplies by its buffer read raw as [Cin, Cout]; the conversion follows that.

A Pointcept checkpoint file ({"state_dict": ...} from its CheckpointSaver, the model wrapped in
DefaultSegmentor as `backbone`, often in DDP as `module.`) is unwrapped here: the "state_dict"
entry, then the "module." and "backbone." prefixes. spconv's optional
`max_num_voxels_during_training` buffers carry no weights and are dropped.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from .checkpoint_errors import CheckpointError, MissingKeyError
from .importers import unwrap_state_dict
from .spconv_compat import weight_from_spconv, weight_to_spconv
from .spunet import SpUNet, SpUNetConfig

LAYOUT = "spconv-pointcept"
_DROPPED = "max_num_voxels_during_training"


def pointcept_state_dict(obj: Any) -> dict[str, torch.Tensor]:
    """The SpUNet state dict inside a Pointcept checkpoint (or a state dict itself)."""
    sd = unwrap_state_dict(obj)
    if any(k.startswith("backbone.") for k in sd):  # DefaultSegmentor(backbone=SpUNet)
        sd = {k[len("backbone.") :] if k.startswith("backbone.") else k: v for k, v in sd.items()}
    return sd


def _get(sd: Mapping[str, torch.Tensor], key: str, why: str) -> torch.Tensor:
    if key not in sd:
        raise MissingKeyError(f"{LAYOUT}: missing key {key!r} (needed to infer {why})")
    return sd[key]


def _count_blocks(sd: Mapping[str, torch.Tensor], part: str, s: int) -> int:
    pattern = re.compile(rf"{part}\.{s}\.block(\d+)\.conv1\.weight")
    found = {int(m.group(1)) for k in sd if (m := pattern.fullmatch(k))}
    if not found:
        raise MissingKeyError(
            f"{LAYOUT}: missing key '{part}.{s}.block0.conv1.weight' (stage {s} has no blocks)"
        )
    return max(found) + 1


def infer_config(obj: Any) -> SpUNetConfig:
    """The SpUNetConfig a Pointcept state dict was built with, from its shapes (BN eps and
    momentum are not stored: Pointcept's 1e-3 / 0.01 are assumed)."""
    sd = pointcept_state_dict(obj)
    stem = _get(sd, "conv_input.0.weight", "in_channels and base_channels")
    stages = len({k.split(".")[1] for k in sd if re.fullmatch(r"down\.\d+\.0\.weight", k)})
    if stages == 0:
        raise MissingKeyError(f"{LAYOUT}: missing key 'down.0.0.weight' (no encoder stage)")
    n = 2 * stages
    channels, layers = [0] * n, [0] * n
    for s in range(stages):
        channels[s] = int(_get(sd, f"down.{s}.0.weight", f"channels[{s}]").shape[0])
        channels[n - s - 1] = int(_get(sd, f"up.{s}.0.weight", f"channels[{n - s - 1}]").shape[0])
        layers[s] = _count_blocks(sd, "enc", s)
        layers[n - s - 1] = _count_blocks(sd, "dec", s)
    final = _get(sd, "final.weight", "num_classes")
    if stem.dim() != 5 or final.dim() != 5:
        raise CheckpointError(
            f"{LAYOUT}: conv weights must be spconv [Cout, K, K, K, Cin]; "
            f"'conv_input.0.weight' is {tuple(stem.shape)}, 'final.weight' "
            f"{tuple(final.shape)}"
        )
    try:
        return SpUNetConfig(
            in_channels=int(stem.shape[4]),
            num_classes=int(final.shape[0]),
            base_channels=int(stem.shape[0]),
            channels=tuple(channels),
            layers=tuple(layers),
        )
    except ValueError as e:
        raise CheckpointError(f"{LAYOUT}: inferred an invalid config: {e}") from e


def _expected(config: SpUNetConfig) -> dict[str, tuple[int, ...]]:
    """Our state-dict key -> our shape, without allocating weights."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in SpUNet(config).state_dict().items()}


def _spconv_shape(ours: tuple[int, ...]) -> tuple[int, ...]:
    volume, cin, cout = ours
    k = round(volume ** (1 / 3))
    return (cout, k, k, k, cin)


def import_pointcept(
    obj: Any, config: SpUNetConfig | None = None, strict: bool = True
) -> dict[str, torch.Tensor]:
    """A Pointcept SpUNet-v1m1 state dict (or checkpoint) -> our SpUNet state dict.

    config: None infers it from the shapes (infer_config). A missing key is a MissingKeyError
    (a KeyError) naming it; a wrong shape a CheckpointError (a ValueError) naming the key and
    both shapes; keys that map to nothing are a CheckpointError listing them unless
    strict=False. A missing BN num_batches_tracked becomes 0."""
    sd = pointcept_state_dict(obj)
    config = config or infer_config(sd)
    out: dict[str, torch.Tensor] = {}
    missing = []
    for key, shape in _expected(config).items():
        if key not in sd:
            if key.endswith("num_batches_tracked"):
                out[key] = torch.tensor(0, dtype=torch.long)
            else:
                missing.append(key)
            continue
        v = sd[key]
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"{LAYOUT}: {key!r} is a {type(v).__name__}, not a tensor")
        conv = len(shape) == 3
        want = _spconv_shape(shape) if conv else shape
        if tuple(v.shape) != want:
            raise CheckpointError(
                f"{LAYOUT}: wrong shape for key {key!r}: got {tuple(v.shape)}, "
                f"expected {want} for {config}"
            )
        v = v.detach()
        out[key] = weight_from_spconv(v) if conv else v.clone()
    if missing:
        more = f" (and {len(missing) - 1} more: {missing[1:6]})" if len(missing) > 1 else ""
        raise MissingKeyError(f"{LAYOUT}: missing key {missing[0]!r}{more}")
    extra = sorted(k for k in sd if k not in out and not k.endswith(_DROPPED))
    if strict and extra:
        raise CheckpointError(
            f"{LAYOUT}: {len(extra)} unexpected keys {extra[:10]}"
            f"{' ...' if len(extra) > 10 else ''} (another network or config? "
            "strict=False ignores them)"
        )
    return out


def load_pointcept(obj: Any, config: SpUNetConfig | None = None, strict: bool = True) -> SpUNet:
    """A SpUNet (eval mode) holding an imported Pointcept state dict or checkpoint."""
    sd = pointcept_state_dict(obj)
    config = config or infer_config(sd)
    model = SpUNet(config)
    model.load_state_dict(import_pointcept(sd, config, strict), strict=True)
    return model.eval()


def export_pointcept(model: SpUNet, prefix: str = "") -> dict[str, torch.Tensor]:
    """Our SpUNet -> a Pointcept state dict (prefix="backbone." for a DefaultSegmentor one);
    import_pointcept inverts it exactly."""
    out = {}
    for key, v in model.state_dict().items():
        v = v.detach()
        out[prefix + key] = weight_to_spconv(v) if v.dim() == 3 else v.clone()
    return out


__all__ = [
    "LAYOUT",
    "export_pointcept",
    "import_pointcept",
    "infer_config",
    "load_pointcept",
    "pointcept_state_dict",
]
