"""A training run (`python -m train.train`, whose --help describes it): the model, optimizer and
one-cycle schedule it builds (build; from an --init checkpoint's weights: init_weights), the class
weights of its loss (class_weights), its batches (make_data), and the step loop (train) with its
validations (run_validation: DIR/val.jsonl, DIR/best.pt), DIR/last.pt and DIR/model.pt.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import torch

from app.inference.voxel_config import VoxelizeConfig
from models import SparseTensor
from models.checkpoint_meta import INPUT_FEATURES
from models.checkpoints import load_checkpoint, save_checkpoint
from models.minkunet import MinkUNet

from .config import TrainConfig
from .data import (
    NUM_CLASSES,
    MixedBatches,
    SyntheticBatches,
    synthetic_frame,
    train_seeds,
)
from .losses import segmentation_loss
from .real import load_real
from .state import load_state, meta_for, save_state
from .validate import Progress, validate

CLASS_FREQ_FRAMES = 32


def class_weights(cfg: TrainConfig) -> torch.Tensor | None:
    """float32 [19] loss weights from the point label frequencies of the first training frames
    (a pure function of the config, so a resumed run uses the same weights)."""
    if cfg.class_weights == "none":
        return None
    if cfg.class_weights != "sqrt-inv":
        raise ValueError(f"class_weights must be 'sqrt-inv' or 'none', got {cfg.class_weights!r}")

    def freq(frames):
        c = sum(np.bincount(lab[lab < NUM_CLASSES], minlength=NUM_CLASSES) for lab in frames)
        return c / max(c.sum(), 1)

    counts = np.zeros(NUM_CLASSES, np.float64)
    if cfg.real_share < 1:
        seeds = list(train_seeds(cfg.train_seeds))[:CLASS_FREQ_FRAMES]
        counts += (1 - cfg.real_share) * freq(synthetic_frame(s, cfg.profile)[1] for s in seeds)
    if cfg.real_share > 0:
        counts += cfg.real_share * freq(load_real(n, cfg.real_dir)[1] for n in cfg.real_frames)
    counts *= 1e6
    w = 1.0 / np.sqrt(np.maximum(counts, 1.0) / counts.sum())
    w = np.clip(w / w.mean(), 0.2, 10.0)
    return torch.tensor(w / w.mean(), dtype=torch.float32)


def init_weights(cfg: TrainConfig) -> dict:
    """The --init checkpoint's weights; ValueError when it was trained at another voxel size or
    channel ratio (its filters would see the scene at the wrong scale, or not fit)."""
    init, meta = load_checkpoint(cfg.init)
    if not math.isclose(meta["voxel_size"], cfg.voxel_size, rel_tol=1e-6):
        raise ValueError(
            f"--init {cfg.init} was trained with {meta['voxel_size']:g} m voxels, this run uses "
            f"{cfg.voxel_size:g} m (--voxel-size)"
        )
    if init.config.cr != cfg.cr:
        raise ValueError(f"--init {cfg.init} has channel ratio {init.config.cr:g}, not {cfg.cr:g}")
    return init.state_dict()


def build(cfg: TrainConfig):
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    model = MinkUNet(in_channels=len(INPUT_FEATURES), num_classes=NUM_CLASSES, cr=cfg.cr)
    if cfg.init:
        model.load_state_dict(init_weights(cfg))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=cfg.lr, total_steps=cfg.steps + 1, pct_start=0.1
    )
    return model, optimizer, scheduler


def run_validation(
    cfg: TrainConfig, out: Path, step: int, model, best: dict | None, log, meta: dict
):
    """Scores the model, logs to DIR/val.jsonl, writes DIR/best.pt on a new best; the best."""
    result = validate(model, cfg.voxel_size, real_dir=cfg.real_dir)
    per_frame = {k: round(v["miou"], 4) for k, v in result["frames"].items()}
    with open(out / "val.jsonl", "a") as f:
        f.write(json.dumps({"step": step, **result}) + "\n")
    if best is None or result["score"] > best["score"]:
        best = {"step": step, "score": result["score"], "frames": per_frame}
        meta = {**meta, "version": f"{meta['version']}-best{step}"}
        save_checkpoint(out / "best.pt.tmp", model, meta)
        (out / "best.pt.tmp").replace(out / "best.pt")
    log(
        f"validation at step {step}: mIoU {result['score']:.4f} {per_frame} "
        f"(best {best['score']:.4f} at step {best['step']})"
    )
    return result["score"], best


def train(cfg: TrainConfig, log=print) -> list[float]:
    """Runs (or resumes) training; returns the loss of every step done so far (1-based order)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    last = out / "last.pt"
    if last.exists() and not cfg.resume:
        raise FileExistsError(f"{last} holds a run: --resume to continue it, or another --out")
    model, optimizer, scheduler = build(cfg)
    start, losses, best = 0, [], None
    if cfg.resume:
        start, losses, best = load_state(last, cfg, model, optimizer, scheduler)
        log(f"resumed from {last} at step {start}")
    meta = meta_for(cfg)
    data = make_data(cfg)
    criterion = segmentation_loss(cfg.loss, class_weights(cfg))
    end = cfg.steps if cfg.stop_at is None else min(cfg.steps, cfg.stop_at)
    progress = Progress(cfg.steps, start)
    if best is not None:
        progress.last_val = f"{best['score']:.4f} (best, step {best['step']})"
    model.train()
    for step in range(start, end):
        batch = data[step]
        logits = model(SparseTensor(batch.feats, batch.coords)).feats
        loss = criterion(logits, batch.labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
        done = step + 1
        log(progress.line(done, losses[-1], scheduler.get_last_lr()[0], len(batch.coords)))
        if cfg.val_every and (done % cfg.val_every == 0 or done == cfg.steps):
            score, best = run_validation(cfg, out, done, model, best, log, meta)
            progress.last_val = f"{score:.4f}"
            model.train()
        if done % cfg.ckpt_every == 0 or done == end:
            save_state(last, cfg, done, model, optimizer, scheduler, losses, best, meta)
    if len(losses) >= cfg.steps:
        model.eval()
        save_checkpoint(out / "model.pt", model, meta, half=True)
        (out / "losses.json").write_text(json.dumps(losses))
        log(f"saved {out / 'model.pt'}")
    return losses


def make_data(cfg: TrainConfig):
    common = {
        "batch_size": cfg.batch,
        "seed": cfg.seed,
        "max_points": cfg.max_points,
        "voxel_config": VoxelizeConfig(voxel_size=cfg.voxel_size),
        "profile": cfg.profile,
    }
    if cfg.real_share <= 0 and not cfg.paste and cfg.crop_degrees >= 360:
        return SyntheticBatches(train_seeds(cfg.train_seeds), **common)
    return MixedBatches(
        cfg.real_frames,
        train_seeds(cfg.train_seeds),
        cfg.real_share,
        cfg.paste,
        crop_degrees=cfg.crop_degrees,
        scene_mix=cfg.scene_mix,
        real_dir=cfg.real_dir,
        **common,
    )
