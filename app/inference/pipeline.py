"""The in-process pipeline the service calls: points -> voxels -> maps -> MinkUNet -> labels.

Each stage is timed (voxelize, maps, network, devoxelize), with CUDA synchronisation so GPU times
are true; `layer_timing=True` adds a per-layer breakdown of the network time (the clocks:
clocks.py). The voxels' classes
(the argmax of the logits) count to the network stage where the CPU head and argmax run as one
pass (no logits kept), else to devoxelize, which then also holds the gather back to the points.
"""

from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from kernels import openmp
from kernels import precision as precision_mod
from kernels.deferred import AssumptionFailed, calls_deferred
from kernels.rows import argmax_rows_u8, head_columns, linear_argmax_u8
from models import EngineConfig, SparseTensor
from models.fold import classes_in_last_conv, fold_batchnorm, head_blocks, runs_deferred
from models.labels import IGNORE_LABEL
from models.minkunet import MinkUNet

from app.inference.cleaning import clean_frame
from app.inference.clocks import StageClock, layer_clock
from app.inference.voxel_config import VoxelizeConfig, per_frame
from app.inference.voxelize import devoxelize, voxelize

# Every stage a request goes through, in order: the single source of the names the service's
# timing (JSON, Server-Timing), its metrics and the tests use. The pipeline times PIPELINE_STAGES;
# the service times receive (the body's arrival from the route's start: a slow upload), decode,
# queue and encode around it (and reports their "total").
PIPELINE_STAGES = ("voxelize", "maps", "network", "devoxelize")
STAGES = ("receive", "decode", "queue", *PIPELINE_STAGES, "encode")


@dataclass
class FrameResult:
    labels: np.ndarray  # uint8 [N]: class id per input point, 255 = ignored
    num_points: int
    num_voxels: int
    ignored: dict[str, int]
    timing_ms: dict[str, float]
    layer_ms: dict[str, float] | None = None
    voxel_logits: torch.Tensor | None = field(default=None, repr=False)
    point_to_voxel: torch.Tensor | None = field(default=None, repr=False)

    @property
    def ignored_points(self) -> int:
        return sum(self.ignored.values())


def voxel_classes(logits: torch.Tensor) -> torch.Tensor:
    """The class of every voxel (argmax of its logits) on the CPU, in one copy per batch; our
    kernel's one pass on CPU float32 logits, else torch's."""
    if not len(logits):
        return torch.zeros(0, dtype=torch.long)
    fast = argmax_rows_u8(logits)
    return fast if fast is not None else logits.argmax(dim=1).cpu()


def voxels_per_frame(coords: torch.Tensor, frames: int) -> list[int]:
    """Voxel rows of each frame of a batch: the rows ascend by batch index, so a search for
    each frame's first row (a bincount took 0.2 ms). One frame has them all: no search (the
    column copy and search cost about 0.5 ms right after the network, 7 us warm)."""
    if frames == 1:
        return [coords.shape[0]]
    batch_of_row = coords[:, 0].contiguous()
    frame_ids = torch.arange(frames + 1, dtype=batch_of_row.dtype)
    return torch.searchsorted(batch_of_row, frame_ids.to(batch_of_row.device)).diff().tolist()


class SegmentationPipeline:
    """The timed stages for one model on one device. Build it with app.inference.builder
    (build_pipeline), which sets voxel_config and meta from the checkpoint."""

    def __init__(
        self,
        model: MinkUNet,
        voxel_config: VoxelizeConfig | None = None,
        device: str | torch.device = "cpu",
        engine: EngineConfig | None = None,
        precision: str | None = None,
        meta: dict | None = None,
        deterministic: bool = False,
    ):
        """precision: auto (None), fp32, bf16 or int8 on the CPU (kernels/precision.py);
        deterministic: CUDA's ordered scatter (kernels/grouped.py); an `engine` given keeps its
        own."""
        self.device = torch.device(device)
        self.meta = dict(meta or {})  # class names and colours, name, version (builder.py)
        self.model = model.to(self.device).eval()
        # What runs: a copy with BatchNorm (and its ReLU) folded into the convs, made once here,
        # so later changes to `model` do not reach it (models/fold.py).
        self.network = fold_batchnorm(self.model)
        self._head_blocks = head_blocks(self.network)  # where int8 runs the head (network_stage)
        # the network stage's kernel calls wait and run together (kernels/deferred.py)
        self.defer_calls = self.device.type == "cpu" and runs_deferred(self.network)
        self.voxel_config = voxel_config or VoxelizeConfig()
        self.requested_precision = precision_mod.validate(precision)
        requests = getattr(self.model, "map_requests", None)
        self._map_requests: tuple = requests() if requests is not None else ()
        self.engine = engine or EngineConfig(
            precision=precision_mod.resolve(precision, self.device), deterministic=deterministic
        )
        self._maps_helper: Executor | None = None  # made at the first CPU frame on 2+ threads
        self._last_frame: tuple | None = None  # the last run's voxels, maps, logits: release()

    @property
    def deterministic(self) -> bool:
        """Whether a frame's labels are bitwise the same run to run: always on the CPU (no float
        atomics there), on CUDA with the ordered scatter."""
        return self.device.type == "cpu" or self.engine.deterministic

    @property
    def precision(self) -> str:
        """What the network runs in: fp32 or bf16 on the CPU, the model's dtype elsewhere."""
        if self.device.type != "cpu":
            return {torch.float16: "fp16"}.get(next(self.model.parameters()).dtype, "fp32")
        return self.engine.precision

    def map_requests(self) -> tuple:
        """The kernel maps the network uses (models.sparse_tensor.MapRequest): the maps stage
        builds exactly these, so the network stage builds no map and no hash table. A model
        without map_requests() builds its maps as its layers first need them. Found once, as
        the network is made once (walking the model's modules costs about 0.2 ms)."""
        return self._map_requests

    @torch.no_grad()
    def run(
        self,
        frames: list[np.ndarray],
        sensor: str | list[str] = "kitti",
        layer_timing: bool = False,
        keep_logits: bool = False,
        valid: list | None = None,
    ) -> list[FrameResult]:
        """Segments several frames as one batch (`sensor`: one name, or one per frame); one
        result per frame, N labels each. `valid`: per frame, valid_mask's result if the caller
        has it already (the service checks and cleans frames before queueing), else None: the
        frames are cleaned here (cleaning.clean_frame), in the voxelize stage."""
        self.release()  # the last frame's maps go before this one's are made: peak as before
        clock = StageClock(self.device)
        with clock.stage("voxelize"):
            if valid is None:
                frames, valid = self._cleaned(frames, sensor)
            batch = voxelize(frames, self.voxel_config, sensor, self.device, valid)
        dtype = next(self.model.parameters()).dtype  # fp16 models (CUDA) take fp16 features
        x = SparseTensor(batch.feats.to(dtype), batch.coords, engine=self.engine)
        with clock.stage("maps"):
            if len(batch.coords):
                x.manager.prepare(self.map_requests(), self._second_chain())
        layer_ms, logits, voxel_labels = None, None, None
        with clock.stage("network"):
            if not len(batch.coords):
                logits = batch.feats.new_zeros(0, self.model.config.num_classes)
            elif layer_timing:
                with layer_clock(self.network, self.device) as layer_ms:
                    logits = self.network(x).feats
                layer_ms = dict(layer_ms)
            elif keep_logits:
                logits = self.network(x).feats
            else:
                logits, voxel_labels = self.network_stage(x)
        results = []
        with clock.stage("devoxelize"):
            if voxel_labels is None:
                assert logits is not None
                voxel_labels = voxel_classes(logits)
            rows = voxels_per_frame(batch.coords, len(frames))
            for b, (points, mapping) in enumerate(zip(frames, batch.point_to_voxel)):
                labels = devoxelize(voxel_labels, mapping, IGNORE_LABEL)
                results.append(
                    FrameResult(
                        labels,
                        len(points),
                        rows[b],
                        batch.ignored[b],
                        {},
                        layer_ms,
                        logits if keep_logits else None,
                        mapping if keep_logits else None,
                    )
                )
        for result in results:  # stage times are shared by the frames of one batch
            result.timing_ms = dict(clock.ms)
        self._last_frame = (batch, x, logits, voxel_labels)
        return results

    def release(self) -> None:
        """Frees the last run's voxels, maps and features: a few hundred tensors and objects,
        0.25-0.3 ms on a Zen 1 core. run() keeps them past its return, so that a caller that
        hands the results on (the service's worker) frees them after the hand-over, while it
        waits for the next frame; the next run() frees them first in any case."""
        self._last_frame = None

    def _second_chain(self) -> Executor | None:
        """The thread that builds the maps stage's second chain of maps on the CPU (one OpenMP
        thread: models/sparse_tensor.py prepare) when the network has two threads or more to
        give it; None elsewhere (one chain, every map on every thread in turn)."""
        if self.device.type != "cpu" or torch.get_num_threads() < 2:
            return None
        if self._maps_helper is None:
            self._maps_helper = ThreadPoolExecutor(
                1, "lidarseg-maps", initializer=openmp.set_threads_here, initargs=(1,)
            )
        return self._maps_helper

    def network_stage(self, x: SparseTensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The network stage of a frame whose maps are built: (logits, None), or (None, every
        voxel's class) where the head and the argmax run as one kernel pass on the CPU
        (kernels/rows.py linear_argmax_u8: the logits are never written; about 1.4 ms against
        2.5-3 for torch's head and argmax on a KITTI frame), or in int8 inside the network's last
        conv as it makes each block of rows (models/fold.py classes_in_last_conv: neither its
        rows nor the logits are written)."""
        head, features = (
            getattr(self.network, "head", None),
            getattr(self.network, "features", None),
        )
        if not isinstance(head, nn.Linear) or features is None:
            return self.network(x).feats, None
        with classes_in_last_conv(self._head_blocks, head_columns(head.weight, head.bias)):
            y = self._features(features, x)
        classes = getattr(y, "classes", None)  # a ClassifiedOutput's (kernels/concat.py)
        if classes is None:
            classes = linear_argmax_u8(y, head.weight, head.bias)
        return (head(y), None) if classes is None else (None, classes)

    def _features(self, features, x: SparseTensor):
        """features(x).feats, its kernel calls deferred where the network allows (on the CPU the
        convs then run back to back, not each after its share of Python: 3-13 % of the
        stage); run again without deferral where a conv could not do what was assumed of it
        while it waited (rows with a NaN or an infinity)."""
        if self.defer_calls:
            try:
                with calls_deferred():
                    return features(x).feats
            except AssumptionFailed:
                self.engine.workspace.memo().clear()  # records of the run that failed
        return features(x).feats

    def _cleaned(self, frames: list[np.ndarray], sensor: str | list[str]) -> tuple[list, list]:
        """(frames, their valid_mask results): each frame cleaned as the service cleans it."""
        done = [
            clean_frame(np.ascontiguousarray(f, np.float32), self.voxel_config, s)
            for f, s in zip(frames, per_frame(sensor, len(frames)))
        ]
        return [d[0] for d in done], [d[1] for d in done]

    def segment(self, points: np.ndarray, sensor: str = "kitti", **kwargs) -> FrameResult:
        return self.run([points], sensor, **kwargs)[0]
