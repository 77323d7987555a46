"""What the test_codecs_* files share: the real frames by name, one frame read in place (skipping
without the real data), and the DecodeError a body must raise."""

from __future__ import annotations

import numpy as np
import pytest

from app.codecs import DecodeError, decode
from tests.conftest import FRAMES, load_frame, require_real_data

NAMES = [name for name, _ in FRAMES]
SMALL = "semantickitti/seq00_000000_subset50.bin"


def real_frame(name: str) -> np.ndarray:
    require_real_data()
    return load_frame(name)


def decode_error(
    body: bytes, fmt: str | None = None, content_type: str | None = None, **kw
) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode(body, fmt, content_type, **kw)
    return info.value
