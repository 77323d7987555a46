"""Our network and its spconv twin on the same frame and the same voxels."""

from __future__ import annotations

import time

import numpy as np
import torch

from models.minkunet import MinkUNet

from app.inference.cleaning import clean_frame
from app.inference.pipeline import SegmentationPipeline
from app.inference.voxelize import devoxelize, voxelize


def spconv_twin_of(model: MinkUNet):
    """An spconv copy of `model` with the same weights (eval mode, same device)."""
    from models.spconv_twin import SpconvMinkUNet, ours_to_spconv_state_dict

    twin = SpconvMinkUNet(model.config)
    twin.load_state_dict(ours_to_spconv_state_dict(model.state_dict()))
    return twin.to(next(model.parameters()).device).eval()


def crosscheck(pipeline: SegmentationPipeline, points: np.ndarray, sensor: str = "kitti") -> dict:
    """One dict: label agreement, logit errors, sizes, and the stage timing of both networks, on
    the pipeline's voxels (its voxel config, from the checkpoint: app/inference/builder.py).
    spconv builds its maps inside its forward, so its 'network' includes map building."""
    from models.spconv_twin import run_spconv

    config = pipeline.voxel_config
    twin = spconv_twin_of(pipeline.model)
    # cleaned once, as the pipeline cleans a frame: both networks see the same values
    points = clean_frame(np.ascontiguousarray(points, np.float32), config, sensor)[0]
    warm = points[: min(len(points), 5000)]
    pipeline.segment(warm, sensor)
    ours = pipeline.segment(points, sensor, keep_logits=True)

    sync = (lambda: torch.cuda.synchronize()) if pipeline.device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    batch = voxelize([points], config, sensor, pipeline.device)
    t1 = time.perf_counter()
    with torch.no_grad():
        warm_batch = voxelize([warm], config, sensor, pipeline.device)
        run_spconv(twin, warm_batch.feats, warm_batch.coords)  # warm-up
        sync()
        t2 = time.perf_counter()
        logits = run_spconv(twin, batch.feats, batch.coords)
        sync()
        t3 = time.perf_counter()
    labels = devoxelize(
        logits.argmax(dim=1) if len(logits) else torch.zeros(0, dtype=torch.long),
        batch.point_to_voxel[0],
    )
    t4 = time.perf_counter()
    if ours.voxel_logits is None:  # keep_logits=True keeps them
        raise RuntimeError("the pipeline returned no voxel logits")
    diff = (ours.voxel_logits - logits).abs()
    scale = logits.abs().max().clamp_min(1e-12)
    return {
        "label_agreement": float((labels == ours.labels).mean()) if len(labels) else 1.0,
        "max_abs_logit_error": float(diff.max()) if diff.numel() else 0.0,
        "max_rel_logit_error": float(diff.max() / scale) if diff.numel() else 0.0,
        "num_points": int(len(points)),
        "num_voxels": int(ours.num_voxels),
        "timing_ms": {
            "ours": {k: round(v, 3) for k, v in ours.timing_ms.items()},
            "spconv": {
                "voxelize": round((t1 - t0) * 1e3, 3),
                "maps+network": round((t3 - t2) * 1e3, 3),
                "devoxelize": round((t4 - t3) * 1e3, 3),
            },
        },
        "spconv_threads": 1 if pipeline.device.type == "cpu" else None,
        "precision": pipeline.precision,
    }
