"""What a training run keeps on disk: DIR/last.pt (the state --resume continues from) and the
meta of the checkpoints it writes.

DIR/last.pt is one torch.save'd dict: the TrainConfig, step, model, optimizer and scheduler
state_dicts, the torch / numpy / python RNG states, every loss so far and the best validation
(None before the first); save_state writes it atomically (a .tmp file, then a rename),
load_state restores it into a freshly built model, optimizer and scheduler. meta_for is the meta
(models/checkpoint_meta.py) of model.pt, best.pt and exports: training data, version and licence,
synthetic-only runs apart from runs that saw real SemanticKITTI scans.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from models.checkpoint_meta import make_meta
from models.checkpoints import load_checkpoint

from .config import TrainConfig
from .data import HELDOUT_SEED_START
from .real import VALIDATION, frames_in_role, is_shared

TRAINING_VERSION = "synth-v2"
REAL_VERSION = "real-v1"
SYNTHETIC_LICENCE = "ours; no third-party data (synthetic scans only)"
REAL_LICENCE = "CC BY-NC-SA 4.0, non-commercial: trained on SemanticKITTI"
OWN_DATA_LICENCE = "the terms of the labelled scans it was trained on"  # a team's own folder


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
    meta: dict | None = None,
) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "config": asdict(cfg),
            "meta": meta,  # meta_for(cfg) at the run's start: an export needs no --init file
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


# TrainConfig fields a resumed run may change: where it writes and when it stops, validates and
# saves; any other change would continue one run as another (its data, schedule or metadata)
RESUME_FREE = ("out", "resume", "stop_at", "val_every", "ckpt_every")


def check_resumable(cfg: TrainConfig, saved: dict) -> None:
    """ValueError naming every setting `cfg` changes from the run it resumes."""
    now = asdict(cfg)
    changed = [
        f"--{k.replace('_', '-')} {saved.get(k)!r} -> {now[k]!r}"
        for k in now
        if k not in RESUME_FREE and now[k] != saved.get(k)
    ]
    if changed:
        raise ValueError(
            "--resume continues the run as it was started; these settings differ: "
            + ", ".join(changed)
        )


def load_state(
    path: Path, cfg: TrainConfig, model, optimizer, scheduler
) -> tuple[int, list[float], dict | None]:
    """Restores a save_state file into model, optimizer, scheduler and the RNGs; (step, losses,
    best) as saved. ValueError when `cfg` is not the saved run's (check_resumable)."""
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no {path}")
    state = torch.load(path, map_location="cpu", weights_only=False)
    check_resumable(cfg, state["config"])
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_states(state["rng"])
    return int(state["step"]), list(state["losses"]), state.get("best")


LICENCE_JOIN = "; and "


def run_licence(cfg: TrainConfig, inherited: str | None) -> str:
    """Every source's terms, joined: SemanticKITTI's where the shared folder's frames went in,
    the --init checkpoint's (`inherited`: SemanticKITTI's, a team's scans', or both), and a
    team's own scans' where those went in; synthetic-only when no real scan went in any way.
    (Until 2026-12-06 only real batch slots counted: a fine-tune of the shipped real model on
    synthetic scans was labelled 'no third-party data'.)"""
    terms: list[str] = []
    if cfg.real_frames and is_shared(cfg.real_dir):
        terms.append(REAL_LICENCE)
    if inherited not in (None, SYNTHETIC_LICENCE):
        terms += [t for t in str(inherited).split(LICENCE_JOIN) if t not in terms]
    if cfg.real_frames and not is_shared(cfg.real_dir):
        own = f"{OWN_DATA_LICENCE} ({cfg.real_dir})"
        terms += [own] if own not in terms else []
    return LICENCE_JOIN.join(terms) or SYNTHETIC_LICENCE


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
    inherited = load_checkpoint(cfg.init)[1].get("licence") if cfg.init else None  # read once
    licence = run_licence(cfg, inherited)
    if licence == SYNTHETIC_LICENCE:
        meta = make_meta(
            voxel_size=cfg.voxel_size,
            training_data=f"{synth}; {recipe}",
            version=f"{TRAINING_VERSION}-cr{cfg.cr:g}-steps{cfg.steps}-seed{cfg.seed}",
        )
        meta["licence"] = SYNTHETIC_LICENCE
        return meta
    init = f"fine-tuned from {Path(cfg.init).name}; " if cfg.init else ""
    mix = f", {cfg.scene_mix:.0%} scene-mixed" if cfg.scene_mix > 0 else ""
    if cfg.real_frames:
        scans = (
            "SemanticKITTI scans {} (CC BY-NC-SA 4.0; "
            if is_shared(cfg.real_dir)
            else f"own labelled scans {{}} of {cfg.real_dir} ("
        ).format(", ".join(cfg.real_frames))
        data = (
            f"{init}{scans}{cfg.real_share:.0%} of batch slots, {cfg.paste} pasted instances a "
            f"frame, {cfg.crop_degrees:g} degree wedges{mix}) mixed with {synth}"
        )
    else:  # an --init trained on real scans, fine-tuned on synthetic ones
        data = f"fine-tuned from {Path(cfg.init).name} ({inherited}) on {synth}"
    meta = make_meta(
        voxel_size=cfg.voxel_size,
        training_data=(
            f"{data}; model selection on {', '.join(frames_in_role(VALIDATION, cfg.real_dir))} "
            f"(never trained on); {recipe}"
        ),
        version=f"{REAL_VERSION}-cr{cfg.cr:g}-steps{cfg.steps}-seed{cfg.seed}",
    )
    meta["licence"] = licence
    return meta
