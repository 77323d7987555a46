"""One builder for every entry point: a checkpoint with 3 input features (x, y, z) and 8 cm
voxels is served and scored the same way by the service, `segment`, `crosscheck`, `evaluate`,
train.evaluate and the benchmarks; check_meta refuses features that do not fit the network."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from app import cli
from app.inference.builder import build_pipeline, load_model
from app.inference.pipeline import SegmentationPipeline
from app.inference.scoring import iou_metrics, read_labels
from app.inference.voxel_config import VoxelizeConfig
from app.service.config import Settings
from app.service.main import create_app
from models.checkpoint_errors import CheckpointError
from models.checkpoint_meta import make_meta
from models.checkpoints import save_checkpoint
from models.labels import SEMANTIC_KITTI_CLASSES, class_counts
from models.minkunet import MinkUNet
from tests.conftest import randomize_batchnorm, require_real_data

VOXEL = 0.08
FEATURES = ("x", "y", "z")


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    """(bin path, label path, points): every 6th point of the labelled KITTI frame (about 20k
    points, the whole scene), written as a KITTI .bin / .label pair."""
    d = require_real_data() / "semantickitti"
    points = np.fromfile(d / "seq00_000000.bin", np.float32).reshape(-1, 4)[::6].copy()
    raw = np.fromfile(d / "seq00_000000.label", np.uint32)[::6].copy()
    out = tmp_path_factory.mktemp("frame")
    points.tofile(out / "seq00_sparse.bin")
    raw.tofile(out / "seq00_sparse.label")
    return out / "seq00_sparse.bin", out / "seq00_sparse.label", points


@pytest.fixture(scope="module")
def xyz_checkpoint(tmp_path_factory):
    torch.manual_seed(3)
    model = randomize_batchnorm(MinkUNet(in_channels=3, cr=0.25), 5).eval()
    path = tmp_path_factory.mktemp("ckpt") / "xyz_minkunet.pt"
    save_checkpoint(
        path, model, make_meta(voxel_size=VOXEL, input_features=FEATURES, version="xyz-test")
    )
    return path, model


@pytest.fixture(scope="module")
def expected(xyz_checkpoint, frame):
    """The oracle: the model run on voxels configured by hand from what the test wrote."""
    _, model = xyz_checkpoint
    pipeline = SegmentationPipeline(model, VoxelizeConfig(voxel_size=VOXEL, features=FEATURES))
    return pipeline.segment(frame[2], "kitti")


def test_check_meta_refuses_features_that_do_not_fit_the_first_conv(tmp_path):
    model = MinkUNet(in_channels=3, cr=0.25)
    with pytest.raises(CheckpointError, match=r"has 4 features .* in_channels is 3"):
        save_checkpoint(tmp_path / "bad.pt", model, make_meta())
    with pytest.raises(CheckpointError, match="intensity_normalisation"):
        save_checkpoint(
            tmp_path / "bad.pt",
            model,
            make_meta(input_features=FEATURES, intensity_normalisation={"kitti": "log scale"}),
        )


def test_builder_honours_the_meta(xyz_checkpoint, frame, expected):
    path, _ = xyz_checkpoint
    pipeline = build_pipeline(str(path), "cpu")
    assert pipeline.voxel_config.voxel_size == VOXEL
    assert pipeline.voxel_config.features == FEATURES
    assert pipeline.meta["version"] == "xyz-test" and pipeline.meta["name"] == "xyz_minkunet"
    assert list(pipeline.meta["class_names"]) == list(SEMANTIC_KITTI_CLASSES)
    result = pipeline.segment(frame[2], "kitti")
    assert result.num_voxels == expected.num_voxels
    np.testing.assert_array_equal(result.labels, expected.labels)
    # the oracle can tell: the default voxel size gives other voxels
    _, model = xyz_checkpoint
    other = SegmentationPipeline(model, VoxelizeConfig(features=FEATURES)).segment(frame[2])
    assert other.num_voxels != expected.num_voxels


def test_intensity_normalisation_is_honoured(tmp_path, frame):
    torch.manual_seed(0)
    model = MinkUNet(cr=0.25).eval()
    path = tmp_path / "scaled.pt"
    save_checkpoint(path, model, make_meta(intensity_normalisation={"kitti": "0-2 -> /2"}))
    got = build_pipeline(str(path)).segment(frame[2], "kitti")
    assert build_pipeline(str(path)).voxel_config.intensity_scale == (("kitti", 0.5),)
    halved = frame[2].copy()
    halved[:, 3] /= 2
    want = SegmentationPipeline(model).segment(halved, "kitti")
    np.testing.assert_array_equal(got.labels, want.labels)


def test_service_serves_the_same_labels(xyz_checkpoint, frame, expected):
    app = create_app(Settings(weights=str(xyz_checkpoint[0]), device="cpu", log_level="warning"))
    with TestClient(app) as http:
        end = time.monotonic() + 120
        while http.get("/readyz").status_code != 200:
            assert time.monotonic() < end, http.get("/readyz").json()
            time.sleep(0.05)
        info = http.get("/v1/model").json()
        assert info["voxel_size"] == VOXEL and info["input_features"] == list(FEATURES)
        r = http.post(
            "/v1/segment?format=kitti",
            content=frame[2].tobytes(),
            headers={"Accept": "application/octet-stream"},
        )
        assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.frombuffer(r.content, np.uint8), expected.labels)


def test_segment_and_evaluate_commands(xyz_checkpoint, frame, expected, capsys):
    path, (bin_path, label_path, _) = xyz_checkpoint[0], frame
    assert cli.main(["segment", str(bin_path), "--weights", str(path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"{expected.num_voxels} voxels" in out
    printed = {
        line.split()[0]: int(line.split()[1]) for line in out.splitlines() if line.startswith("  ")
    }
    assert printed == class_counts(expected.labels, SEMANTIC_KITTI_CLASSES)
    assert (
        cli.main(
            ["evaluate", str(bin_path), str(label_path), "--weights", str(path), "--device", "cpu"]
        )
        == 0
    )
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    want = iou_metrics(read_labels(label_path), expected.labels, list(SEMANTIC_KITTI_CLASSES))
    assert scored == want


def test_crosscheck_command(xyz_checkpoint, frame, expected, capsys):
    pytest.importorskip("spconv.pytorch")
    assert (
        cli.main(
            ["crosscheck", str(frame[0]), "--weights", str(xyz_checkpoint[0]), "--device", "cpu"]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["num_voxels"] == expected.num_voxels
    assert report["label_agreement"] >= 0.9999


def test_train_evaluate_scores_the_same_labels(xyz_checkpoint, frame, expected, tmp_path):
    from train import evaluate as train_evaluate

    from train.real import VALIDATION_FRAMES

    real = tmp_path / "real"  # the validation frames by name: here, the sparse frame each time
    real.mkdir()
    for name in VALIDATION_FRAMES:
        (real / f"{name}.bin").symlink_to(frame[0])
        (real / f"{name}.label").symlink_to(frame[1])
    # a folder of one's own: its roles.json names the frames' roles (train/real.py)
    (real / "roles.json").write_text(json.dumps(dict.fromkeys(VALIDATION_FRAMES, "validation")))
    out = tmp_path / "eval.json"
    assert (
        train_evaluate.main(
            [
                "--weights",
                str(xyz_checkpoint[0]),
                "--frames",
                "1",
                "--real-dir",
                str(real),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["voxel_size"] == VOXEL
    want = iou_metrics(read_labels(frame[1]), expected.labels, list(SEMANTIC_KITTI_CLASSES))
    for name in VALIDATION_FRAMES:
        scored = result["real_semantickitti"][f"{name}.bin"]
        assert {k: scored[k] for k in want} == want


def test_benchmarks_build_through_the_builder(xyz_checkpoint, frame, expected, tmp_path):
    from bench import minkunet as bench_minkunet

    out = tmp_path / "bench.json"
    assert (
        bench_minkunet.main(
            [
                "--weights",
                str(xyz_checkpoint[0]),
                "--frames",
                str(frame[0]),
                "--cr",
                "1",
                "--threads",
                "1",
                "--runs",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["ours_ms"]["num_voxels"] for r in rows] == [expected.num_voxels]


def test_imported_reference_checkpoint(tmp_path, frame):
    """ "LAYOUT:PATH" imports a reference state dict (its config read from its shapes) and
    serves it like the model it came from."""
    from models.importers import export_state_dict

    torch.manual_seed(1)
    model = randomize_batchnorm(MinkUNet(in_channels=3, cr=0.25, blocks=(2, 1, 1, 1)), 2).eval()
    path = tmp_path / "spvnas.pt"
    torch.save(
        {"model": export_state_dict(model.state_dict(), "torchsparse-spvnas", model.config)}, path
    )
    imported, meta = load_model(f"torchsparse-spvnas:{path}")
    assert imported.config == model.config
    assert meta["input_features"] == list(FEATURES)
    got = build_pipeline(f"torchsparse-spvnas:{path}").segment(frame[2])
    want = SegmentationPipeline(model, VoxelizeConfig(features=FEATURES)).segment(frame[2])
    np.testing.assert_array_equal(got.labels, want.labels)
