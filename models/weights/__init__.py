"""The shipped default model: MinkUNet trained on synthetic scans (see MODEL_CARD.md here).

A weights argument anywhere in lidarseg (CLI --weights, LIDARSEG_WEIGHTS) is one of
  * "default": this directory's checkpoint, DEFAULT_WEIGHTS;
  * "random":  a fixed-seed random MinkUNet (tests, benchmarks; channel ratio from --cr);
  * a path to a lidarseg checkpoint (models/checkpoints.py).
"""
from __future__ import annotations

from pathlib import Path

DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "minkunet_synth.pt"
MODEL_CARD = Path(__file__).resolve().parent / "MODEL_CARD.md"
RANDOM = "random"
DEFAULT = "default"


def resolve_weights(weights: str | Path | None) -> Path | None:
    """The checkpoint path a weights argument names, or None for the random model.
    None means "default". Raises FileNotFoundError (with the path) if the file is missing."""
    if weights is None or str(weights) == DEFAULT:
        path = DEFAULT_WEIGHTS
    elif str(weights) == RANDOM:
        return None
    else:
        path = Path(weights)
    if not path.is_file():
        hint = " (the shipped default model is missing from this checkout)" \
            if path == DEFAULT_WEIGHTS else ""
        raise FileNotFoundError(f"weights file not found: {path}{hint}")
    return path
