"""Decoders at their exact bounds: the shortest well-formed ASCII PCD, one with too few values,
and KITTI intensities saturating at exactly 1.0. (From a hand-made mutation audit, 2026-12-06.)"""

from __future__ import annotations

import numpy as np
import pytest

from app.codecs import pcd
from app.codecs.base import DecodeError, sensor_for


_PCD_HEAD = (
    b"VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\n"
    b"WIDTH %d\nHEIGHT 1\nPOINTS %d\nDATA ascii\n"
)


def test_ascii_pcd_of_one_digit_values_without_a_final_newline():
    """base.py text_columns: n values fit in 2n - 1 bytes ("1 2 3"); the truncation pre-check
    must not refuse the shortest well-formed data."""
    frame = pcd.decode(_PCD_HEAD % (1, 1) + b"1 2 3")
    assert frame.points.tolist() == [[1.0, 2.0, 3.0]]


def test_ascii_pcd_with_fewer_values_than_points_is_refused():
    """base.py text_columns: 400 when the data holds fewer values than POINTS x fields, even when
    its bytes could have held them (long tokens); never a frame with uninitialised rows."""
    rows = b"\n".join(b"1.00000000000 2.00000000000 3.00000000000" for _ in range(4)) + b"\n"
    assert len(pcd.decode(_PCD_HEAD % (4, 4) + rows).points) == 4
    with pytest.raises(DecodeError) as e:
        pcd.decode(_PCD_HEAD % (5, 5) + rows)  # 12 values for 5 points x 3
    assert (e.value.status, e.value.code) == (400, "malformed_body")


def test_a_kitti_frame_with_saturated_intensities_stays_kitti():
    """base.py sensor_for: the 0..255 scale is told by values above 1.0; a 0..1 frame where many
    returns saturate at exactly 1.0 is still 0..1 (else its intensities are divided by 255)."""
    points = np.zeros((100, 4), np.float32)
    points[:, 3] = 0.5
    points[:50, 3] = 1.0
    assert sensor_for(points) == "kitti"
    points[:2, 3] = 2.0  # 2 % above 1.0: the 0..255 scale
    assert sensor_for(points) == "ouster"
