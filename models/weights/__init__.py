"""The shipped models (see MODEL_CARD.md here): one table of names -> checkpoint files.

A weights argument anywhere in lidarseg (CLI --weights, LIDARSEG_WEIGHTS) is one of
  * a name in WEIGHTS: "default" (fine-tuned on real SemanticKITTI scans: non-commercial use
    only, CC BY-NC-SA 4.0) or "synthetic" (trained on synthetic scans only; no third-party data);
  * "random":  a fixed-seed random MinkUNet (tests, benchmarks; channel ratio from --cr);
  * a path to a lidarseg checkpoint (models/checkpoints.py).
Each checkpoint's meta carries its `licence` and `training_data` (shown by /v1/model).
"""
from __future__ import annotations

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


def resolve_weights(weights: str | Path | None) -> Path | None:
    """The checkpoint path a weights argument names, or None for the random model.
    None means "default". Raises FileNotFoundError (with the path) if the file is missing."""
    name = DEFAULT if weights is None else str(weights)
    if name == RANDOM:
        return None
    path = WEIGHTS.get(name, Path(name))
    if not path.is_file():
        hint = f" (the shipped {name!r} model is missing from this checkout)" \
            if name in WEIGHTS else ""
        raise FileNotFoundError(f"weights file not found: {path}{hint}")
    return path
