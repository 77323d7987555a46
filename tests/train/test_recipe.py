"""The shipped models' recipes (train/recipe.py): one command makes the file, the stages chain,
an interrupted recipe continues, and the recipes say what the shipped files' meta says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from app.inference.builder import build_pipeline
from models.checkpoints import load_checkpoint
from models.weights import MODEL_CARD, WEIGHTS, metrics_path
from tests.conftest import require_real_data
from train import recipe as recipe_mod
from train.real import VALIDATION_FRAMES, load_real
from train.state import REAL_LICENCE, meta_for
from train.train import cli_parser, config_from


def stage_config(recipe, index, out="runs/x"):
    """The TrainConfig a recipe's stage runs with (train.train's own flag parsing)."""
    argv = recipe_mod.stage_argv(recipe, Path(out), index, None, False)
    return config_from(cli_parser().parse_args(argv))


def test_one_command_chains_the_stages_and_writes_the_shipped_file(tmp_path, capsys):
    require_real_data()
    recipe = recipe_mod.RECIPES["default"]
    logged = []
    path = recipe_mod.run(recipe, tmp_path, threads=2, smoke=True, log=logged.append)
    assert path == tmp_path / "minkunet_real.pt"
    for i, stage in enumerate(recipe.stages):  # each stage started where the recipe says
        state = torch.load(tmp_path / stage.name / "last.pt", weights_only=False)
        expected = recipe.stages[0].init if i == 0 else str(tmp_path / f"stage{i}" / "best.pt")
        assert state["config"]["init"] == expected and state["step"] == 2
    model, meta = load_checkpoint(path)
    assert meta["version"] == recipe.version + "-best2"
    assert meta["training_data"] == recipe.training_data and meta["licence"] == REAL_LICENCE
    stored = torch.load(path, weights_only=True)["state_dict"].values()
    assert all(v.dtype == torch.float16 for v in stored if v.is_floating_point())
    best, _ = load_checkpoint(tmp_path / "stage3" / "best.pt")
    for (k, a), b in zip(model.state_dict().items(), best.state_dict().values()):
        assert torch.equal(a, b.half().to(a.dtype) if b.is_floating_point() else b), k
    metrics = json.loads(metrics_path(path).read_text())
    scored = metrics["real_semantickitti"]
    assert all(scored[f"{name}.bin"]["role"] == "validation" for name in VALIDATION_FRAMES)
    points = load_real(VALIDATION_FRAMES[0])[0][:5000]
    labels = build_pipeline(str(path), "cpu").segment(np.ascontiguousarray(points)).labels
    assert labels.shape == (5000,)

    again = []  # run again: every stage finished, nothing trains
    recipe_mod.run(recipe, tmp_path, threads=2, smoke=True, log=again.append)
    assert [line for line in again if "skipped" in line] == [
        f"{s.name}: finished before, skipped" for s in recipe.stages
    ]


def test_a_folder_made_for_another_recipe_is_refused(tmp_path):
    recipe_mod.claim_folder(recipe_mod.RECIPES["default"], tmp_path, smoke=True)
    recipe_mod.claim_folder(recipe_mod.RECIPES["default"], tmp_path, smoke=True)  # the same: ok
    with pytest.raises(SystemExit, match="another --out"):
        recipe_mod.claim_folder(recipe_mod.RECIPES["default"], tmp_path, smoke=False)
    with pytest.raises(SystemExit, match="another --out"):
        recipe_mod.claim_folder(recipe_mod.RECIPES["synthetic"], tmp_path, smoke=True)


def test_recipes_say_what_the_shipped_files_meta_says():
    default = recipe_mod.RECIPES["default"]
    _, meta = load_checkpoint(WEIGHTS["default"])
    assert meta["version"].startswith(default.version + "-best")
    assert meta["training_data"] == default.training_data
    last = stage_config(default, len(default.stages) - 1)
    assert f"steps{last.steps}-seed{last.seed}" in default.version
    assert f"cr{last.cr:g}" in default.version and last.voxel_size == meta["voxel_size"]
    assert stage_config(default, 0).init == str(WEIGHTS["synthetic"])

    synthetic = recipe_mod.RECIPES["synthetic"]  # one run: its own meta is the shipped one
    _, meta = load_checkpoint(WEIGHTS["synthetic"])
    made = meta_for(stage_config(synthetic, 0))
    assert (made["version"], made["training_data"]) == (meta["version"], meta["training_data"])


@pytest.mark.parametrize("name", sorted(recipe_mod.RECIPES))
def test_the_model_card_gives_each_recipe_as_one_command(name):
    assert f"python -m train.recipe {name} --out" in MODEL_CARD.read_text()
