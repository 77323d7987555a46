"""Importers for reference MinkUNet state dicts (mmdetection3d, SPVNAS) into our MinkUNet.

    import_state_dict / export_state_dict   a reference state dict <-> our MinkUNet state_dict
    import_model / load_reference           a MinkUNet from a reference state dict / file
    infer_config                            the MinkUNetConfig a reference state dict was built with
    unwrap_state_dict                       the state dict inside a reference checkpoint object

The layouts ("spconv-mmdet3d", "torchsparse-mmdet3d", "torchsparse-spvnas"; LAYOUTS), their
parameter names and conv weight layouts are tabled in models/reference_layouts.py (key_map shows
them). "spconv-pointcept" is refused here (POINTCEPT_MISMATCH): Pointcept SpUNet-v1m1 is not a
MinkUNet; models.pointcept imports it into our SpUNet.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .checkpoint_errors import CheckpointError, MissingKeyError
from .checkpoints import load_state_exact
from .minkunet import BASE_CHANNELS, MinkUNet, MinkUNetConfig
from .reference_layouts import LAYOUTS, POINTCEPT_MISMATCH, key_map, layout_entries

_MAX_BLOCKS = 16  # infer_config counts up to this many residual blocks per stage


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
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    return sd


def import_state_dict(
    sd: Mapping[str, torch.Tensor], layout: str, config: MinkUNetConfig, strict: bool = True
) -> dict[str, torch.Tensor]:
    """A reference state dict (`layout`: models/reference_layouts.py) -> our MinkUNet state_dict.

    MissingKeyError (a KeyError) names the missing reference key and our key it feeds; a wrong
    shape is a CheckpointError (ValueError) naming both; reference keys that map to nothing are
    an error listing them unless strict=False (keys the layout knows to be unused, such as
    SPVNAS's point_transforms, are always dropped). A missing BN num_batches_tracked (older
    checkpoints) becomes 0. spconv-pointcept is a CheckpointError (POINTCEPT_MISMATCH):
    it is not a MinkUNet; models.pointcept.import_pointcept imports it into a SpUNet."""
    codec, entries, ignored = layout_entries(layout, config)
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
                f"{tuple(v.shape)}, expected {tuple(want)} for this config"
            )
        v = v.detach()
        out[e.ours] = codec.to_ours(v) if e.conv else v.clone()
    if missing:
        first = missing[0]
        more = (
            f" (and {len(missing) - 1} more: {[m.ref for m in missing[1:6]]}"
            f"{' ...' if len(missing) > 6 else ''})"
            if len(missing) > 1
            else ""
        )
        raise MissingKeyError(f"{layout}: missing key {first.ref!r} for {first.ours!r}{more}")
    if strict:
        used = {e.ref for e in entries}
        extra = sorted(k for k in sd if k not in used and not k.startswith(ignored))
        if extra:
            raise CheckpointError(
                f"{layout}: {len(extra)} unexpected keys {extra[:10]}"
                f"{' ...' if len(extra) > 10 else ''} (wrong layout or config? pass strict=False "
                "to ignore them)"
            )
    return out


def export_state_dict(
    our_sd: Mapping[str, torch.Tensor], layout: str, config: MinkUNetConfig
) -> dict[str, torch.Tensor]:
    """Our state_dict -> the reference layout's names and layouts (inverse of import_state_dict).
    SPVNAS's unused point_transforms are not produced."""
    codec, entries, _ = layout_entries(layout, config)
    out = {}
    for e in entries:
        if e.ours not in our_sd:
            raise MissingKeyError(f"our state_dict misses {e.ours!r} (needed for {e.ref!r})")
        v = our_sd[e.ours].detach()
        if tuple(v.shape) != tuple(e.shape):
            raise CheckpointError(
                f"our {e.ours!r} has shape {tuple(v.shape)}, the config needs {tuple(e.shape)}"
            )
        out[e.ref] = codec.from_ours(v) if e.conv else v.clone()
    return out


def import_model(
    sd: Mapping[str, torch.Tensor], layout: str, config: MinkUNetConfig, strict: bool = True
) -> MinkUNet:
    """A MinkUNet (eval mode) holding an imported reference state dict."""
    model = MinkUNet(config=config)
    load_state_exact(
        model,
        import_state_dict(unwrap_state_dict(sd), layout, config, strict),
        f"import from {layout}",
    )
    return model.eval()


def infer_config(sd: Mapping[str, torch.Tensor], layout: str) -> MinkUNetConfig:
    """The MinkUNetConfig a reference state dict was built with, read from its shapes: input
    channels (first stem conv), classes and channel ratio (head), blocks per stage (the keys
    present). BN eps and momentum are not stored; they keep our defaults."""
    codec, probe, _ = layout_entries(
        layout, MinkUNetConfig(encoder_blocks=(_MAX_BLOCKS,) * 4, decoder_blocks=(_MAX_BLOCKS,) * 4)
    )
    names = {e.ours: e.ref for e in probe}
    for ours in ("head.weight", "stem.0.0.weight"):
        if names[ours] not in sd:
            raise MissingKeyError(
                f"{layout}: missing key {names[ours]!r} (needed to infer the network's shape)"
            )
    num_classes, last = sd[names["head.weight"]].shape
    in_channels = codec.to_ours(sd[names["stem.0.0.weight"]]).shape[1]

    def blocks(part: str) -> tuple[int, ...]:
        return tuple(
            sum(names[f"{part}.{i}.blocks.{j}.net.0.weight"] in sd for j in range(_MAX_BLOCKS))
            for i in range(4)
        )

    return MinkUNetConfig(
        in_channels=int(in_channels),
        num_classes=int(num_classes),
        cr=last / BASE_CHANNELS[-1],
        encoder_blocks=blocks("encoder"),
        decoder_blocks=blocks("decoder"),
    )


def load_reference(path, layout: str) -> MinkUNet:
    """A MinkUNet (eval mode) from a reference checkpoint file of `layout`, its config inferred
    from the shapes (infer_config)."""
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # pickle / zip errors, or objects weights_only refuses to build
        raise CheckpointError(
            f"{path}: not a state dict torch.load(weights_only=True) can read ({e})"
        ) from e
    sd = unwrap_state_dict(obj)
    return import_model(sd, layout, infer_config(sd, layout))


__all__ = [
    "LAYOUTS",
    "POINTCEPT_MISMATCH",
    "export_state_dict",
    "import_model",
    "import_state_dict",
    "infer_config",
    "key_map",
    "load_reference",
    "unwrap_state_dict",
]
