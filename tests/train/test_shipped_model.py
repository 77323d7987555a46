"""The shipped default model (models/weights): size, default everywhere, recorded metrics."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.cli import load_model, load_model_meta
from app.service.config import Settings
from app.inference.pipeline import SegmentationPipeline
from app.inference.voxelize import VoxelizeConfig
from models.weights import DEFAULT_WEIGHTS, MODEL_CARD, resolve_weights
from tests.conftest import REPO_ROOT, require_real_data
from train.evaluate import FIXED_FRAME_SEED, fixed_frame_miou

METRICS = DEFAULT_WEIGHTS.with_suffix(".metrics.json")


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(METRICS.read_text())


def test_weights_file_small_and_card_present():
    assert DEFAULT_WEIGHTS.is_file() and DEFAULT_WEIGHTS.stat().st_size <= 12 * 1024 * 1024
    card = MODEL_CARD.read_text()
    for needle in ("Training data", "Recipe", "Classes", "held-out", "SemanticKITTI"):
        assert needle in card, needle


def test_default_is_the_shipped_model_everywhere():
    assert Settings().weights == "default"
    assert resolve_weights(None) == resolve_weights("default") == DEFAULT_WEIGHTS
    assert resolve_weights("random") is None
    _, meta = load_model_meta(None, 1.0)
    assert meta["name"] == DEFAULT_WEIGHTS.stem and meta["version"].startswith("synth-")
    with pytest.raises(FileNotFoundError, match="no/such.pt"):
        resolve_weights("no/such.pt")


def test_shipped_weights_reproduce_recorded_synthetic_miou(recorded):
    """One fixed held-out synthetic frame (seed FIXED_FRAME_SEED): the mIoU written to the
    metrics file when the model was shipped, within 0.01."""
    assert recorded["fixed_frame"]["seed"] == FIXED_FRAME_SEED
    model, names, voxel = load_model("default", 1.0)
    pipeline = SegmentationPipeline(model, VoxelizeConfig(voxel_size=voxel), "cpu")
    miou = fixed_frame_miou(pipeline, names)
    print(f"fixed frame {FIXED_FRAME_SEED}: mIoU {miou:.4f}, recorded "
          f"{recorded['fixed_frame']['miou']:.4f}")
    assert abs(miou - recorded["fixed_frame"]["miou"]) <= 0.01


def test_cli_evaluate_defaults_to_shipped_model_on_real_frame(recorded):
    """`python -m app evaluate` without --weights scores the shipped model; on the real KITTI
    frame it reproduces the model card's figure."""
    d = require_real_data() / "semantickitti"
    frame, labels = d / "seq00_000000.bin", d / "seq00_000000.label"
    out = subprocess.run([sys.executable, "-m", "app", "evaluate", str(frame), str(labels),
                          "--device", "cpu"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    expected = recorded["real_semantickitti"]["seq00_000000.bin"]
    assert abs(result["miou"] - expected["miou"]) <= 0.01
    assert set(result["per_class_iou"]) == set(expected["per_class_iou"])
