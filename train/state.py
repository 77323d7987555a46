"""What a training run keeps on disk: DIR/last.pt (the state --resume continues from) and the
meta of the checkpoints it writes.

DIR/last.pt is one torch.save'd dict: the TrainConfig, step, model, optimizer and scheduler
state_dicts, the torch / numpy / python RNG states, every loss so far and the best validation
(None before the first); save_state writes it atomically (a .tmp file, then a rename),
load_state restores it into a freshly built model, optimizer and scheduler. meta_for is the meta
(models/checkpoints.py) of model.pt, best.pt and exports: training data, version and licence,
synthetic-only runs apart from runs that saw real SemanticKITTI scans.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from models.checkpoints import make_meta

from .config import TrainConfig
from .data import HELDOUT_SEED_START
from .real import VALIDATION_FRAMES as VAL_NAMES

TRAINING_VERSION = "synth-v2"
REAL_VERSION = "real-v1"
SYNTHETIC_LICENCE = "ours; no third-party data (synthetic scans only)"
REAL_LICENCE = "CC BY-NC-SA 4.0, non-commercial: trained on SemanticKITTI"


def rng_states() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def save_state(
    path: Path,
    cfg: TrainConfig,
    step: int,
    model,
    optimizer,
    scheduler,
    losses: list[float],
    best: dict | None = None,
) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "config": asdict(cfg),
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_states(),
            "losses": list(losses),
            "best": best,
        },
        tmp,
    )
    tmp.replace(path)


def load_state(path: Path, model, optimizer, scheduler) -> tuple[int, list[float], dict | None]:
    """Restores a save_state file into model, optimizer, scheduler and the RNGs; (step, losses,
    best) as saved."""
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no {path}")
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_states(state["rng"])
    return int(state["step"]), list(state["losses"]), state.get("best")


def meta_for(cfg: TrainConfig) -> dict:
    n = cfg.train_seeds
    synth = (
        f"synthetic seeds 0..{n - 1} (synth.generate, profile {cfg.profile}); held-out "
        f"seeds from {HELDOUT_SEED_START}"
    )
    recipe = (
        f"{cfg.steps} steps x batch {cfg.batch}, seed {cfg.seed}, voxel "
        f"{cfg.voxel_size:g} m, class weights {cfg.class_weights}"
    )
    if cfg.loss != "ce":
        recipe += f", loss {cfg.loss}"
    if cfg.real_share <= 0:
        meta = make_meta(
            voxel_size=cfg.voxel_size,
            training_data=f"{synth}; {recipe}",
            version=f"{TRAINING_VERSION}-cr{cfg.cr:g}-steps{cfg.steps}-seed{cfg.seed}",
        )
        meta["licence"] = SYNTHETIC_LICENCE
        return meta
    init = f"fine-tuned from {Path(cfg.init).name}; " if cfg.init else ""
    mix = f", {cfg.scene_mix:.0%} scene-mixed" if cfg.scene_mix > 0 else ""
    meta = make_meta(
        voxel_size=cfg.voxel_size,
        training_data=(
            f"{init}SemanticKITTI scans {', '.join(cfg.real_frames)} (CC BY-NC-SA 4.0; "
            f"{cfg.real_share:.0%} of batch slots, {cfg.paste} pasted instances a "
            f"frame, {cfg.crop_degrees:g} degree wedges{mix}) mixed with {synth}; "
            f"model selection on {', '.join(VAL_NAMES)} "
            f"(never trained on); {recipe}"
        ),
        version=f"{REAL_VERSION}-cr{cfg.cr:g}-steps{cfg.steps}-seed{cfg.seed}",
    )
    meta["licence"] = REAL_LICENCE
    return meta
