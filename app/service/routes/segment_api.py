"""POST /v1/segment as OpenAPI describes it: the request body's media types, the query
parameters (read and checked by segment.query_options, not by FastAPI) and the responses."""

from __future__ import annotations

from pydantic import BaseModel

from app.codecs import FORMATS, SENSORS
from app.service.routes.deps import ERROR_RESPONSES
from app.service.routes.waiting import DEADLINE_HEADER, STREAM_HEADER, STREAM_ID

FORMAT_MAX_LENGTH = 32
DETAILS = ("layers",)  # `detail` values

PARAMETERS = [
    {
        "name": DEADLINE_HEADER,
        "in": "header",
        "required": False,
        "description": "This frame's deadline in milliseconds from its arrival, when shorter "
        "than the server's LIDARSEG_DEADLINE_S: a frame that cannot be answered in time is "
        "refused at once or dropped unrun (504), never answered late. A robot at 10 Hz sends "
        "about 100-200: a stale frame is worth less than the next scan.",
        "schema": {"type": "number", "exclusiveMinimum": 0},
    },
    {
        "name": STREAM_HEADER,
        "in": "header",
        "required": False,
        "description": "The sensor stream this frame belongs to (one id per LiDAR): its older "
        "frames still waiting in the queue are dropped unrun when it arrives and answered 409 "
        "`superseded`, so that a server running behind works on the newest scan (a frame "
        "already running is answered as usual).",
        "schema": {"type": "string", "pattern": f"^{STREAM_ID.pattern}$"},
    },
    {
        "name": "format",
        "in": "query",
        "required": False,
        "description": f"Wire format ({', '.join(FORMATS)}); else inferred",
        "schema": {
            "anyOf": [{"type": "string", "maxLength": FORMAT_MAX_LENGTH}, {"type": "null"}],
            "title": "Format",
        },
    },
    {
        "name": "sensor",
        "in": "query",
        "required": False,
        "description": "The intensity convention of the frame: kitti (0..1), nuscenes or "
        "ouster (0..255). Default: the raw format's, else 0..255 when at least 1 % of the "
        "intensities exceed 1. The answer says which was used (X-Sensor, `sensor`).",
        "schema": {
            "anyOf": [{"type": "string", "enum": list(SENSORS)}, {"type": "null"}],
            "title": "Sensor",
        },
    },
    {
        "name": "detail",
        "in": "query",
        "required": False,
        "description": "`layers` adds the per-layer network time",
        "schema": {
            "anyOf": [{"type": "string", "enum": list(DETAILS)}, {"type": "null"}],
            "title": "Detail",
        },
    },
]

_BINARY_SCHEMA = {"type": "string", "format": "binary"}
REQUEST_BODY = {
    "required": True,
    "description": "One frame. Raw binary (format from the `format` parameter, else inferred "
    "from Content-Type and magic bytes), a multipart form with one file part, or "
    "JSON (decoded as format `json`).",
    "content": {
        "application/octet-stream": {"schema": _BINARY_SCHEMA},
        "application/x-kitti": {"schema": _BINARY_SCHEMA},
        "application/x-ouster": {"schema": _BINARY_SCHEMA},
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {"file": _BINARY_SCHEMA},
                "required": ["file"],
            }
        },
        "application/json": {
            "schema": {
                "description": "points as [[x, y, z, (intensity)], ...] or an object with a "
                "`points` array (see the codec documentation)",
                "oneOf": [
                    {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                    {"type": "object", "properties": {"points": {"type": "array"}}},
                ],
            }
        },
    },
}


class ModelRef(BaseModel):
    name: str
    version: str
    device: str


class SegmentResponse(BaseModel):
    labels: list[int]
    num_points: int
    num_voxels: int
    ignored_points: int
    cleaned_points: int
    sensor: str  # the intensity convention it was read in: kitti 0..1, nuscenes / ouster 0..255
    classes: list[str]
    class_counts: dict[str, int]
    timing_ms: dict[str, float]
    model: ModelRef
    request_id: str
    batch_size: int
    layer_ms: dict[str, float] | None = None


# The headers of a segment answer (JSON and binary alike), as /openapi.json lists them
ANSWER_HEADERS = {
    "X-Request-Id": "the request's id (the client's X-Request-Id when sane, else a new one)",
    "X-Model": "name:version of the model that ran",
    "X-Num-Points": "points in the frame (one label each)",
    "X-Num-Voxels": "voxels the network ran on",
    "X-Ignored-Points": "points outside the range or not finite (label 255)",
    "X-Cleaned-Points": "points whose intensity was clamped or replaced",
    "X-Sensor": "the intensity convention the frame was read in (kitti, nuscenes, ouster)",
    "X-Batch-Size": "frames in the forward this one ran in",
}

RESPONSES = {
    200: {
        "description": "Labels: JSON (default), or N uint8 bytes with Accept: "
        "application/octet-stream; the same headers on both",
        "headers": {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in ANSWER_HEADERS.items()
        },
        "content": {
            "application/json": {"schema": SegmentResponse.model_json_schema()},
            "application/octet-stream": {"schema": _BINARY_SCHEMA},
        },
    },
    **ERROR_RESPONSES,
}
