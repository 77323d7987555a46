"""Blank the GPU code a shared library carries for GPUs other than the one the check runs on.

    python deploy/gpu_check/strip_fatbin.py --arch 90 LIB.so [LIB.so ...]

spconv-cu126's core_cc.so holds 270 MB of device code: machine code (ELF) for sm_50 ... sm_90 and
PTX. The H200 runs sm_90 code only. Each fat binary block in the library (magic 0xBA55ED50) lists
its entries (kind 1 = PTX, 2 = ELF, with the target arch); in every block that has an ELF for
--arch, this overwrites the payloads of all its other entries (other GPUs' ELF, and the PTX)
with zeros, in place. The file keeps its size and layout (offsets, symbols and entry headers are
untouched), so the loader and the CUDA runtime see the same library. The driver runs a block's
machine code for the GPU's exact arch when the block has it, and JIT-compiles PTX only when it
does not (CUDA C++ Programming Guide, application compatibility), so it never reads what was
blanked. Blocks without an ELF for --arch (kernels built only for older GPUs, whose PTX the
driver compiles for sm_90) stay as they are. Zeros compress to nothing: the carried archive
shrinks from 39.7 to about 23 MB.

Prints what it blanked per library; exits 1 if a file holds no fat binary for --arch.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

MAGIC = struct.pack("<I", 0xBA55ED50)
BLOCK_HEADER = struct.Struct("<IHHQ")  # magic, version 1, header size 16, size of the entries
ENTRY_HEADER = struct.Struct("<HHIQ")  # kind, version, header size, payload size
ARCH_OFFSET = 28  # the entry's target arch (e.g. 90), a uint32 inside the entry header
KIND_ELF = 2


def entries(data: bytearray, start: int, end: int):
    """(kind, arch, payload offset, payload size) of each entry of one block."""
    pos = start
    while pos < end:
        kind, _, header_size, size = ENTRY_HEADER.unpack_from(data, pos)
        if header_size < ARCH_OFFSET + 4 or pos + header_size + size > end:
            raise ValueError(f"malformed fat binary entry at offset {pos}")
        (arch,) = struct.unpack_from("<I", data, pos + ARCH_OFFSET)
        yield kind, arch, pos + header_size, size
        pos += header_size + size


def blank_other_archs(data: bytearray, arch: int) -> tuple[int, int, int]:
    """Blanks in place; returns (blocks, blocks with an ELF for arch, bytes blanked)."""
    pos, blocks, kept, blanked = 0, 0, 0, 0
    while (start := data.find(MAGIC, pos)) >= 0:
        _, version, header_size, size = BLOCK_HEADER.unpack_from(data, start)
        if version != 1 or header_size != 16 or start + 16 + size > len(data):
            pos = start + 4  # the magic bytes inside other data
            continue
        blocks += 1
        block = list(entries(data, start + 16, start + 16 + size))
        if any(kind == KIND_ELF and a == arch for kind, a, _, _ in block):
            kept += 1
            for kind, a, offset, length in block:
                if not (kind == KIND_ELF and a == arch):
                    data[offset : offset + length] = bytes(length)
                    blanked += length
        pos = start + 16 + size
    return blocks, kept, blanked


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, required=True, help="the GPU's sm version, e.g. 90")
    ap.add_argument("libraries", nargs="+", type=Path)
    a = ap.parse_args(argv)
    status = 0
    for path in a.libraries:
        data = bytearray(path.read_bytes())
        blocks, kept, blanked = blank_other_archs(data, a.arch)
        if kept == 0:
            print(f"{path}: no fat binary block has sm_{a.arch} code; left as it was")
            status = 1
            continue
        path.write_bytes(data)
        print(
            f"{path.name}: {blocks} fat binary blocks, {kept} with sm_{a.arch} code; "
            f"{blanked / 1e6:.1f} MB of other GPUs' code and PTX blanked"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
