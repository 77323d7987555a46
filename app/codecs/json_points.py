"""JSON: {"points": [[x, y, z, intensity, ...], ...]} or the bare list [[x, y, z, ...], ...].

Every row needs the same number (3 or more) of numbers in JSON's syntax (no `+1`, `.5`, `01`,
`nan` or `1_0`, which Python's float() would take); NaN / Infinity / -Infinity literals are
accepted, and so are integers of any size (read as floats: one of over 308 digits is infinite,
whichever shape the body has). Non-numeric values
(strings, null, booleans, nested lists where a number belongs...) are a syntax error for this
format (400); a well-formed list of the wrong shape is 422.

Bodies in exactly these two shapes (the usual case) are read without building Python objects:
the bracket-and-comma skeleton is checked, then the numbers parsed a chunk at a time (bounded
memory, the GIL released between chunks). Other JSON (extra keys, or a malformed body) goes to
the json module, up to SLOW_PATH_BYTES; beyond that such a body is refused (400).
"""

from __future__ import annotations

import codecs
import json
import re
import sys

import numpy as np

from app.codecs.base import (
    DecodeError,
    Frame,
    check_count,
    malformed,
    sensor_for,
    text_columns,
    unusable,
)

FMT = "json"
CONTENT_TYPE = "application/json"
SLOW_PATH_BYTES = 1 << 20
MAX_VALUES_PER_POINT = 64  # x, y, z, intensity and more: a row of a million values is no point
_CHUNK = 1 << 18
_OBJECT = re.compile(rb'\s*\{\s*"points"\s*:\s*(?=\[)')
_WHITESPACE = b" \t\r\n"
_LEAD = re.compile(rb"[ \t\r\n]*")
_TO_SPACE = bytes.maketrans(b"[],", b"   ")
_NOT_SKELETON = bytes(sorted(set(range(256)) - set(b"[],")))
_EMPTY_SLOT = (b"[,", b",,", b",]", b"[]")
# Separators and whole values (a value ends at a separator), never backtracking into one: with
# the possessive repeats Python's re has from 3.11; on 3.10 (JetPack 6's Python) with each step
# made atomic by a lookahead and a back-reference instead (the same matches, about 2x slower:
# 4.1 against 1.9 ms a 256 KiB chunk on the Zen 4, 2026-12-06).
_NUMBER = rb"-?+(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][+-]?+[0-9]++)?+|NaN|-?+Infinity"
_PLAIN_NUMBER = re.sub(rb"(?<=[?*+])\+", b"", _NUMBER)  # its possessive marks dropped
_NUMBERS_ATOMIC = re.compile(rb"(?:(?=([\[\],]+|(?:" + _PLAIN_NUMBER + rb")(?=[\],])))\1)*")
_NUMBERS_POSSESSIVE = rb"(?:[\[\],]|(?:" + _NUMBER + rb")(?=[\],]))*+"  # Python >= 3.11 only
_NUMBERS = re.compile(_NUMBERS_POSSESSIVE) if sys.version_info >= (3, 11) else _NUMBERS_ATOMIC


def decode(body: bytes, max_points: int | None = None) -> Frame:
    if isinstance(body, str):
        body = body.encode()
    body = body.removeprefix(codecs.BOM_UTF8)
    frame = _fast(body, max_points)
    if frame is not None:
        return frame
    if len(body) > SLOW_PATH_BYTES:
        raise malformed(
            FMT,
            f"a body over {SLOW_PATH_BYTES} bytes must be exactly "
            '[[x, y, z, ...], ...] or {"points": [[x, y, z, ...], ...]} with '
            "rows of equal length",
        )
    return _slow(body, max_points)


def _array_span(body: bytes) -> tuple[int, int] | None:
    """(start, end) of the points array when the body is the bare array or {"points": array}."""
    end = len(body.rstrip(_WHITESPACE))
    m = _OBJECT.match(body)
    if m:
        return (m.end(), end - 1) if body[end - 1 : end] == b"}" else None
    lead = _LEAD.match(body)  # always matches (possibly the empty string)
    start = lead.end() if lead else 0
    return (start, end) if body[start : start + 1] == b"[" else None


def _compact(body: bytes, start: int, end: int) -> bytes:
    """body[start:end] without whitespace, a chunk at a time."""
    return b"".join(
        body[k : min(k + _CHUNK, end)].translate(None, _WHITESPACE)
        for k in range(start, end, _CHUNK)
    )


def _fast(body: bytes, max_points: int | None) -> Frame | None:
    """The frame of a canonical body, or None when the body is not in a canonical shape."""
    span = _array_span(body)
    if span is None:
        return None
    if max_points is not None and body.count(b"[", *span) - 1 > max_points:  # a '[' a row
        raise DecodeError(413, "too_many_points", f"{FMT}: more than {max_points} rows (the limit)")
    text = _compact(body, *span)
    skeleton = b"".join(
        text[k : k + _CHUNK].translate(None, _NOT_SKELETON) for k in range(0, len(text), _CHUNK)
    )
    if skeleton == b"[]" and text == b"[]":
        return Frame(np.zeros((0, 3), np.float32), "kitti", FMT)
    width = skeleton.find(b"]") - 1  # "[[" + (width - 1) commas + "]"
    if not skeleton.startswith(b"[[") or width < 1:
        return None
    if width > MAX_VALUES_PER_POINT:
        raise unusable(FMT, f"points have {width} values; at most {MAX_VALUES_PER_POINT}")
    row = b"[" + b"," * (width - 1) + b"]"
    rows = (len(skeleton) - 1) // (len(row) + 1)
    if skeleton != b"[" + (row + b",") * (rows - 1) + row + b"]":
        return None
    check_count(rows, max_points, FMT)
    for k in range(0, len(text), _CHUNK):  # overlapping by one byte: no slot is missed
        part = text[k : k + _CHUNK + 1]
        if any(e in part for e in _EMPTY_SLOT):
            return None
    if width < 3:
        raise unusable(FMT, f"points have {width} values; need at least x, y, z")
    _check_numbers(text)
    # the values parsed from the body as sent, not the compacted text: whitespace inside a
    # value ("1 000", "- 1") makes two tokens there, and so a 400, where compacted it read as one
    start, end = span
    spaced = b"".join(
        body[k : min(k + _CHUNK, end)].translate(_TO_SPACE) for k in range(start, end, _CHUNK)
    )
    try:
        cols = text_columns(spaced, rows, width, list(range(width)), FMT)
    except DecodeError:  # every compacted value is a JSON number: one was split by whitespace
        raise malformed(FMT, "whitespace inside a value (as in '1 000' or '- 1')") from None
    points = np.stack(cols, axis=1) if cols else np.zeros((rows, width), np.float32)
    return Frame(points, sensor_for(points), FMT)


def _check_numbers(text: bytes) -> None:
    """400 naming the first value of the compacted array text that is no JSON number. Checked a
    chunk at a time, each ending after a comma, so that no match holds the GIL for long."""
    start = 0
    while start < len(text):
        end = len(text)
        if end - start > _CHUNK:
            end = text.rfind(b",", start, start + _CHUNK) + 1
            if end <= start:  # a value longer than a chunk
                end = text.find(b",", start + _CHUNK) + 1 or len(text)
        part = text[start:end]
        valid = _NUMBERS.match(part)  # always matches (possibly the empty string)
        at = valid.end() if valid else 0
        if at != len(part):
            token = re.split(rb"[\[\],]", part[at : at + 40])[0]
            raise malformed(FMT, f"not a JSON number: {token[:20]!r}")
        start = end


def _slow(body: bytes, max_points: int | None) -> Frame:
    try:
        doc = json.loads(body, parse_int=float)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise malformed(FMT, f"invalid JSON: {e}") from None
    if isinstance(doc, dict):
        if "points" not in doc:
            raise unusable(FMT, "object has no 'points' key")
        doc = doc["points"]
    if not isinstance(doc, list):
        raise unusable(
            FMT, f"points must be a list of [x, y, z, ...] rows, got {type(doc).__name__}"
        )
    check_count(len(doc), max_points, FMT)
    if not doc:
        return Frame(np.zeros((0, 3), np.float32), "kitti", FMT)
    if not all(isinstance(row, list) for row in doc):
        raise unusable(FMT, "every point must be a list [x, y, z, ...]")
    width = len(doc[0])
    if any(len(row) != width for row in doc):
        raise unusable(FMT, "points have different numbers of values")
    if width > MAX_VALUES_PER_POINT:
        raise unusable(FMT, f"points have {width} values; at most {MAX_VALUES_PER_POINT}")
    if width < 3:
        raise unusable(FMT, f"points have {width} values; need at least x, y, z")
    bad = next(
        (v for row in doc for v in row if isinstance(v, bool) or not isinstance(v, (int, float))),
        (),
    )
    if bad != ():
        raise malformed(FMT, f"non-numeric value in points: {bad!r}")
    try:
        points = np.array(doc, dtype=np.float64).astype(np.float32)
    except OverflowError:
        raise malformed(FMT, "a number in points is too large for a float") from None
    return Frame(points, sensor_for(points), FMT)


def encode(points: np.ndarray, wrap: bool = True) -> tuple[bytes, str]:
    """{"points": [...]} (or the bare list with wrap=False); float32 values written so that
    they read back exactly."""
    rows = np.asarray(points, dtype=np.float32).astype(np.float64).tolist()
    body = json.dumps({"points": rows} if wrap else rows, allow_nan=True, separators=(",", ":"))
    return body.encode(), CONTENT_TYPE
