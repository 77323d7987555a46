"""A team's own labelled scans (`train.train --real-dir DIR`, DIR/roles.json): the roles rule
holds there (validation frames never train, a frame without a role or files refused), a run
trains and validates on them, and its checkpoint's licence and training data say whose scans
went in (with SemanticKITTI's terms as well where an --init trained on SemanticKITTI did)."""

from __future__ import annotations

import json
import shutil

import pytest

from models.checkpoints import load_checkpoint
from tests.conftest import require_real_data
from train import evaluate
from train.config import TrainConfig
from train.loop import train
from train.real import REAL_DIR, ROLES_FILE, TRAIN, VALIDATION, roles_of
from train.state import OWN_DATA_LICENCE, REAL_LICENCE

SMOKE = {"cr": 0.25, "batch": 1, "train_seeds": 2, "max_points": 20000, "seed": 0, "steps": 2}
OURS = {"depot_a": "seq04_000001", "depot_b": "seq04_000002", "depot_val": "seq04_000003"}


@pytest.fixture()
def own_dir(tmp_path):
    """Three scans renamed as a team would name its own (copies of shared training frames)."""
    require_real_data()
    folder = tmp_path / "scans"
    folder.mkdir()
    for name, source in OURS.items():
        for ext in (".bin", ".label"):
            shutil.copy(REAL_DIR / f"{source}{ext}", folder / f"{name}{ext}")
    roles = {"depot_a": TRAIN, "depot_b": TRAIN, "depot_val": VALIDATION}
    (folder / ROLES_FILE).write_text(json.dumps(roles))
    return folder


def test_the_roles_rule_holds_in_a_folder_of_ones_own(own_dir, tmp_path):
    common = dict(out=str(tmp_path / "r"), real_share=0.5, real_dir=str(own_dir), **SMOKE)
    with pytest.raises(ValueError, match="role is 'validation'"):
        TrainConfig(real_frames=("depot_a", "depot_val"), **common)
    with pytest.raises(ValueError, match="not in the roles table"):
        TrainConfig(real_frames=("seq04_000000",), **common)  # the shared folder's, not this one's
    (own_dir / "depot_b.label").unlink()
    roles_of.cache_clear()
    with pytest.raises(ValueError, match="no depot_b.label"):
        TrainConfig(real_frames=("depot_a",), **common)
    (own_dir / ROLES_FILE).unlink()
    roles_of.cache_clear()
    with pytest.raises(ValueError, match="roles.json is missing"):
        TrainConfig(real_frames=("depot_a",), **common)


def test_a_run_on_ones_own_scans_says_whose_they_are(own_dir, tmp_path, capsys):
    roles_of.cache_clear()
    cfg = TrainConfig(
        out=str(tmp_path / "own"),
        real_frames=("depot_a", "depot_b"),
        real_share=0.5,
        real_dir=str(own_dir),
        val_every=2,
        **SMOKE,
    )
    losses = train(cfg, log=lambda s: None)
    assert len(losses) == 2
    meta = load_checkpoint(tmp_path / "own" / "model.pt")[1]
    assert meta["licence"] == f"{OWN_DATA_LICENCE} ({own_dir})"
    assert "own labelled scans depot_a, depot_b" in meta["training_data"]
    assert "model selection on depot_val" in meta["training_data"]
    assert "SemanticKITTI" not in meta["training_data"]
    assert (tmp_path / "own" / "best.pt").exists()  # validated on depot_val
    tuned = TrainConfig(**{**cfg.__dict__, "out": str(tmp_path / "tuned"), "val_every": 0,
                           "init": "models/weights/minkunet_real.pt", "cr": 0.5})  # fmt: skip
    train(tuned, log=lambda s: None)
    licence = load_checkpoint(tmp_path / "tuned" / "model.pt")[1]["licence"]
    assert licence == f"{REAL_LICENCE}; and {OWN_DATA_LICENCE} ({own_dir})"
    # a fine-tune of the own-scans model on synthetic scans keeps its terms (not SemanticKITTI's)
    synthetic = TrainConfig(out=str(tmp_path / "again"), init=str(tmp_path / "own" / "model.pt"),
                            **SMOKE)  # fmt: skip
    train(synthetic, log=lambda s: None)
    again = load_checkpoint(tmp_path / "again" / "model.pt")[1]
    assert again["licence"] == f"{OWN_DATA_LICENCE} ({own_dir})"
    assert "SemanticKITTI" not in again["training_data"]
    with pytest.raises(SystemExit):  # train.evaluate reads the same roles
        evaluate.main(["--real-dir", str(own_dir / "nowhere")])
    assert "roles.json is missing" in capsys.readouterr().err
