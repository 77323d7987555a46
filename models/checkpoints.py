"""Checkpoints in our own format: save, load, and the meta a served model carries.

One `torch.save`d dict (loadable with `torch.load(..., weights_only=True)`):
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

check_meta refuses a meta whose `input_features` count differs from the first conv's in_channels,
and an intensity normalisation it cannot honour (see intensity_scales). Reference state dicts
(mmdetection3d, SPVNAS) are imported by models/importers.py, Pointcept SpUNet by
models/pointcept.py; the label space (class names, colours, ignore id) lives in models/labels.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import torch

from .labels import SEMANTIC_KITTI_CLASSES, SEMANTIC_KITTI_COLORS
from .minkunet import MinkUNet, MinkUNetConfig

FORMAT = "lidarseg-checkpoint"
VERSION = 1
ARCH = "MinkUNet"

INPUT_FEATURES: tuple[str, ...] = ("x", "y", "z", "intensity")
# SemanticKITTI's common 5 cm: a meta's and the voxelizer's default, what an imported reference
# checkpoint and the random model run at (the shipped models say 0.1 in their meta)
DEFAULT_VOXEL_SIZE = 0.05
INTENSITY_NORMALISATION: dict[str, str] = {
    "kitti": "0-1",
    "nuscenes": "0-255 -> /255",
    "ouster": "0-255 -> /255",
}
META_KEYS = (
    "class_names",
    "class_colors",
    "voxel_size",
    "input_features",
    "intensity_normalisation",
    "training_data",
    "version",
)
CONFIG_FIELDS = (
    "in_channels",
    "num_classes",
    "cr",
    "encoder_blocks",
    "decoder_blocks",
    "bn_eps",
    "bn_momentum",
)


# ---- errors ----------------------------------------------------------------------------------


class CheckpointError(ValueError):
    """A file or state dict that is not what it claims to be (format, version, shapes, keys)."""


class MissingKeyError(KeyError):
    """A reference state dict lacks a key our model needs (the message names both)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


# ---- our checkpoint format --------------------------------------------------------------------


def make_meta(
    class_names=SEMANTIC_KITTI_CLASSES,
    class_colors=SEMANTIC_KITTI_COLORS,
    *,
    voxel_size: float = DEFAULT_VOXEL_SIZE,
    input_features=INPUT_FEATURES,
    intensity_normalisation: Mapping[str, str] | None = None,
    training_data: str = "",
    version: str = "",
) -> dict:
    """A complete meta dict (defaults: SemanticKITTI classes and colours, 5 cm voxels)."""
    return {
        "class_names": [str(n) for n in class_names],
        "class_colors": [[int(v) for v in c] for c in class_colors],
        "voxel_size": float(voxel_size),
        "input_features": [str(f) for f in input_features],
        "intensity_normalisation": dict(
            INTENSITY_NORMALISATION if intensity_normalisation is None else intensity_normalisation
        ),
        "training_data": str(training_data),
        "version": str(version),
    }


def check_meta(meta: Mapping[str, Any], num_classes: int, in_channels: int | None = None) -> dict:
    """meta normalised to plain Python types; CheckpointError naming the first bad field. With
    `in_channels` (the first conv's), the number of input features must equal it."""
    if not isinstance(meta, Mapping):
        raise CheckpointError(f"meta must be a dict, got {type(meta).__name__}")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise CheckpointError(
            f"meta lacks {missing} (required: {list(META_KEYS)}; make_meta() fills the defaults)"
        )
    names, colors = list(meta["class_names"]), [list(c) for c in meta["class_colors"]]
    if len(names) != num_classes or not all(isinstance(n, str) for n in names):
        raise CheckpointError(
            f"meta['class_names'] must be {num_classes} strings (num_classes), got {len(names)}"
        )
    if len(colors) != num_classes or any(
        len(c) != 3 or not all(isinstance(v, int) and 0 <= v <= 255 for v in c) for c in colors
    ):
        raise CheckpointError(
            f"meta['class_colors'] must be {num_classes} [r, g, b] triples of ints in 0..255"
        )
    voxel_size = meta["voxel_size"]
    if not isinstance(voxel_size, (int, float)) or not voxel_size > 0:
        raise CheckpointError(f"meta['voxel_size'] must be a positive number, got {voxel_size!r}")
    features = list(meta["input_features"])
    if not all(isinstance(f, str) for f in features):
        raise CheckpointError("meta['input_features'] must be a list of strings")
    if in_channels is not None and len(features) != in_channels:
        raise CheckpointError(
            f"meta['input_features'] has {len(features)} features {features} but the first "
            f"conv's in_channels is {in_channels}: the network would read the wrong columns"
        )
    norm = meta["intensity_normalisation"]
    if not isinstance(norm, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in norm.items()
    ):
        raise CheckpointError("meta['intensity_normalisation'] must map str -> str")
    intensity_scales(norm)  # refuses a rule the pipeline could not honour
    for key in ("training_data", "version"):
        if not isinstance(meta[key], str):
            raise CheckpointError(f"meta[{key!r}] must be a string")
    out = dict(meta)
    out.update(
        class_names=names,
        class_colors=[[int(v) for v in c] for c in colors],
        voxel_size=float(voxel_size),
        input_features=features,
        intensity_normalisation=dict(norm),
    )
    return out


_SCALE_RULE = re.compile(r"^\s*0\s*-\s*(?P<top>[0-9.]+)\s*(->\s*/\s*(?P<div>[0-9.]+))?\s*$")


def intensity_scales(norm: Mapping[str, str]) -> dict[str, float]:
    """{sensor: factor} from meta["intensity_normalisation"]: "0-1" (used as is) -> 1.0,
    "0-255 -> /255" (divided by 255) -> 1/255. CheckpointError for any other rule."""
    out = {}
    for sensor, rule in norm.items():
        m = _SCALE_RULE.match(rule)
        if m is None or (m["div"] is not None and not float(m["div"]) > 0):
            raise CheckpointError(
                f"meta['intensity_normalisation'][{sensor!r}] = {rule!r}: "
                "expected '0-1' or '0-<max> -> /<divisor>'"
            )
        out[sensor] = 1.0 / float(m["div"]) if m["div"] is not None else 1.0
    return out


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
    "CheckpointError",
    "FORMAT",
    "INPUT_FEATURES",
    "INTENSITY_NORMALISATION",
    "META_KEYS",
    "MissingKeyError",
    "VERSION",
    "check_meta",
    "config_from_dict",
    "config_to_dict",
    "intensity_scales",
    "load_checkpoint",
    "load_state_exact",
    "make_meta",
    "save_checkpoint",
]
