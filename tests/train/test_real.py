"""Training on real frames: roles, refusal of validation frames, augmentations that keep points
and labels aligned, instance pasting, mixed batches, exact resume."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tests.conftest import require_real_data
from train.augment import REAL_AUGMENT, augment, paste_instances, sector_dropout, swap_sector
from train.config import TrainConfig
from train.data import MixedBatches, train_seeds
from train.loop import train
from train.real import (
    GROUND_CLASSES,
    ROLES,
    THING_CLASSES,
    TRAIN,
    TRAINING_POOL,
    VALIDATION,
    VALIDATION_FRAMES,
    Instance,
    check_training_frames,
    instances_of,
    load_real,
)


def test_roles_table_mirrors_sources_md():
    """Every frame named in SOURCES.md's roles table has the same role in train/real.py."""
    text = (require_real_data() / "SOURCES.md").read_text()
    rows = {
        m.group(1).lower(): m.group(2)
        for m in re.finditer(r"^\| \*\*(training pool|validation)\*\* \| (.+?) \|", text, re.M)
    }
    assert set(rows) == {"training pool", "validation"}
    val = re.findall(r"semantickitti/(\w+)", rows["validation"])
    assert sorted(val) == sorted(VALIDATION_FRAMES) == ["seq00_000000", "spvnas_000000"]
    first, last = re.findall(r"seq04_(\d+)", rows["training pool"])
    pool = [f"seq04_{i:06d}" for i in range(int(first), int(last) + 1)]
    pool += re.findall(r"semantickitti/(seq00_\d+)", rows["training pool"])
    assert sorted(pool) == sorted(TRAINING_POOL)
    assert all(ROLES[n] == TRAIN for n in pool) and all(ROLES[n] == VALIDATION for n in val)


@pytest.mark.parametrize(
    "bad", ["seq00_000000", "spvnas_000000", "seq00_000000_subset50", "seq07_000000"]
)
def test_loader_refuses_frames_outside_the_training_pool(bad):
    with pytest.raises(ValueError, match=bad):
        check_training_frames(["seq04_000000", bad])
    with pytest.raises(ValueError, match=bad):
        MixedBatches([bad], range(2))
    with pytest.raises(ValueError, match=bad):
        TrainConfig(out="", real_frames=(bad,), real_share=1.0)
    with pytest.raises(ValueError, match=bad):
        instances_of(bad)
    assert check_training_frames(TRAINING_POOL) == TRAINING_POOL


def test_real_augmentations_keep_points_and_labels_aligned():
    require_real_data()
    points, labels, _ = load_real("seq00_000100")
    points = points[::5].copy()
    index = np.arange(len(points))  # labels = row index: tells which input row each output is
    out, idx = augment(points, index, np.random.default_rng(3), REAL_AUGMENT)
    assert out.shape == (len(idx), 4) and 0 < len(idx) < len(points)
    assert np.all(np.diff(idx) > 0)  # a subset in order: a dropped point took its label with it
    src = points[idx]
    # z only scales (0.9-1.1) and shifts (translation, jitter): fit z_out = a z_src + b
    a, b = np.polyfit(src[:, 2], out[:, 2], 1)
    assert 0.9 <= a <= 1.1 and np.abs(out[:, 2] - (a * src[:, 2] + b)).max() < 0.06
    r_src, r_out = np.hypot(src[:, 0], src[:, 1]), np.hypot(out[:, 0], out[:, 1])
    # rotation and flips keep the distance to the z axis up to scale and a < 1.5 m shift
    assert np.median(np.abs(r_out - a * r_src)) < 1.5
    again, idx2 = augment(points, index, np.random.default_rng(3), REAL_AUGMENT)
    assert np.array_equal(out, again) and np.array_equal(idx, idx2)


def test_sector_dropout_drops_one_azimuth_sector():
    angles = np.linspace(-np.pi, np.pi, 3600, endpoint=False)
    points = np.stack(
        [np.cos(angles), np.sin(angles), np.zeros_like(angles), np.zeros_like(angles)], 1
    ).astype(np.float32)
    out, idx = sector_dropout(points, np.arange(len(points)), np.random.default_rng(1))
    assert np.array_equal(out, points[idx])
    gone = np.setdiff1d(np.arange(len(points)), idx)
    assert 50 <= len(gone) <= 450  # 5..45 degrees of 3600 tenth-degree points
    steps = np.diff(gone) % len(points)  # one contiguous run, possibly wrapping around
    assert np.sum(steps != 1) <= 1


def test_swap_sector_takes_one_half_sweep_from_the_other_scan():
    angles = np.linspace(-np.pi, np.pi, 3600, endpoint=False)
    ring = np.stack(
        [np.cos(angles), np.sin(angles), np.zeros_like(angles), np.zeros_like(angles)], 1
    ).astype(np.float32)
    other = ring * np.float32(2.0)  # the other scan's points sit on a ring of radius 2
    labels, other_labels = np.arange(3600), np.arange(3600) + 10_000
    out, lab = swap_sector(ring, labels, other, other_labels, np.random.default_rng(3))
    assert len(out) == 3600 and len(np.unique(lab % 10_000)) == 3600  # each azimuth once
    mine = lab < 10_000
    assert np.array_equal(out[mine], ring[lab[mine]])  # rows and labels stay aligned
    assert np.array_equal(out[~mine], other[lab[~mine] - 10_000])
    assert mine.sum() == 1800
    taken = np.sort(lab[~mine] - 10_000)
    assert np.sum(np.diff(taken) % 3600 != 1) <= 1  # one contiguous half, possibly wrapping


def test_instance_bank_holds_only_labelled_instances():
    require_real_data()
    for name in ("seq00_000100", "seq04_000002"):
        points, labels, inst = load_real(name)
        bank = instances_of(name)
        assert bank, name
        for i in bank:
            assert i.label in THING_CLASSES and i.source == name
            rows = np.flatnonzero(
                np.isin(
                    points.view(np.dtype((np.void, 16))).ravel(),
                    i.points.view(np.dtype((np.void, 16))).ravel(),
                )
            )
            assert len(rows) >= len(i.points)
            # every point of the instance carries an instance id and the instance's class
            assert np.all(inst[rows] > 0) and np.all(labels[rows] == i.label)


def test_paste_only_adds_whole_labelled_instances_on_ground():
    rng = np.random.default_rng(0)
    # a flat road disc and one wall; a 2 m car-like box cut from "another frame"
    ground = np.concatenate(
        [
            rng.uniform(-20, 20, (20000, 2)),
            np.full((20000, 1), -1.7),
            rng.uniform(0, 1, (20000, 1)),
        ],
        1,
    ).astype(np.float32)
    wall = np.concatenate(
        [
            np.full((500, 1), 15.0),
            rng.uniform(-20, 20, (500, 1)),
            rng.uniform(-1.7, 2, (500, 1)),
            np.zeros((500, 1)),
        ],
        1,
    ).astype(np.float32)
    points = np.concatenate([ground, wall])
    labels = np.concatenate([np.full(20000, 8), np.full(500, 12)]).astype(np.uint8)
    car = np.concatenate(
        [rng.uniform([5, 5, -1.2], [7, 6, 0], (300, 3)), rng.uniform(0, 1, (300, 1))], 1
    ).astype(np.float32)
    bank = [Instance(car, 0, "other"), Instance(car + 1, 5, "self")]
    out, lab = paste_instances(
        points, labels, rng, bank, 6, GROUND_CLASSES, exclude_sources=("self",)
    )
    assert np.array_equal(out[: len(points)], points) and np.array_equal(lab[: len(points)], labels)
    added, added_lab = out[len(points) :], lab[len(points) :]
    assert len(added) % len(car) == 0 and len(added) > 0  # whole instances only
    assert np.all(added_lab == 0)  # never the excluded source's instance (label 5)
    r_car = np.sort(np.hypot(car[:, 0], car[:, 1]))
    for block in added.reshape(-1, len(car), 4):
        # rotated about z (same distances to the sensor), standing on the road at -1.7 m
        assert np.allclose(np.sort(np.hypot(block[:, 0], block[:, 1])), r_car, atol=1e-4)
        assert abs(block[:, 2].min() + 1.7) < 1e-4
        assert np.array_equal(np.sort(block[:, 3]), np.sort(car[:, 3]))
        assert not np.any((block[:, 0] > 14) & (block[:, 0] < 16))  # never through the wall


SMOKE = {
    "cr": 0.25,
    "batch": 1,
    "train_seeds": 2,
    "max_points": 20000,
    "seed": 0,
    "real_frames": ("seq04_000000", "seq00_000100"),
    "real_share": 0.5,
    "paste": 2,
}


def test_mixed_batches_deterministic_and_real():
    require_real_data()
    data = MixedBatches(SMOKE["real_frames"], train_seeds(2), 0.5, 2, batch_size=2, max_points=5000)
    a, b = data[5], data[5]
    assert torch.equal(a.coords, b.coords) and torch.equal(a.labels, b.labels)
    names = {n for s in range(8) for n in data[s].seeds}
    assert names & set(SMOKE["real_frames"]) and any(n.startswith("synth:") for n in names)
    assert not names & set(VALIDATION_FRAMES)


def test_scene_mix_joins_two_training_frames_only():
    require_real_data()
    plain = MixedBatches(SMOKE["real_frames"], train_seeds(2), 1.0, 0, batch_size=2)
    mixed = MixedBatches(SMOKE["real_frames"], train_seeds(2), 1.0, 0, batch_size=2, scene_mix=1.0)
    names = [n for s in range(4) for n in mixed[s].seeds]
    assert all("+" in n and set(n.split("+")) == set(SMOKE["real_frames"]) for n in names)
    assert not mixed[0].coords.equal(plain[0].coords)
    again = mixed[2]
    assert again.coords.equal(mixed[2].coords) and again.labels.equal(mixed[2].labels)


def test_mixed_resume_reproduces_and_keeps_best(tmp_path):
    require_real_data()
    common = dict(steps=4, lr=0.005, ckpt_every=2, val_every=2, **SMOKE)
    full = train(TrainConfig(out=str(tmp_path / "full"), **common), log=lambda s: None)
    first = train(TrainConfig(out=str(tmp_path / "split"), stop_at=2, **common), log=lambda s: None)
    assert first == full[:2]
    resumed = train(
        TrainConfig(out=str(tmp_path / "split"), resume=True, **common), log=lambda s: None
    )
    assert resumed[2:] == full[2:], (resumed, full)
    lines = (tmp_path / "split" / "val.jsonl").read_text().splitlines()
    assert len(lines) == 2 and (tmp_path / "split" / "best.pt").is_file()
    from models.checkpoints import load_checkpoint

    _, meta = load_checkpoint(tmp_path / "split" / "best.pt")
    assert meta["licence"].startswith("CC BY-NC-SA 4.0") and "seq04_000000" in meta["training_data"]


def test_evaluate_refuses_a_missing_real_frame_before_scoring(tmp_path, monkeypatch, capsys):
    """A wrong --real-dir is an error at once, not a traceback after minutes of synthetic
    frames (the scoring is not reached at all)."""
    from train import evaluate

    def never(*args, **kwargs):
        raise AssertionError("scored before checking the real frames")

    monkeypatch.setattr(evaluate, "build_pipeline", never)
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["--real-dir", str(tmp_path), "--frames", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "roles.json is missing" in err and str(tmp_path) in err  # not the shared folder
