"""Headers whose definitions sit in an unnamed namespace (internal linkage, as when they lived in
the one source file that includes them) stay with that one includer: a second one would get its
own copy, a thread_local table of voxel_blocks.h included (64 KB a thread a file), silently."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO_ROOT

CSRC = REPO_ROOT / "kernels" / "csrc"
SOURCES = sorted(p for p in CSRC.rglob("*") if p.suffix in {".h", ".cpp", ".cu"})
UNNAMED = re.compile(r"^\s*namespace\s*\{", re.M)
INTERNAL = [p for p in SOURCES if p.suffix == ".h" and UNNAMED.search(p.read_text())]


def includers(header) -> list[str]:
    line = re.compile(rf'^\s*#\s*include\s+"(?:[\w./]*/)?{re.escape(header.name)}"', re.M)
    return [p.name for p in SOURCES if line.search(p.read_text())]


def test_the_internal_headers_are_found():
    assert {p.name for p in INTERNAL} >= {"radix_sort.h", "voxel_blocks.h"}


@pytest.mark.parametrize("header", INTERNAL, ids=lambda p: p.name)
def test_an_internal_header_has_one_includer(header):
    assert len(includers(header)) == 1, f"{header.name}: included by {includers(header)}"
