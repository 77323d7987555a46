"""The one way to a ready pipeline: a weights argument and a device in, a SegmentationPipeline out.

    pipeline = build_pipeline("default", "cpu")     # or "synthetic", "random", a checkpoint
    pipeline.meta["class_names"], pipeline.voxel_config.voxel_size, ...   # path, "LAYOUT:PATH"

Every field of the checkpoint's meta is honoured: voxel size, input features and per-sensor
intensity normalisation go into the VoxelizeConfig, class names and colours, name and version
stay on `pipeline.meta`. The service, every CLI command, training evaluation and every benchmark
build their pipelines here, so a checkpoint is served and scored the same way everywhere.
"""

from __future__ import annotations

from pathlib import Path

import torch

from models.checkpoint_errors import CheckpointError
from models.checkpoint_meta import INPUT_FEATURES, check_meta, intensity_scales, make_meta
from models.checkpoints import load_checkpoint
from models.importers import load_reference
from models.minkunet import MinkUNet
from models.weights import parse_weights

from app.inference.pipeline import SegmentationPipeline
from app.inference.voxel_config import VoxelizeConfig


def load_model(weights: str | Path | None = "default", cr: float = 1.0) -> tuple[MinkUNet, dict]:
    """(model in eval mode, meta): the checkpoint's checked meta plus "name" and "version".
    weights: see models/weights ("default", "synthetic", "random" with channel ratio `cr`,
    a lidarseg checkpoint path, or "LAYOUT:PATH" for a reference checkpoint to import)."""
    source = parse_weights(weights)
    if source.kind == "random":
        torch.manual_seed(0)
        model = MinkUNet(cr=cr)
        meta = {
            **make_meta(version="seed0", training_data="none"),
            "name": f"minkunet-random-cr{cr:g}",
            "licence": "no trained weights (random initialisation)",
        }
        return model.eval(), meta
    assert source.path is not None
    if source.kind == "reference":
        assert source.layout is not None
        model = load_reference(source.path, source.layout)
        features = INPUT_FEATURES[: model.config.in_channels]
        meta = check_meta(
            make_meta(
                input_features=features,
                version=f"imported-{source.layout}",
                training_data=f"imported from {source.path.name}",
            ),
            model.config.num_classes,
            model.config.in_channels,
        )
    else:
        model, meta = load_checkpoint(source.path)
    meta = dict(meta, name=source.path.stem)
    meta["version"] = str(meta.get("version") or "unversioned")
    return model, meta


def voxel_config(meta: dict) -> VoxelizeConfig:
    """The voxelizer a checkpoint's meta asks for: voxel size, input features, intensity scale
    per sensor."""
    try:
        scales = intensity_scales(meta["intensity_normalisation"])
        return VoxelizeConfig(
            voxel_size=float(meta["voxel_size"]),
            features=tuple(meta["input_features"]),
            intensity_scale=tuple(sorted(scales.items())),
        )
    except ValueError as e:
        raise CheckpointError(f"model {meta.get('name')!r}: {e}") from e


def build_pipeline(
    weights: str | Path | None = "default",
    device: str | torch.device = "cpu",
    cr: float = 1.0,
    dtype: torch.dtype | None = None,
    **pipeline_options,
) -> SegmentationPipeline:
    """A SegmentationPipeline for `weights` on `device` (the model cast to `dtype` if given),
    its meta on `pipeline.meta`. pipeline_options go to SegmentationPipeline (precision, engine)."""
    model, meta = load_model(weights, cr)
    if dtype is not None:
        model = model.to(dtype)
    return pipeline_for(model, meta, device, **pipeline_options)


def pipeline_for(
    model: MinkUNet, meta: dict, device: str | torch.device = "cpu", **pipeline_options
) -> SegmentationPipeline:
    """A SegmentationPipeline for a model in hand (e.g. one being trained) and the meta its
    checkpoint would carry (models.checkpoint_meta.make_meta)."""
    meta = check_meta(meta, model.config.num_classes, model.config.in_channels)
    return SegmentationPipeline(model, voxel_config(meta), device, meta=meta, **pipeline_options)
