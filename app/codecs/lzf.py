"""LZF (liblzf's format, as PCL's binary_compressed PCD uses it): decompressor and compressor.

A compressed stream is a series of chunks, each opened by a control byte `c`:
  c < 32      a literal run: the next c + 1 bytes are copied as they are;
  c >= 32     a back reference: length L = c >> 5 (7 means "7 + the next byte"), then one more
              byte; it copies L + 2 bytes from `((c & 31) << 8 | that byte) + 1` bytes back in
              the output (the source may overlap what it writes, which repeats a pattern).
"""

from __future__ import annotations

MAX_LITERAL = 32
MAX_OFFSET = 1 << 13
MAX_REF = 7 + 255 + 2
MAX_RATIO = MAX_REF // 3 + 1  # the most a stream can expand: a 3-byte reference to 264 bytes


class LZFError(ValueError):
    pass


def decompress(data: bytes, size: int) -> bytearray:
    """Decompresses `data` to exactly `size` bytes; LZFError on a corrupt or short stream (and,
    before allocating, on a size that no stream of len(data) bytes can reach)."""
    if size > MAX_RATIO * len(data):
        raise LZFError(f"{len(data)} bytes cannot expand to {size} (at most {MAX_RATIO}:1)")
    out = bytearray(size)
    src, op, end = memoryview(data), 0, len(data)
    ip = 0
    while ip < end:
        ctrl = src[ip]
        ip += 1
        if ctrl < 32:
            n = ctrl + 1
            if ip + n > end:
                raise LZFError("literal run past the end of the compressed data")
            if op + n > size:
                raise LZFError("output longer than the declared size")
            out[op : op + n] = src[ip : ip + n]
            ip += n
            op += n
            continue
        n = ctrl >> 5
        if n == 7:
            if ip >= end:
                raise LZFError("back reference cut off")
            n += src[ip]
            ip += 1
        if ip >= end:
            raise LZFError("back reference cut off")
        ref = op - ((ctrl & 0x1F) << 8) - src[ip] - 1
        ip += 1
        n += 2
        if ref < 0:
            raise LZFError("back reference before the start of the output")
        if op + n > size:
            raise LZFError("output longer than the declared size")
        if op - ref >= n:  # no overlap: one slice copy
            out[op : op + n] = out[ref : ref + n]
        else:  # overlapping: the pattern of period (op - ref) repeats
            period = out[ref:op]
            reps = -(-n // len(period))
            out[op : op + n] = (period * reps)[:n]
        op += n
    if op != size:
        raise LZFError(f"decompressed to {op} bytes, expected {size}")
    return out


def compress(data: bytes, matches: bool = False) -> bytes:
    """An LZF stream that decompress() (and liblzf) accepts. matches=False writes literal runs
    only (fast, no compression); matches=True also finds repeats with a 3-byte hash table (pure
    Python: meant for small inputs and for exercising back references)."""
    if not matches:
        view = memoryview(data)
        parts = []
        for i in range(0, len(data), MAX_LITERAL):
            chunk = view[i : i + MAX_LITERAL]
            parts.append(bytes((len(chunk) - 1,)))
            parts.append(chunk.tobytes())
        return b"".join(parts)
    out, lit = bytearray(), bytearray()
    table: dict[bytes, int] = {}
    i, n = 0, len(data)

    def flush():
        for k in range(0, len(lit), MAX_LITERAL):
            chunk = lit[k : k + MAX_LITERAL]
            out.append(len(chunk) - 1)
            out.extend(chunk)
        lit.clear()

    while i < n:
        key = data[i : i + 3]
        ref = table.get(key) if len(key) == 3 else None
        if len(key) == 3:
            table[key] = i
        if ref is not None and i - ref - 1 < MAX_OFFSET:
            length = 3
            while i + length < n and length < MAX_REF and data[ref + length] == data[i + length]:
                length += 1
            flush()
            off, L = i - ref - 1, length - 2
            if L < 7:
                out.append((L << 5) | (off >> 8))
            else:
                out.append((7 << 5) | (off >> 8))
                out.append(L - 7)
            out.append(off & 0xFF)
            i += length
        else:
            lit.append(data[i])
            i += 1
    flush()
    return bytes(out)
