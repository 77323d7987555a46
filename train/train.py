"""Train MinkUNet on synthetic frames.

    python -m train.train --out DIR [--cr 0.5] [--steps N] [--batch B] [--lr LR] [--seed S]
                          [--train-seeds N] [--max-points P] [--ckpt-every K] [--resume]
                          [--voxel-size V] [--class-weights sqrt-inv|none]
    python -m train.train --out DIR --export PATH     DIR/last.pt's weights as a checkpoint

AdamW + one-cycle schedule, cross-entropy with ignore_index 255 on voxel labels (the majority
label of each voxel's points), classes weighted by 1/sqrt(frequency) measured on the first
CLASS_FREQ_FRAMES training frames (clipped to [0.2, 10] x the mean) so rare classes such as
motorcyclist and traffic-sign are not drowned by road. Every --ckpt-every steps (and at the end) DIR/last.pt holds the
model, optimizer, scheduler, step and RNG states; --resume continues from it and reproduces the
losses of an uninterrupted run (batches are a pure function of (seed, step), see train/data.py).
At the end DIR/model.pt holds the weights in our checkpoint format (fp16, models/checkpoints.py).
One line per step: `step S loss L lr X`. Training never reads ../shared/data/real.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.inference.voxelize import VoxelizeConfig
from models import SparseTensor
from models.checkpoints import make_meta, save_checkpoint
from models.minkunet import MinkUNet

from .data import HELDOUT_SEED_START, IGNORE, NUM_CLASSES, SyntheticBatches, synthetic_frame, train_seeds

TRAINING_VERSION = "synth-v2"
CLASS_FREQ_FRAMES = 32


@dataclass
class TrainConfig:
    out: str
    cr: float = 0.5
    steps: int = 1000
    batch: int = 2
    lr: float = 2e-3
    weight_decay: float = 1e-4
    seed: int = 0
    train_seeds: int = 1000
    max_points: int | None = None
    ckpt_every: int = 100
    stop_at: int | None = None   # stop (after checkpointing) once this many steps are done
    resume: bool = False
    profile: str = "hdl64"
    voxel_size: float = 0.1
    class_weights: str = "sqrt-inv"    # or "none"


def class_weights(cfg: TrainConfig) -> torch.Tensor | None:
    """float32 [19] loss weights from the point label frequencies of the first training frames
    (a pure function of the config, so a resumed run uses the same weights)."""
    if cfg.class_weights == "none":
        return None
    if cfg.class_weights != "sqrt-inv":
        raise ValueError(f"class_weights must be 'sqrt-inv' or 'none', got {cfg.class_weights!r}")
    counts = np.zeros(NUM_CLASSES, np.float64)
    for s in list(train_seeds(cfg.train_seeds))[:CLASS_FREQ_FRAMES]:
        labels = synthetic_frame(s, cfg.profile)[1]
        counts += np.bincount(labels[labels < NUM_CLASSES], minlength=NUM_CLASSES)
    w = 1.0 / np.sqrt(np.maximum(counts, 1.0) / counts.sum())
    w = np.clip(w / w.mean(), 0.2, 10.0)
    return torch.tensor(w / w.mean(), dtype=torch.float32)


def rng_states() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate()}


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def build(cfg: TrainConfig):
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    model = MinkUNet(in_channels=4, num_classes=19, cr=cfg.cr)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr,
                                                    total_steps=cfg.steps + 1, pct_start=0.1)
    return model, optimizer, scheduler


def save_state(path: Path, cfg: TrainConfig, step: int, model, optimizer, scheduler,
               losses: list[float]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"config": asdict(cfg), "step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng_states(), "losses": list(losses)}, tmp)
    tmp.replace(path)


def meta_for(cfg: TrainConfig) -> dict:
    n = cfg.train_seeds
    return make_meta(
        voxel_size=cfg.voxel_size,
        training_data=(f"synthetic seeds 0..{n - 1} (synth.generate, profile {cfg.profile}); "
                       f"held-out seeds from {HELDOUT_SEED_START}; {cfg.steps} steps x "
                       f"batch {cfg.batch}, seed {cfg.seed}, voxel {cfg.voxel_size:g} m, "
                       f"class weights {cfg.class_weights}"),
        version=f"{TRAINING_VERSION}-cr{cfg.cr:g}-steps{cfg.steps}-seed{cfg.seed}")


def train(cfg: TrainConfig, log=print) -> list[float]:
    """Runs (or resumes) training; returns the loss of every step done so far (1-based order)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    last = out / "last.pt"
    model, optimizer, scheduler = build(cfg)
    start, losses = 0, []
    if cfg.resume:
        if not last.is_file():
            raise FileNotFoundError(f"--resume: no {last}")
        state = torch.load(last, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_states(state["rng"])
        start, losses = int(state["step"]), list(state["losses"])
        log(f"resumed from {last} at step {start}")
    data = SyntheticBatches(train_seeds(cfg.train_seeds), cfg.batch, cfg.seed, cfg.max_points,
                            VoxelizeConfig(voxel_size=cfg.voxel_size), cfg.profile)
    criterion = nn.CrossEntropyLoss(weight=class_weights(cfg), ignore_index=IGNORE)
    end = cfg.steps if cfg.stop_at is None else min(cfg.steps, cfg.stop_at)
    model.train()
    for step in range(start, end):
        t0 = time.perf_counter()
        batch = data[step]
        logits = model(SparseTensor(batch.feats, batch.coords)).feats
        loss = criterion(logits, batch.labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
        log(f"step {step + 1} loss {losses[-1]:.6f} lr {scheduler.get_last_lr()[0]:.3e} "
            f"voxels {len(batch.coords)} {time.perf_counter() - t0:.2f}s")
        done = step + 1
        if done % cfg.ckpt_every == 0 or done == end:
            save_state(last, cfg, done, model, optimizer, scheduler, losses)
    if len(losses) >= cfg.steps:
        model.eval()
        save_checkpoint(out / "model.pt", model, meta_for(cfg), half=True)
        (out / "losses.json").write_text(json.dumps(losses))
        log(f"saved {out / 'model.pt'}")
    return losses


def export_last(out: str, path: str) -> None:
    """Writes the weights of OUT/last.pt (an unfinished run too) as a fp16 checkpoint."""
    state = torch.load(Path(out) / "last.pt", map_location="cpu", weights_only=False)
    cfg = TrainConfig(**state["config"])
    model = build(cfg)[0]
    model.load_state_dict(state["model"])
    model.eval()
    meta = meta_for(cfg)
    meta["version"] += f"-at{state['step']}"
    save_checkpoint(path, model, meta, half=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--cr", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-seeds", type=int, default=1000, help="frames: seeds 0..N-1")
    p.add_argument("--max-points", type=int, default=None, help="subsample each frame")
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--stop-at", type=int, default=None, help="stop after this many steps")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--export", default=None, help="write DIR/last.pt's weights here and exit")
    p.add_argument("--voxel-size", type=float, default=0.1)
    p.add_argument("--class-weights", choices=("sqrt-inv", "none"), default="sqrt-inv")
    a = p.parse_args(argv)
    if a.export:
        export_last(a.out, a.export)
        return 0
    cfg = TrainConfig(out=a.out, cr=a.cr, steps=a.steps, batch=a.batch, lr=a.lr, seed=a.seed,
                      train_seeds=a.train_seeds, max_points=a.max_points,
                      ckpt_every=a.ckpt_every, stop_at=a.stop_at, resume=a.resume,
                      voxel_size=a.voxel_size, class_weights=a.class_weights)
    train(cfg, log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
