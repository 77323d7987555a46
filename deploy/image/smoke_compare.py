"""POSTs a real frame to a running lidarseg container and checks its labels equal the in-process
pipeline's on this machine (same shipped weights), and that it voxelizes with Open3D (the same
voxels come from the torch.unique fallback, only slower). Used by deploy/image/smoke.sh.

    python deploy/image/smoke_compare.py URL FRAME
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    url, frame = sys.argv[1:3]
    body = Path(frame).read_bytes()
    t0 = time.monotonic()
    r = httpx.post(
        f"{url}/v1/segment?format=kitti",
        content=body,
        timeout=600,
        headers={"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"},
    )
    if r.status_code != 200:
        print(f"POST /v1/segment: {r.status_code} {r.text[:500]}")
        return 1
    served = np.frombuffer(r.content, dtype=np.uint8)
    print(f"container: {len(served)} labels in {time.monotonic() - t0:.1f} s")
    engine = httpx.get(f"{url}/v1/model", timeout=60).json()["engine"]
    print(f"container engine: {engine}")
    if engine.get("voxelizer") != "open3d":  # the image lacked a library Open3D loads
        print("the container does not voxelize with Open3D (its log says why)")
        return 1

    from app.codecs.files import read_frame
    from app.inference.builder import build_pipeline

    points, sensor = read_frame(frame, "kitti")
    local = build_pipeline("default", "cpu").segment(points, sensor).labels
    same = int((local == served).sum()) if len(local) == len(served) else -1
    print(f"in-process: {len(local)} labels; equal: {same} of {len(local)}")
    return 0 if same == len(local) else 1


if __name__ == "__main__":
    sys.exit(main())
