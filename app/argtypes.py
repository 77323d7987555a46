"""argparse types of the command lines (app, train, synth, bench): a bad count is argparse's
one-line error (exit status 2), not a traceback or a silent clamp further in."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer of at least 1 (counts, steps, runs, batch sizes)."""
    return _at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An integer of at least 0 (seeds, 'every K steps' where 0 means never)."""
    return _at_least(text, 0)


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value}: at least {low}")
    return value
