"""The shipped models (models/weights): `default` (fine-tuned on real scans) and `synthetic`:
size, names, licences, and the metrics recorded when they were shipped."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from app.inference.builder import build_pipeline, load_model
from app.codecs.files import read_frame
from app.inference.pipeline import SegmentationPipeline
from app.inference.scoring import iou_metrics, read_labels
from app.service.config import Settings
from models.weights import DEFAULT_WEIGHTS, MODEL_CARD, WEIGHTS, metrics_path, resolve_weights
from tests.conftest import last_json_line, require_real_data, run_app
from train.evaluate import FIXED_FRAME_SEED, fixed_frame_miou
from train.state import REAL_LICENCE, SYNTHETIC_LICENCE


def recorded(name: str) -> dict:
    return json.loads(metrics_path(WEIGHTS[name]).read_text())


def pipeline_for(name: str) -> SegmentationPipeline:
    return build_pipeline(name, "cpu")


def test_weights_files_small_and_card_present():
    for path in WEIGHTS.values():
        assert path.is_file() and path.stat().st_size <= 12 * 1024 * 1024, path
    card = MODEL_CARD.read_text()
    for needle in (
        "Training data",
        "Recipe",
        "Classes",
        "held-out",
        "SemanticKITTI",
        "CC BY-NC-SA 4.0",
        "non-commercial",
        "synthetic",
    ):
        assert needle in card, needle


def test_names_licences_and_default_everywhere():
    assert Settings().weights == "default"
    assert resolve_weights(None) == resolve_weights("default") == DEFAULT_WEIGHTS
    assert DEFAULT_WEIGHTS.name == "minkunet_real.pt"
    assert resolve_weights("synthetic").name == "minkunet_synth.pt"
    assert resolve_weights("random") is None
    _, meta = load_model(None)
    assert meta["name"] == DEFAULT_WEIGHTS.stem and meta["version"].startswith("real-")
    assert meta["licence"] == REAL_LICENCE and "SemanticKITTI" in meta["training_data"]
    for frame in ("seq00_000000", "spvnas_000000"):  # validation frames: never trained on
        assert frame not in meta["training_data"].split("model selection on")[0]
    _, synth = load_model("synthetic")
    assert synth["version"].startswith("synth-") and synth["licence"] == SYNTHETIC_LICENCE
    with pytest.raises(FileNotFoundError, match="no/such.pt"):
        resolve_weights("no/such.pt")


@pytest.mark.parametrize("name", ["default", "synthetic"])
def test_shipped_weights_reproduce_recorded_validation_miou(name):
    """Both shipped models load, label every point of the real validation frame seq00_000000,
    and reproduce the mIoU recorded when they were shipped, within 0.01."""
    d = require_real_data() / "semantickitti"
    points, sensor = read_frame(str(d / "seq00_000000.bin"), "kitti")
    gt = read_labels(d / "seq00_000000.label")
    labels = pipeline_for(name).segment(points, sensor).labels
    assert labels.shape == (len(points),) and int(labels.max()) < 19
    result = iou_metrics(gt, labels, load_model(name)[1]["class_names"])
    expected = recorded(name)["real_semantickitti"]["seq00_000000.bin"]
    print(f"{name}: seq00_000000 mIoU {result['miou']:.4f}, recorded {expected['miou']:.4f}")
    assert abs(result["miou"] - expected["miou"]) <= 0.01
    assert set(result["per_class_iou"]) == set(expected["per_class_iou"])


def test_synthetic_weights_reproduce_recorded_synthetic_miou():
    """One fixed held-out synthetic frame (seed FIXED_FRAME_SEED), within 0.01."""
    expected = recorded("synthetic")["fixed_frame"]
    assert expected["seed"] == FIXED_FRAME_SEED
    miou = fixed_frame_miou(pipeline_for("synthetic"), load_model("synthetic")[1]["class_names"])
    assert abs(miou - expected["miou"]) <= 0.01


def test_cli_evaluate_defaults_to_the_default_model():
    """`python -m app evaluate` without --weights scores the default model."""
    d = require_real_data() / "semantickitti"
    out = run_app(
        "evaluate",
        str(d / "spvnas_000000.bin"),
        str(d / "spvnas_000000.label"),
        "--device",
        "cpu",
        timeout=600,
    )
    result = last_json_line(out.stdout)
    assert (
        abs(result["miou"] - recorded("default")["real_semantickitti"]["spvnas_000000.bin"]["miou"])
        <= 0.01
    )


def test_v1_model_shows_licence_and_training_data():
    from fastapi.testclient import TestClient

    from app.service.main import create_app

    app = create_app(Settings(weights="default", device="cpu"))
    with TestClient(app, raise_server_exceptions=False) as client:
        end = time.monotonic() + 300
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < end, "app not ready within 300 s"
            time.sleep(0.1)
        m = client.get("/v1/model").json()
    assert m["name"] == "minkunet_real" and m["licence"] == REAL_LICENCE
    assert "non-commercial" in m["licence"] and "SemanticKITTI" in m["training_data"]
    assert np.isclose(m["voxel_size"], 0.1)
