"""The meta a served model carries in our checkpoint format (the dict's layout:
models/checkpoints.py): its keys and their defaults (make_meta), their checks (check_meta), and
the per-sensor intensity factors of a meta's normalisation rules (intensity_scales).

check_meta refuses a meta whose `input_features` count differs from the first conv's in_channels,
and an intensity normalisation it cannot honour (see intensity_scales); the label space (class
names, colours, ignore id) lives in models/labels.py.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from .checkpoint_errors import CheckpointError
from .labels import SEMANTIC_KITTI_CLASSES, SEMANTIC_KITTI_COLORS

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


__all__ = [
    "INPUT_FEATURES",
    "INTENSITY_NORMALISATION",
    "META_KEYS",
    "check_meta",
    "intensity_scales",
    "make_meta",
]
