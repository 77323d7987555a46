"""A request body -> checked points: the codec, the limits, the range policy and the cleaning of
extra columns; on the decode pool (at most LIDARSEG_DECODE_CONCURRENCY at once, beyond: 503),
except a raw float32 body of at most INLINE_DECODE_BYTES, which decodes on the event loop: a view
of the body and one kernel pass (about 0.5 ms for 125k points) cost less than the pool's hand-over
(about 0.6 ms on the 2-core box).
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

import numpy as np

from app.codecs import DecodeError, binary, decode
from app.codecs.sniff import content_type_format
from app.inference.cleaning import clean_frame
from app.inference.voxel_config import Valid
from app.service.state import ServiceError, ServiceState

log = logging.getLogger("lidarseg")

INLINE_DECODE_BYTES = 4 << 20  # 262,144 KITTI points


def decodes_inline(fmt: str | None, content_type: str | None, size: int) -> bool:
    """Whether a body is raw float32 records (kitti, ouster, nuscenes, xyz: by the format asked
    for, else the content type) of at most INLINE_DECODE_BYTES."""
    if size > INLINE_DECODE_BYTES:
        return False
    name = fmt.strip().lower() if fmt is not None else content_type_format(content_type)
    return name in binary.LAYOUTS


class Decoded(NamedTuple):
    """A request body decoded and checked (decode_frame)."""

    points: np.ndarray  # float32 [N, >=3], extra columns cleaned
    sensor: str  # the intensity convention
    valid: Valid  # valid_mask's result, computed once, for the pipeline
    cleaned: int  # points whose intensity or later columns were clamped or zeroed


class Posted(NamedTuple):
    """A request's body and what the request says about it."""

    body: bytes
    fmt: str | None  # the `format` parameter
    content_type: str | None
    request_id: str
    sensor: str | None = None  # the `sensor` parameter


async def decode_body(service: ServiceState, posted: Posted) -> Decoded:
    """A request body decoded and checked: decode_frame, inline or on the decode pool."""
    if decodes_inline(posted.fmt, posted.content_type, len(posted.body)):
        return decode_frame(service, posted)
    return await decode_in_pool(service, posted)


def check_points(
    service: ServiceState, points: np.ndarray, sensor: str
) -> tuple[np.ndarray, Valid, int]:
    """(points, valid_mask's result, how many points were cleaned): the frame checked against
    the limits and the range policy, its extra columns cleaned (copied only where the validity
    pass found a row to clean); the mask goes with it to the pipeline (computed once)."""
    settings = service.settings
    if not isinstance(points, np.ndarray) or points.ndim != 2 or points.shape[1] < 3:
        shape = getattr(points, "shape", None)
        raise ServiceError(422, "bad_points", f"points must be [N, >=3], got {shape}")
    if len(points) > settings.max_points:
        raise ServiceError(
            413,
            "too_many_points",
            f"{len(points)} points; the limit is {settings.max_points} (LIDARSEG_MAX_POINTS)",
        )
    points = np.ascontiguousarray(points, dtype=np.float32)
    cfg = service.pipeline.voxel_config
    points, valid, unclean = clean_frame(points, cfg, sensor)
    ignored = valid[1]
    if ignored["non_finite"] == len(points):
        raise ServiceError(
            422, "no_finite_points", f"none of the {len(points)} points has finite x, y, z"
        )
    if settings.range_policy == "reject" and ignored["out_of_range"]:
        raise ServiceError(
            422,
            "out_of_range",
            f"{ignored['out_of_range']} points lie outside |x|, |y| <= "
            f"{cfg.max_xy} m, z in {list(cfg.z_range)} m (range policy 'reject')",
        )
    return points, valid, unclean


def decode_frame(service: ServiceState, posted: Posted) -> Decoded:
    body, fmt, content_type, request_id, sensor = posted
    if not body:
        raise ServiceError(400, "empty_body", "the request body is empty: post one frame")
    try:
        frame = decode(
            body, fmt, content_type, max_points=service.settings.max_points, sensor=sensor
        )
    except DecodeError as e:
        raise ServiceError(e.status, e.code, e.detail) from None
    except Exception:  # noqa: BLE001 - a codec that trips on bad input is still bad input
        log.exception("request %s: unexpected decode failure", request_id)
        raise ServiceError(
            400, "malformed_body", f"the body could not be decoded (request id {request_id})"
        ) from None
    points, valid, cleaned = check_points(service, frame.points, frame.sensor)
    return Decoded(points, frame.sensor, valid, cleaned)


async def decode_in_pool(service: ServiceState, posted: Posted):
    """decode_frame on the decode pool, holding one of its slots (503 when none is free)."""
    if service.decoding >= service.settings.decode_slots:
        raise ServiceError(
            503,
            "decoders_busy",
            "server busy: every decode slot is taken (LIDARSEG_DECODE_CONCURRENCY)",
            service.retry_after(),
        )
    service.decoding += 1
    try:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(service.decoder, decode_frame, service, posted)
    finally:
        service.decoding -= 1
