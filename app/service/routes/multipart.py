"""The one file part of a multipart/form-data body (RFC 7578), found in time linear in the body.

The body is already read whole (routes/body.py, under LIDARSEG_MAX_BODY_BYTES). Its delimiters are
found with bytes.find (C, linear); each part's headers are bounded; a delimiter must be followed by
CRLF (after optional spaces) or by "--" (the last one): RFC 2046 has the sender pick a boundary
that never occurs inside a part, so a body full of near-delimiters fails at the first. Starlette's
form parser, used before, walked such a body byte by byte on the event loop (a 60 MB body of
"\\r\\n--bnd\\r" held it 8 s) and spooled the file part to disk.
"""

from __future__ import annotations

import re

from python_multipart.multipart import parse_options_header

from app.service.state import ServiceError

MAX_PARTS = 17  # the file part and up to 16 form fields (what the route has always allowed)
MAX_BOUNDARY_BYTES = 70  # RFC 2046's limit
MAX_PART_HEADER_BYTES = 16 * 1024  # a part's header block: a name, a filename, a content type
_PADDING_THEN_CRLF = re.compile(rb"[ \t]*\r\n")


_FILENAME_STAR = re.compile(r";\s*filename\*\s*=", re.IGNORECASE)


def malformed(why: str) -> ServiceError:
    return ServiceError(400, "malformed_multipart", f"multipart body: {why}")


def one_file_part(body: bytes, content_type: str) -> tuple[bytes, str | None]:
    """(file bytes, the part's Content-Type or None) of the body's one part with a filename;
    400 malformed_multipart when there is not exactly one or the body is not well formed."""
    files = []
    for headers, start, end in _parts(body, _boundary(content_type)):
        disposition = headers.get("content-disposition", "")
        _, params = parse_options_header(disposition)
        # a filename, or RFC 5987's filename* alone (python-multipart's parser drops that one)
        if b"filename" in params or _FILENAME_STAR.search(disposition):
            _as_sent(headers)
            files.append((start, end, headers.get("content-type")))
    if len(files) != 1:
        raise malformed(f"expected exactly one file part, got {len(files)}")
    start, end, part_type = files[0]
    return body[start:end], part_type


def _as_sent(headers: dict[str, str]) -> None:
    """A file part's bytes are its content: a Content-Transfer-Encoding (base64, quoted-printable;
    RFC 7578 has senders not use one) would be read as points."""
    encoding = headers.get("content-transfer-encoding", "binary").lower()
    if encoding not in ("binary", "8bit", "7bit"):
        raise malformed(f"the file part's Content-Transfer-Encoding {encoding[:40]!r}: send it raw")


def _boundary(content_type: str) -> bytes:
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary", b"")
    if not 0 < len(boundary) <= MAX_BOUNDARY_BYTES:
        raise malformed(f"Content-Type needs a boundary of 1 to {MAX_BOUNDARY_BYTES} characters")
    return boundary


def _parts(body: bytes, boundary: bytes) -> list[tuple[dict[str, str], int, int]]:
    """Every part as (its headers, lower-case names; where its content starts; where it ends)."""
    delimiter = b"--" + boundary
    separator = b"\r\n" + delimiter  # a delimiter after the first starts on a new line
    if body.startswith(delimiter):
        pos = len(delimiter)
    else:  # a preamble first (ignored)
        found = body.find(separator)
        if found < 0:
            raise malformed("its boundary does not occur in it")
        pos = found + len(separator)
    parts: list[tuple[dict[str, str], int, int]] = []
    while not body.startswith(b"--", pos):  # "--" after a delimiter: the last (epilogue ignored)
        line_end = _PADDING_THEN_CRLF.match(body, pos)
        if line_end is None:
            raise malformed("a boundary is followed by neither a line break nor '--'")
        if len(parts) == MAX_PARTS:
            raise malformed(f"more than {MAX_PARTS} parts")
        headers, start = _part_headers(body, line_end.end())
        end = body.find(separator, start)
        if end < 0:
            raise malformed("it ends inside a part (no closing boundary)")
        parts.append((headers, start, end))
        pos = end + len(separator)
    return parts


def _part_headers(body: bytes, pos: int) -> tuple[dict[str, str], int]:
    """A part's headers from `pos` (lower-case names) and where its content starts."""
    if body.startswith(b"\r\n", pos):  # no headers
        return {}, pos + 2
    end = body.find(b"\r\n\r\n", pos, pos + MAX_PART_HEADER_BYTES + 4)
    if end < 0:
        raise malformed(f"a part's headers do not end within {MAX_PART_HEADER_BYTES} bytes")
    headers = {}
    for line in body[pos:end].decode("latin-1").split("\r\n"):  # byte for byte, as HTTP's
        name, colon, value = line.partition(":")
        if not colon:
            raise malformed(f"a part's header line has no ':' ({line[:40]!r})")
        headers[name.strip().lower()] = value.strip()
    return headers, end + 4
