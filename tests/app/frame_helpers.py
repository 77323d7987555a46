"""What the app tests share about real frames: the real frames in shared/data/real and their
reading with each sensor's intensity convention (from test_precision.py), and the KITTI frame
(test_pipeline.py)."""

import numpy as np
import pytest

from app.codecs.files import read_frame
from tests.conftest import REAL_DATA, require_real_data


def real_frames() -> list[str]:
    """Every point-cloud frame in shared/data/real (relative paths; pcap captures excluded)."""
    if not REAL_DATA.is_dir():
        return []
    return sorted(str(p.relative_to(REAL_DATA)) for p in REAL_DATA.rglob("*.bin"))


def read(rel: str) -> tuple[np.ndarray, str]:
    path = require_real_data() / rel
    fields = 5 if rel.endswith(".pcd.bin") else 4
    points = np.fromfile(path, dtype=np.float32).reshape(-1, fields)
    # each frame with its sensor's intensity convention (Ouster's 0..255 read as KITTI's 0..1
    # would feed the network intensities 255x out of its range)
    sensor = rel.split("/")[0]
    return points, sensor if sensor in ("nuscenes", "ouster") else "kitti"


def kitti_frame():
    path = REAL_DATA / "semantickitti" / "seq00_000000.bin"
    if not path.exists():
        pytest.skip(f"real frame missing: {path}")
    return read_frame(path)[0]
