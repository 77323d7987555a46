"""The shipped models (see MODEL_CARD.md here): one table of names -> checkpoint files.

A weights argument anywhere in lidarseg (CLI --weights, LIDARSEG_WEIGHTS, benchmarks) is one of
  * a name in WEIGHTS: "default" (fine-tuned on real SemanticKITTI scans: non-commercial use
    only, CC BY-NC-SA 4.0) or "synthetic" (trained on synthetic scans only; no third-party data);
  * "random":  a fixed-seed random MinkUNet (tests, benchmarks; channel ratio from --cr);
  * a path to a lidarseg checkpoint (models/checkpoints.py);
  * "LAYOUT:PATH", a reference checkpoint imported on load (LAYOUT one of the MinkUNet layouts
    of models/importers.py, e.g. "torchsparse-spvnas:/models/spvnas.pt").
Each checkpoint's meta carries its `licence` and `training_data` (shown by /v1/model).
app/inference/builder.py turns a weights argument into a ready pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
WEIGHTS = {
    "default": HERE / "minkunet_real.pt",
    "synthetic": HERE / "minkunet_synth.pt",
}
DEFAULT = "default"
DEFAULT_WEIGHTS = WEIGHTS[DEFAULT]
MODEL_CARD = HERE / "MODEL_CARD.md"
RANDOM = "random"


@dataclass(frozen=True)
class WeightsSource:
    """What a weights argument names: kind "random", "checkpoint" (our format) or "reference"
    (imported with `layout`); `path` for the last two."""

    kind: str
    path: Path | None = None
    layout: str | None = None


def parse_weights(weights: str | Path | None) -> WeightsSource:
    """A weights argument (see the module docstring) as a WeightsSource; None means "default".
    FileNotFoundError (with the path) if the file is missing."""
    name = DEFAULT if weights is None else str(weights)
    if name == RANDOM:
        return WeightsSource("random")
    layout = None
    if name in WEIGHTS:
        path = WEIGHTS[name]
    else:
        head, sep, tail = name.partition(":")
        if sep and head and "/" not in head and not Path(name).exists():
            layout, name = head, tail
        path = Path(name)
    if not path.is_file():
        hint = (
            f" (the shipped {name!r} model is missing from this checkout)"
            if name in WEIGHTS
            else ""
        )
        raise FileNotFoundError(f"weights file not found: {path}{hint}")
    return WeightsSource("reference" if layout else "checkpoint", path, layout)


def metrics_path(weights_path: str | Path) -> Path:
    """Where a weights file's recorded metrics live: beside it, NAME.metrics.json
    (`python -m train.evaluate --json`, as for the shipped files)."""
    return Path(weights_path).with_suffix(".metrics.json")


def resolve_weights(weights: str | Path | None) -> Path | None:
    """The checkpoint path a weights argument names, or None for the random model.
    None means "default". Raises FileNotFoundError (with the path) if the file is missing."""
    source = parse_weights(weights)
    if source.kind == "reference":
        raise ValueError(f"{weights!r} is a reference checkpoint to import, not ours")
    return source.path
