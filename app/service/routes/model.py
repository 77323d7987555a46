"""What the service runs: classes and colours, voxel size, input features, engine, device."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from kernels.precision import cpu_features, int8_kernel, tiles_running

from app.inference.voxelize import voxelizer
from app.service.routes.deps import ERROR_RESPONSES, ApiKey, Service
from models.labels import IGNORE_LABEL

router = APIRouter(prefix="/v1", tags=["model"], dependencies=[ApiKey])


class ClassInfo(BaseModel):
    id: int
    name: str
    color: list[int]


class EngineInfo(BaseModel):
    device: str
    grouping_plan_file: str | None  # file name (never a path); None: built-in defaults
    # labels bitwise repeatable: the CPU always, CUDA with LIDARSEG_DETERMINISTIC
    deterministic: bool
    precision: str  # what the network runs in: fp32, bf16 or int8 (CPU), fp32 / fp16
    precision_requested: str  # LIDARSEG_PRECISION: auto, fp32, bf16 or int8
    cpu_features: list[str]  # the CPU features auto chose from
    # where precision is int8: its kernel (avx512_vnni, avx_vnni or avx2; the same bits)
    int8_kernel: str | None = None
    # the precisions among the running one and its fallback whose kernels run on AMX tiles
    # (CPU only: ["int8", "bf16"] for int8 on an Intel Xeon with AMX; else empty)
    amx_tiles: list[str] = []
    # "open3d", or "torch.unique" where Open3D did not load (75x slower on the CPU; the server
    # logs why at start-up): a container missing a system library shows here
    voxelizer: str = "open3d"


class ModelInfo(BaseModel):
    name: str
    version: str
    licence: str  # terms of use of the weights (e.g. non-commercial for SemanticKITTI)
    training_data: str  # what the weights were trained on
    device: str
    classes: list[ClassInfo]
    ignore_label: int
    voxel_size: float
    input_features: list[str]
    engine: EngineInfo
    ready: bool


@router.get(
    "/model",
    response_model=ModelInfo,
    summary="The loaded model",
    responses={k: ERROR_RESPONSES[k] for k in (401, 503)},
)
async def model_info(service: Service) -> ModelInfo:
    service.require_ready()
    precision = service.pipeline.precision
    return ModelInfo(
        name=service.model_name,
        version=service.model_version,
        licence=service.model_licence,
        training_data=service.training_data,
        device=service.device,
        classes=[
            ClassInfo(id=i, name=n, color=list(c))
            for i, (n, c) in enumerate(zip(service.class_names, service.class_colors))
        ],
        ignore_label=IGNORE_LABEL,
        voxel_size=service.voxel_size,
        input_features=service.input_features,
        engine=EngineInfo(
            device=service.device,
            grouping_plan_file=service.grouping_file,
            deterministic=service.pipeline.deterministic,
            precision=precision,
            precision_requested=service.pipeline.requested_precision,
            cpu_features=list(cpu_features()),
            int8_kernel=int8_kernel() if precision == "int8" else None,
            amx_tiles=tiles_running(precision) if service.device == "cpu" else [],
            voxelizer=voxelizer(),
        ),
        ready=service.ready,
    )
