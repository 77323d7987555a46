"""The multipart reader (app/service/routes/multipart.py) against bodies built here byte by byte,
and the route's 415 for a compressed body, in process."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from app.service.state import ServiceError
from app.service.routes.multipart import MAX_PART_HEADER_BYTES, MAX_PARTS, one_file_part
from tests.app.contract_helpers import (
    NUSCENES,
    WANT_BIN,
    assert_error,
    assert_good,
    frame_bytes,
    limited_serving,
)

TYPE = "multipart/form-data; boundary=bnd"


def part(name: str, content: bytes, filename: str | None = None, ctype: str | None = None):
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    headers = f"Content-Disposition: {disposition}\r\n" + (
        f"Content-Type: {ctype}\r\n" if ctype else ""
    )
    return headers.encode() + b"\r\n" + content


def body(*parts: bytes, preamble: bytes = b"", epilogue: bytes = b"") -> bytes:
    inner = b"".join(b"--bnd\r\n" + p + b"\r\n" for p in parts)
    return preamble + (b"\r\n" if preamble else b"") + inner + b"--bnd--" + epilogue


def refused(data: bytes, content_type: str = TYPE) -> str:
    with pytest.raises(ServiceError) as e:
        one_file_part(data, content_type)
    assert e.value.status == 400 and e.value.code == "malformed_multipart"
    return e.value.detail


def test_the_file_part_among_fields_preamble_and_epilogue():
    data = bytes(range(256)) * 3 + b"\r\n--bn"  # content may hold a delimiter's beginning
    posted = body(
        part("note", b"x" * 100),
        part("file", data, "f.bin", "application/octet-stream"),
        part("other", b""),
        preamble=b"ignored preamble",
        epilogue=b"\r\nignored epilogue",
    )
    assert one_file_part(posted, TYPE) == (data, "application/octet-stream")
    named = b'--bnd\r\nContent-Disposition: form-data; name="f"; filename="\xf3\xb2\xbc\x8a.bin"'
    assert one_file_part(named + b"\r\n\r\n12\r\n--bnd--", TYPE) == (b"12", None)  # UTF-8 name
    assert one_file_part(body(part("f", b"", "e")), 'multipart/form-data; boundary="bnd"') == (
        b"",
        None,
    )


@pytest.mark.parametrize(
    "posted, content_type, why",
    [
        (body(part("f", b"1", "a")), "multipart/form-data", "boundary"),
        (body(part("f", b"1", "a")), "multipart/form-data; boundary=" + "b" * 71, "boundary"),
        (b"no delimiter here", TYPE, "does not occur"),
        (body(part("a", b"1", "a"), part("b", b"2", "b")), TYPE, "got 2"),
        (body(part("a", b"1")), TYPE, "got 0"),
        (b"--bnd\r\n" + part("f", b"1", "a"), TYPE, "no closing boundary"),
        (b"--bnd\r\nno colon\r\n\r\n1\r\n--bnd--", TYPE, "no ':'"),
        (b"--bnd\r\nX: " + b"y" * MAX_PART_HEADER_BYTES + b"\r\n\r\n1\r\n--bnd--", TYPE, "headers"),
        (
            body(*[part(f"n{i}", b"") for i in range(MAX_PARTS)], part("f", b"1", "a")),
            TYPE,
            "parts",
        ),
        (
            b'--bnd\r\nContent-Disposition: form-data; name="f"; filename="a"\r\n'
            b"Content-Transfer-Encoding: base64\r\n\r\nAAAAAAAAAAA=\r\n--bnd--",
            TYPE,
            "Content-Transfer-Encoding 'base64'",
        ),
    ],
)
def test_malformed_bodies(posted, content_type, why):
    assert why in refused(posted, content_type)


def test_a_file_named_by_filename_star_alone_is_the_file():
    """RFC 5987's `filename*=UTF-8''...` alone (a client with a non-ASCII name): it was refused
    as no file part at all."""
    star = b"Content-Disposition: form-data; name=\"f\"; FileName*=UTF-8''scan%C3%A9.bin\r\n"
    data = body(part("note", b"x"), star + b"\r\n" + b"\x01\x02")
    assert one_file_part(data, TYPE) == (b"\x01\x02", None)


def test_a_body_of_near_delimiters_fails_at_the_first():
    """Starlette's parser walked such a body byte by byte on the event loop (60 MB: 8 s); a
    delimiter followed by neither CRLF nor '--' is malformed at once (RFC 2046: the boundary
    never occurs inside a part)."""
    flood = b"--bnd\r\n" + part("f", b"", "a") + b"\r\n--bnd\r" * (4 << 20)
    assert "neither a line break nor '--'" in refused(flood)


def test_through_the_route_and_a_compressed_body_is_415():
    raw = frame_bytes(NUSCENES)
    with limited_serving() as http:
        posted = body(part("file", raw, "frame.pcd.bin"), preamble=b"p")
        r = http.post(
            "/v1/segment?format=nuscenes",
            content=posted,
            headers={**WANT_BIN, "Content-Type": TYPE},
        )
        ref = http.post("/v1/segment?format=nuscenes", content=raw, headers=WANT_BIN)
        assert r.status_code == 200 and ref.status_code == 200, r.text
        np.testing.assert_array_equal(
            np.frombuffer(r.content, np.uint8), np.frombuffer(ref.content, np.uint8)
        )
        for encodings in (["gzip"], ["deflate"], ["br"], ["identity", "gzip"], ["identity, br"]):
            r = http.post(
                "/v1/segment?format=nuscenes",
                content=gzip.compress(raw[: 16 * 1016], mtime=0),
                headers=[*WANT_BIN.items(), *(("Content-Encoding", e) for e in encodings)],
            )
            assert_error(r, 415, "unsupported_content_encoding")  # every line counts
        assert_good(http)
