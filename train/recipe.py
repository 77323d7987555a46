"""The shipped models' recipes, each one command: the runs that made the file, then the file.

    python -m train.recipe default --out runs/default [--threads 2] [--smoke] [--print]
    python -m train.recipe synthetic --out runs/synthetic

A recipe is a chain of `python -m train.train` runs (stages), each in its own folder under
--out and each (after the first) starting from the previous stage's best.pt, and then the
shipped file: DIR/<the file's name in models/weights> (fp16, with the meta the shipped file
carries) and its metrics beside it (`python -m train.evaluate`, as for the shipped one).
Run the command again after an interruption: finished stages (their model.pt exists) are
skipped and an unfinished one resumes from its last.pt (exactly: train/train.py). DIR/recipe.json
records what the folder is for, and a folder made for another recipe (or another --smoke) is
refused. --smoke runs each stage for 2 steps on small frames and scores the file on the
validation frames and two synthetic ones (a check of the chain in seconds; its file is not a
model anyone should ship). --print lists the commands instead of running them.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from models.checkpoints import load_checkpoint, save_checkpoint
from models.weights import WEIGHTS, metrics_path

from . import evaluate
from . import train as train_mod
from .real import TRAINING_POOL

PREVIOUS = "previous"  # Stage.init: the previous stage's best.pt
SMOKE_FLAGS = ("--steps", "2", "--val-every", "2", "--ckpt-every", "1", "--max-points", "20000")
SMOKE_EVAL_FRAMES = 2


@dataclass(frozen=True)
class Stage:
    name: str  # its folder under --out
    flags: tuple[str, ...]  # train.train's flags, without --out, --init and --threads
    init: str | None = PREVIOUS  # PREVIOUS, a checkpoint path, or None (random weights)


@dataclass(frozen=True)
class Recipe:
    weights: str  # the name in models.weights.WEIGHTS whose file this recipe makes
    stages: tuple[Stage, ...]
    take: str  # the last stage's checkpoint that is shipped: "best.pt" or "model.pt"
    eval_flags: tuple[str, ...]  # train.evaluate's flags for the metrics beside the file
    version: str | None = None  # the shipped file's version, less the "-best<step>" it keeps
    training_data: str | None = None  # the shipped file's, where the last run's says too little


def _real_flags(steps: int, lr: str, seed: int, frames: str, val_every: int) -> tuple[str, ...]:
    """The flags every stage of the `default` recipe shares, and those that differ."""
    return tuple(
        f"--cr 0.5 --voxel-size 0.1 --steps {steps} --batch 2 --lr {lr} --seed {seed} "
        f"--train-seeds 32 --real-frames {frames} --real-share 0.75 --paste 4 "
        f"--crop-degrees 180 --val-every {val_every} --ckpt-every 10".split()
    )


URBAN = "seq00_000100"  # the pool's one urban scan; stage 3 gives it half of the real slots
RURAL = [name for name in TRAINING_POOL if name != URBAN]
SCENE_BALANCED = ",".join(RURAL + [URBAN] * len(RURAL))
DEFAULT_TRAINING_DATA = (
    "fine-tuned in three stages from minkunet_synth.pt (stage 1: 400 steps, seed 0, peak LR "
    "2e-3; stage 2: 500 steps from stage 1's best, seed 2, peak LR 5e-4; stage 3: 400 steps "
    "from stage 2's best, seed 3, peak LR 3e-4, real slots balanced between the two scenes of "
    "the pool); SemanticKITTI scans seq04_000000, seq04_000001, seq04_000002, seq04_000003, "
    "seq04_000004, seq04_000005, seq00_000100 (CC BY-NC-SA 4.0; 75% of batch slots, 4 pasted "
    "instances a frame, 180 degree wedges) mixed with synthetic seeds 0..31 (synth.generate, "
    "profile hdl64); held-out seeds from 1000000; model selection on seq00_000000, "
    "spvnas_000000 (never trained on); batch 2, voxel 0.1 m, class weights sqrt-inv"
)
RECIPES = {
    "default": Recipe(
        "default",
        (
            Stage("stage1", _real_flags(400, "2e-3", 0, "pool", 25), str(WEIGHTS["synthetic"])),
            Stage("stage2", _real_flags(500, "5e-4", 2, "pool", 50)),
            Stage("stage3", _real_flags(400, "3e-4", 3, SCENE_BALANCED, 50)),
        ),
        take="best.pt",
        eval_flags=("--frames", "20", "--training-frames"),
        version="real-v3-cr0.5-stage3-scenebal-steps400-seed3",
        training_data=DEFAULT_TRAINING_DATA,
    ),
    "synthetic": Recipe(
        "synthetic",
        (
            Stage(
                "synth",
                tuple(
                    "--cr 0.5 --steps 4200 --batch 2 --lr 2e-3 --train-seeds 100000 "
                    "--ckpt-every 100 --voxel-size 0.1".split()
                ),
                init=None,
            ),
        ),
        take="model.pt",
        eval_flags=("--frames", "50"),
    ),
}


def stage_argv(recipe: Recipe, out: Path, index: int, threads: int | None, smoke: bool) -> list:
    """train.train's argv for stage `index` (later flags win, so --smoke's come last)."""
    stage = recipe.stages[index]
    argv = ["--out", str(out / stage.name), *stage.flags]
    if stage.init == PREVIOUS:
        if index == 0:
            raise ValueError(f"recipe {recipe.weights!r}: its first stage has no previous stage")
        argv += ["--init", str(out / recipe.stages[index - 1].name / "best.pt")]
    elif stage.init is not None:
        argv += ["--init", stage.init]
    if threads:
        argv += ["--threads", str(threads)]
    return argv + list(SMOKE_FLAGS if smoke else ())


def shipped_path(recipe: Recipe, out: Path) -> Path:
    return out / WEIGHTS[recipe.weights].name


def commands(recipe: Recipe, out: Path, threads: int | None = None, smoke: bool = False):
    """Every command the recipe runs, as one shell line each (--print)."""
    lines = [
        shlex.join(
            ["python", "-m", "train.train"]
            + [_shown(a) for a in stage_argv(recipe, out, i, threads, smoke)]
        )
        for i in range(len(recipe.stages))
    ]
    last = out / recipe.stages[-1].name / recipe.take
    lines.append(f"# then {last} -> {shipped_path(recipe, out)}: fp16, the recipe's meta (ship)")
    lines.append(shlex.join(["python", "-m", "train.evaluate", *eval_argv(recipe, out, smoke)]))
    return lines


def _shown(arg: str) -> str:
    """A path under the working folder as a relative one (the synthetic weights: --print)."""
    path = Path(arg)
    return (
        str(path.relative_to(Path.cwd()))
        if path.is_absolute() and path.is_relative_to(Path.cwd())
        else arg
    )


def eval_argv(recipe: Recipe, out: Path, smoke: bool) -> list:
    """train.evaluate's argv for the shipped file; --smoke's scores the validation frames and
    SMOKE_EVAL_FRAMES synthetic ones only."""
    path = shipped_path(recipe, out)
    flags = ("--frames", str(SMOKE_EVAL_FRAMES)) if smoke else recipe.eval_flags
    return ["--weights", str(path), *flags, "--json", str(metrics_path(path))]


def claim_folder(recipe: Recipe, out: Path, smoke: bool) -> None:
    """Writes DIR/recipe.json, or refuses a folder that another recipe (or mode) made."""
    record = {"recipe": recipe.weights, "smoke": smoke, "stages": [s.name for s in recipe.stages]}
    path = out / "recipe.json"
    if path.is_file():
        found = json.loads(path.read_text())
        if found != record:
            raise SystemExit(f"{out} holds the runs of {found}, not of {record}: use another --out")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record) + "\n")


def ship(recipe: Recipe, out: Path) -> Path:
    """The last stage's chosen checkpoint as the shipped file: fp16, with the recipe's version
    (and the step a best.pt was taken at: "-best350") and training data."""
    model, meta = load_checkpoint(out / recipe.stages[-1].name / recipe.take)
    if recipe.version is not None:
        at = re.search(r"-best\d+$", meta["version"])
        meta["version"] = recipe.version + (at.group(0) if at else "")
    if recipe.training_data is not None:
        meta["training_data"] = recipe.training_data
    path = shipped_path(recipe, out)
    save_checkpoint(path, model, meta, half=True)
    return path


def run(recipe: Recipe, out: Path, threads: int | None = None, smoke: bool = False, log=print):
    """Runs (or continues) every stage, then writes the shipped file and its metrics."""
    claim_folder(recipe, out, smoke)
    for i, stage in enumerate(recipe.stages):
        folder = out / stage.name
        if (folder / "model.pt").is_file():
            log(f"{stage.name}: finished before, skipped")
            continue
        argv = stage_argv(recipe, out, i, threads, smoke)
        if (folder / "last.pt").is_file():
            argv.append("--resume")
        log(f"{stage.name}: python -m train.train {shlex.join(argv)}")
        train_mod.main(argv)
    path = ship(recipe, out)
    log(f"shipped file: {path}")
    evaluate.main(eval_argv(recipe, out, smoke))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m train.recipe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("recipe", choices=sorted(RECIPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--smoke", action="store_true", help="2 steps a stage on small frames")
    ap.add_argument("--print", action="store_true", help="list the commands, run nothing")
    a = ap.parse_args(argv)
    recipe, out = RECIPES[a.recipe], Path(a.out)
    if a.print:
        print("\n".join(commands(recipe, out, a.threads, a.smoke)))
        return 0
    run(recipe, out, a.threads, a.smoke, log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
