"""What the routers share: the service state, errors as JSON, typed dependencies, API keys."""
from __future__ import annotations

import base64
import binascii
import hmac
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel

from app.service.config import Settings
from app.service.metrics import Metrics


class ServiceError(Exception):
    """Answered as JSON {"error": code, "detail": detail} with `status` (and `headers`)."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers or {}


class ErrorBody(BaseModel):
    error: str
    detail: str


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    device: str = "cpu"
    pipeline: Any = None
    worker: Any = None
    model_name: str = ""
    model_version: str = ""
    class_names: list[str] = field(default_factory=list)
    class_colors: list[list[int]] = field(default_factory=list)
    voxel_size: float = 0.0
    input_features: list[str] = field(default_factory=list)
    grouping_file: str | None = None
    ready: bool = False
    draining: bool = False
    load_error: str | None = None
    in_flight: int = 0
    observe: Any = None               # app.service.observe.Observability (traces, log, ring)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def model_tag(self) -> str:
        return f"{self.model_name}:{self.model_version}"

    def retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_s)}

    def require_ready(self) -> None:
        if self.draining:
            raise ServiceError(503, "draining", "the server is shutting down",
                               self.retry_after())
        if not self.ready:
            detail = (f"model failed to load: {self.load_error}" if self.load_error
                      else "the model is still loading")
            raise ServiceError(503, "not_ready", detail, self.retry_after())


def get_service(request: Request) -> ServiceState:
    return request.app.state.service


Service = Annotated[ServiceState, Depends(get_service)]


def get_settings(service: Service) -> Settings:
    return service.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def require_api_key(request: Request, settings: SettingsDep) -> None:
    """Authorization: Bearer <key> when LIDARSEG_API_KEYS is set (constant-time compare)."""
    if not settings.api_keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip().encode()
    if scheme.lower() == "basic":  # a browser (the dashboard): any user name, the key as password
        try:
            token = base64.b64decode(token, validate=True).partition(b":")[2]
        except (binascii.Error, ValueError):
            token = b""
        scheme = "bearer"
    ok = False
    if scheme.lower() == "bearer" and token:
        for key in settings.api_keys:  # compare with every key: timing does not reveal which
            ok |= hmac.compare_digest(token, key.encode())
    if not ok:
        raise ServiceError(401, "unauthorized", "missing or invalid API key "
                           "(Authorization: Bearer <key>)", {"WWW-Authenticate": "Bearer"})


ApiKey = Depends(require_api_key)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text} for code, text in (
        (400, "Malformed body or parameters"), (401, "Missing or invalid API key"),
        (413, "Body over the size limit, or too many points"), (415, "Unknown format"),
        (422, "Unusable values (no finite point, coordinates out of range)"),
        (503, "Queue full, starting or draining (see Retry-After)"),
        (504, "Deadline passed before the frame was segmented"))}
