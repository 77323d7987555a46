"""Training on synthetic frames: augmentations, voxel labels, a smoke run, exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.checkpoints import load_checkpoint
from train.augment import augment
from train.config import TrainConfig
from train.data import HELDOUT_SEED_START, SyntheticBatches, synthetic_frame, voxel_labels
from train.loop import train

SMOKE = {"cr": 0.25, "batch": 1, "train_seeds": 2, "max_points": 20000, "seed": 0}


def test_augment_keeps_alignment_and_is_deterministic():
    points, _ = synthetic_frame(0)
    points = points[::10].copy()
    index = np.arange(len(points))  # labels = row index: tells which input row each output is
    out, idx = augment(points, index, np.random.default_rng(7))
    assert out.shape == (len(idx), 4) and out.dtype == np.float32
    assert 0 < len(idx) <= len(points) and np.all(np.diff(idx) > 0)  # a subset, order kept
    src = points[idx]
    # rotation about z and flips keep |xyz| and z up to the scale and 1 cm jitter (clip 5 cm)
    s = np.median(np.linalg.norm(out[:, :3], axis=1) / np.linalg.norm(src[:, :3], axis=1))
    assert 0.95 <= s <= 1.05
    assert (
        np.abs(np.linalg.norm(out[:, :3], axis=1) - s * np.linalg.norm(src[:, :3], axis=1)).max()
        < 0.1
    )
    assert np.abs(out[:, 2] - s * src[:, 2]).max() < 0.06
    assert np.abs(out[:, 3] - src[:, 3]).max() < 0.2 and out[:, 3].min() >= 0
    again, idx2 = augment(points, index, np.random.default_rng(7))
    assert np.array_equal(out, again) and np.array_equal(idx, idx2)
    other, _ = augment(points, index, np.random.default_rng(8))
    assert other.shape != out.shape or not np.array_equal(other, out)


def test_voxel_labels_majority():
    p2v = torch.tensor([0, 0, 0, 1, 1, 2, -1, 3])
    labels = torch.tensor(
        [
            5,
            5,
            2,
            7,
            255,
            255,
            1,
            3,
        ]
    )
    assert voxel_labels(p2v, labels, 4).tolist() == [5, 7, 255, 3]


def test_batches_deterministic_and_training_seeds_only():
    with pytest.raises(ValueError):
        SyntheticBatches([HELDOUT_SEED_START])
    data = SyntheticBatches(range(2), batch_size=2, seed=0, max_points=5000)
    a, b = data[3], data[3]
    assert torch.equal(a.coords, b.coords) and torch.equal(a.labels, b.labels)
    assert set(a.coords[:, 0].tolist()) == {0, 1}
    assert a.labels.dtype == torch.int64 and ((a.labels < 19) | (a.labels == 255)).all()


def test_smoke_training_lowers_loss_and_saves_checkpoint(tmp_path):
    losses = train(
        TrainConfig(out=str(tmp_path), steps=8, lr=0.01, ckpt_every=4, **SMOKE), log=lambda s: None
    )
    print("smoke losses", [round(v, 4) for v in losses])
    assert len(losses) == 8 and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < losses[0]
    model, meta = load_checkpoint(tmp_path / "model.pt")
    assert model.config.cr == 0.25 and meta["voxel_size"] == TrainConfig(out="").voxel_size
    assert meta["training_data"].startswith("synthetic seeds 0..1")
    assert meta["class_names"][0] == "car" and meta["input_features"] == [
        "x",
        "y",
        "z",
        "intensity",
    ]


def test_resume_reproduces_uninterrupted_run(tmp_path):
    common = dict(steps=4, lr=0.005, ckpt_every=2, **SMOKE)
    full = train(TrainConfig(out=str(tmp_path / "full"), **common), log=lambda s: None)
    first = train(TrainConfig(out=str(tmp_path / "split"), stop_at=2, **common), log=lambda s: None)
    assert first == full[:2] and not (tmp_path / "split" / "model.pt").exists()
    resumed = train(
        TrainConfig(out=str(tmp_path / "split"), resume=True, **common), log=lambda s: None
    )
    assert resumed[2:] == full[2:], (resumed, full)
    assert (tmp_path / "split" / "model.pt").exists()


def test_a_run_keeps_its_settings_its_folder_and_its_licence(tmp_path):
    """--resume refuses changed settings (a new --lr was silently ignored, new data mixed in);
    a new run refuses a folder holding one (it overwrote last.pt); a fine-tune of the real model
    on synthetic scans is licensed as the real model is (it was 'no third-party data'); an
    export needs no --init file."""
    from train.state import REAL_LICENCE, SYNTHETIC_LICENCE
    from train.train import export_last

    common = {**SMOKE, "steps": 2, "val_every": 0}
    first = TrainConfig(out=str(tmp_path / "a"), stop_at=1, **common)
    train(first, log=lambda s: None)
    with pytest.raises(ValueError, match="--lr 0.002 -> 0.1"):
        train(TrainConfig(out=first.out, resume=True, **{**common, "lr": 0.1}), log=print)
    with pytest.raises(FileExistsError, match="--resume"):
        train(TrainConfig(out=first.out, **common), log=print)
    train(TrainConfig(out=first.out, resume=True, **common), log=lambda s: None)
    assert load_checkpoint(tmp_path / "a" / "model.pt")[1]["licence"] == SYNTHETIC_LICENCE

    tuned = TrainConfig(out=str(tmp_path / "b"), init="models/weights/minkunet_real.pt",
                        **{**common, "cr": 0.5})  # fmt: skip
    for change, says in (({"voxel_size": 0.05}, "0.1 m voxels"), ({"cr": 0.25}, "ratio 0.5")):
        with pytest.raises(ValueError, match=says):  # the scale its filters learnt, or no fit
            train(TrainConfig(**{**tuned.__dict__, "out": str(tmp_path / "c"), **change}))
    train(tuned, log=lambda s: None)
    meta = load_checkpoint(tmp_path / "b" / "model.pt")[1]
    assert meta["licence"] == REAL_LICENCE and "SemanticKITTI" in meta["training_data"]
    moved = TrainConfig(**{**tuned.__dict__, "init": str(tmp_path / "gone.pt")})
    state = torch.load(tmp_path / "b" / "last.pt", weights_only=False)
    state["config"] = moved.__dict__
    torch.save(state, tmp_path / "b" / "last.pt")
    export_last(str(tmp_path / "b"), str(tmp_path / "b.pt"))
    assert load_checkpoint(tmp_path / "b.pt")[1]["licence"] == REAL_LICENCE


def test_synthetic_profiles_train_on_kittis_intensity_scale():
    """nuscenes32 and ouster128 write 0..255: read as 0..1 and clipped, every point had 1."""
    for profile in ("hdl64", "nuscenes32", "ouster128"):
        inten = synthetic_frame(0, profile)[0][:, 3]
        assert inten.max() <= 1.0 and np.percentile(inten, 50) < 0.9, profile
