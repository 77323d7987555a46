"""Checkpoints in our own format: save and load (the meta a served model carries is made and
checked in models/checkpoint_meta.py).

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

A file or state dict that is not what it claims to be is a CheckpointError
(models/checkpoint_errors.py). Reference state dicts (mmdetection3d, SPVNAS) are imported by
models/importers.py, Pointcept SpUNet by models/pointcept.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from .checkpoint_errors import CheckpointError, MissingKeyError
from .checkpoint_meta import check_meta
from .minkunet import MinkUNet, MinkUNetConfig

FORMAT = "lidarseg-checkpoint"
VERSION = 1
ARCH = "MinkUNet"
CONFIG_FIELDS = (
    "in_channels",
    "num_classes",
    "cr",
    "encoder_blocks",
    "decoder_blocks",
    "bn_eps",
    "bn_momentum",
)


def config_to_dict(config: MinkUNetConfig) -> dict:
    d: dict[str, Any] = {"arch": ARCH}
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
    meta = check_meta(meta, config.num_classes, config.in_channels)
    state = {}
    for k, v in model.state_dict().items():
        v = v.detach().to("cpu")
        if half and v.is_floating_point():
            v = v.to(torch.float16)
        state[k] = v.clone().contiguous()
    torch.save(
        {
            "format": FORMAT,
            "version": VERSION,
            "dtype": "float16" if half else "float32",
            "model": config_to_dict(config),
            "state_dict": state,
            "meta": meta,
        },
        str(Path(path)),
    )


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
        raise CheckpointError(
            f"{path}: not a lidarseg checkpoint (format {found!r}, expected "
            f"{FORMAT!r}); reference state dicts go through import_state_dict"
        )
    version = ckpt.get("version")
    if version != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {version!r} is not supported "
            f"(this code reads version {VERSION})"
        )
    for key in ("model", "state_dict", "meta"):
        if key not in ckpt:
            raise CheckpointError(f"{path}: checkpoint lacks {key!r}")
    config = config_from_dict(ckpt["model"])
    meta = check_meta(ckpt["meta"], config.num_classes, config.in_channels)
    state = {
        k: (v.to(torch.float32) if v.is_floating_point() else v)
        for k, v in ckpt["state_dict"].items()
    }
    model = MinkUNet(config=config)
    load_state_exact(model, state, str(path))
    return model.to(device).eval(), meta


def load_state_exact(model: torch.nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    if missing:
        raise MissingKeyError(
            f"{where}: state_dict misses {missing[:8]}"
            + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        )
    if extra:
        raise CheckpointError(
            f"{where}: state_dict has unexpected keys {extra[:8]}"
            + (f" and {len(extra) - 8} more" if len(extra) > 8 else "")
        )
    for k, v in expected.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise CheckpointError(
                f"{where}: {k!r} has shape {tuple(state[k].shape)}, the model "
                f"needs {tuple(v.shape)}"
            )
        if state[k].is_floating_point() and not bool(torch.isfinite(state[k]).all()):
            # NaN or inf weights load and serve labels wrong for a third of the points
            raise CheckpointError(f"{where}: {k!r} holds NaN or infinite values")
    model.load_state_dict(state, strict=True)


__all__ = [
    "CONFIG_FIELDS",
    "FORMAT",
    "VERSION",
    "config_from_dict",
    "config_to_dict",
    "load_checkpoint",
    "load_state_exact",
    "save_checkpoint",
]
