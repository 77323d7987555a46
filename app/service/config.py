"""Service settings: every field is also the environment variable LIDARSEG_<FIELD>.

Bad values fail at start-up (pydantic validation), never on the first request. A LIDARSEG_*
variable that nothing reads (a misspelt setting) is named in a warning at start-up
(unread_variables).
"""

from __future__ import annotations

import difflib
import functools
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PREFIX = "LIDARSEG_"  # of every setting's environment variable


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    weights: str = "default"  # see models/weights: default, synthetic, random, a path
    cr: float = Field(1.0, gt=0, le=4)  # channel ratio of the random model (tests use 0.25)
    precision: Literal["auto", "fp32", "bf16", "int8"] = (
        "auto"  # CPU arithmetic (kernels/precision.py)
    )
    # CUDA: the ordered scatter, no float atomics: bitwise-repeatable labels (the CPU always is)
    deterministic: bool = False

    threads: int = Field(0, ge=0)  # compute threads; 0: cgroup quota, else CPUs
    queue_size: int = Field(16, ge=1)  # requests waiting for the worker, beyond: 503
    deadline_s: float = Field(30.0, gt=0)  # from arrival: body, decode, queue, inference; 504
    max_batch: int = Field(4, ge=1, le=64)  # frames per pipeline.run
    max_wait_ms: float = Field(0.0, ge=0, le=1000)  # wait this long for more frames to batch
    retry_after_s: int = Field(1, ge=1)  # Retry-After on 503

    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    # bodies read or held at once (from the first byte to the answer), beyond: 503
    max_bodies_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    max_points: int = Field(2_000_000, ge=1)
    range_policy: Literal["ignore", "reject"] = "ignore"
    api_keys: Annotated[tuple[str, ...], NoDecode] = ()  # comma-separated in the environment
    open_docs: bool = False  # /docs, /openapi.json open even with API keys

    # limits and timeouts (README "Limits and hardening")
    decode_concurrency: int = Field(0, ge=0)  # decodes at once, beyond: 503; 0: thread count
    body_timeout_s: float = Field(30.0, gt=0)  # the whole body must arrive within: else 408
    header_timeout_s: float = Field(10.0, gt=0)  # request line + headers within: else closed
    idle_timeout_s: float = Field(5.0, gt=0)  # keep-alive connection idle: closed
    max_connections: int = Field(256, ge=1)  # connections + requests at once, beyond: 503
    # SIGTERM to exit: a drain, then 5 s to close (app/service/server.py CLOSE_RESERVE_S)
    shutdown_budget_s: float = Field(25.0, ge=6, le=300)
    trim_after_points: int = Field(100_000, ge=0)  # malloc_trim after this many points; 0: off
    # ... once the worker has had no job for this long: a pause, not the gap between two frames
    # of a slow stream (the frame after a trim maps its buffers again: README, "Memory flat")
    trim_idle_s: float = Field(5.0, gt=0)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    # observability (app/service/observe.py); traces are switched on by the OTEL_* variables
    access_log: Literal["auto", "json", "text", "off"] = "auto"  # auto: text on a terminal
    exemplars: bool = True  # trace ids on histogram observations
    dashboard_requests: int = Field(200, ge=0, le=100_000)  # recent requests kept; 0: none
    dashboard_points_mb: float = Field(64.0, ge=0)  # their points for the 3D view; 0: none

    @field_validator("port", mode="before")
    @classmethod
    def _not_a_service_link(cls, v):
        if isinstance(v, str) and "://" in v:
            raise ValueError(
                f"{v!r} is not a port: Kubernetes sets LIDARSEG_PORT=tcp://IP:PORT in every pod of "
                "a namespace with a Service named lidarseg, unless the pod spec says "
                "enableServiceLinks: false (deploy/k8s does)"
            )
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_level(cls, v):
        return v.lower() if isinstance(v, str) else v

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v):
        if isinstance(v, str):
            v = [k.strip() for k in v.split(",")]
        keys = tuple(k for k in (v or ()) if k)
        for k in keys:
            if len(k) < 8:
                raise ValueError("every API key needs at least 8 characters")
        return keys

    @field_validator("weights")
    @classmethod
    def _weights_exist(cls, v):
        from models.weights import parse_weights

        try:
            parse_weights(v)
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
        return str(v)

    @model_validator(mode="after")
    def _one_body_fits_the_bodies(self):
        if self.max_bodies_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_bodies_bytes ({self.max_bodies_bytes}) must hold at least one body of "
                f"max_body_bytes ({self.max_body_bytes})"
            )
        return self

    @model_validator(mode="after")
    def _device_available(self):
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("device 'cuda' requested but no CUDA device is available")
        if self.torch_device == "cpu":  # on CUDA the CPU precision is not used
            from kernels.precision import offered

            offered(self.precision)  # int8 without AVX2, bf16 without native bf16: refused
        return self

    @property
    def torch_device(self) -> str:
        if self.device == "auto":
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    @functools.cached_property
    def compute_threads(self) -> int:
        """LIDARSEG_THREADS, else the box's (read once: the routes ask on every request, and the
        cgroup files cost about 0.15 ms a read)."""
        from app.threads import default_threads

        return self.threads or default_threads()

    @functools.cached_property
    def decode_slots(self) -> int:
        return self.decode_concurrency or self.compute_threads


# LIDARSEG_* variables read outside Settings: the kernels' build and run (kernels/toolchain.py,
# build.py, backend.py, chunking.py), the client's key (app/client.py), CI and the image scripts.
OTHER_VARIABLES = frozenset(
    {
        "LIDARSEG_API_KEY",
        "LIDARSEG_BUILD_DIR",
        "LIDARSEG_BUILD_JOBS",
        "LIDARSEG_CI_SKIP_AARCH64",
        "LIDARSEG_CI_SKIP_IMAGE",
        "LIDARSEG_CPU_ARCH",
        "LIDARSEG_CPU_ISA",
        "LIDARSEG_CUDA_ARCHS",
        "LIDARSEG_CUDA_SYNC",
        "LIDARSEG_CXXFLAGS",
        "LIDARSEG_ENGINE_SCRATCH_MB",
        "LIDARSEG_IMAGE_CACHE",
        "LIDARSEG_KERNEL_BUILD",
        "LIDARSEG_PUBLISH",  # deploy/compose.yaml: the host address its ports are published on
        "LIDARSEG_WHEELS",
    }
)


def unread_variables(environ) -> list[str]:
    """A warning for each LIDARSEG_* variable in `environ` that nothing reads: pydantic-settings
    ignores them, so a misspelt setting (LIDARSEG_MAX_BATCHES) would be silently without effect."""
    known = {f"{PREFIX}{name.upper()}" for name in Settings.model_fields} | OTHER_VARIABLES
    warnings = []
    for name in sorted(n for n in environ if n.startswith(PREFIX) and n not in known):
        if name.startswith(("LIDARSEG_SERVICE_", "LIDARSEG_PORT_")):
            hint = (
                "a Kubernetes service link (enableServiceLinks: false in the pod spec stops them)"
            )
        else:
            close = difflib.get_close_matches(
                name[len(PREFIX) :], [k[len(PREFIX) :] for k in known]
            )
            hint = f"did you mean {PREFIX}{close[0]}?" if close else "no setting has this name"
        warnings.append(f"{name} is not a lidarseg setting, ignored: {hint}")
    return warnings
