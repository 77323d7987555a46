"""The errors of checkpoints and state dicts, ours (models/checkpoints.py, its meta:
models/checkpoint_meta.py) and the reference layouts' (models/importers.py, models/pointcept.py,
models/reference_layouts.py)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A file or state dict that is not what it claims to be (format, version, shapes, keys)."""


class MissingKeyError(KeyError):
    """A reference state dict lacks a key our model needs (the message names both)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


__all__ = ["CheckpointError", "MissingKeyError"]
