"""The code keeps to Python 3.10 (JetPack 6's Python, the Orin image's): every regular expression
our modules compile at import also compiles on 3.10. A possessive repeat (`*+`, 3.11 and newer)
in the JSON reader made `import app` fail on 3.10 for a day, unseen: ruff's and mypy's 3.10
targets do not read patterns, and nothing ran the code on 3.10. The patterns are recorded by
importing every module here, then compiled by a Python 3.10 interpreter (pyenv's, or python3.10
on PATH), which needs nothing installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.codecs import json_points
from tests.conftest import REPO_ROOT

PACKAGES = ("app", "models", "kernels", "train", "synth", "bench")


def python310() -> str | None:
    """A Python 3.10 that runs (pyenv's shim on PATH runs only where 3.10 is selected)."""
    pyenv = sorted((Path.home() / ".pyenv" / "versions").glob("3.10*/bin/python"))
    for candidate in [*map(str, pyenv), shutil.which("python3.10")]:
        if candidate and subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    return None


RECORD = r"""
import importlib, json, re, sys
root, packages = sys.argv[1], sys.argv[2].split(",")
compile_, seen = re.compile, []

def recording(pattern, flags=0):
    caller = sys._getframe(1).f_code.co_filename
    if caller.startswith(root) and isinstance(pattern, (str, bytes)):
        text = pattern.decode("latin-1") if isinstance(pattern, bytes) else pattern
        seen.append([caller[len(root):], text, isinstance(pattern, bytes), int(flags)])
    return compile_(pattern, flags)

re.compile = recording
from pathlib import Path
for package in packages:
    for path in sorted(Path(root, package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
print(json.dumps(seen))
"""

CHECK = r"""
import json, re, sys
bad = []
for where, text, is_bytes, flags in json.load(sys.stdin):
    try:
        re.compile(text.encode("latin-1") if is_bytes else text, flags)
    except re.error as e:
        bad.append(f"{where}: {text[:60]!r}: {e}")
print("\n".join(bad))
"""


def test_every_pattern_compiled_at_import_compiles_on_python_310():
    py310 = python310()
    if py310 is None:
        pytest.skip("no Python 3.10 here (python3.10 on PATH or pyenv's 3.10)")
    recorded = subprocess.run(
        [sys.executable, "-c", RECORD, str(REPO_ROOT) + "/", ",".join(PACKAGES)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    patterns = json.loads(recorded.stdout.strip().splitlines()[-1])
    assert any(where.startswith("app/codecs/json_points") for where, *_ in patterns)
    # compiled only where sys.version_info >= (3, 11); 3.10 gets its twin (the test below)
    gated = json_points._NUMBERS_POSSESSIVE.decode("latin-1")
    patterns = [p for p in patterns if p[1] != gated]
    checked = subprocess.run(
        [py310, "-c", CHECK], input=json.dumps(patterns), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr


@pytest.mark.skipif(sys.version_info < (3, 11), reason="no possessive repeats before 3.11")
def test_both_forms_of_the_json_value_pattern_match_alike():
    """json_points' possessive pattern (3.11 and newer) and its 3.10 form agree (on random rows of
    JSON's tokens and junk), whichever this interpreter uses."""
    import random
    import re

    possessive = re.compile(json_points._NUMBERS_POSSESSIVE)
    tokens = [b"[", b"]", b",", b"1", b"0", b"-", b".", b"e", b"+", b"NaN", b"Infinity", b"x",
              b"2", b"E", b" ", b"-Infinity", b"1.5e-3"]  # fmt: skip
    rng = random.Random(0)
    for _ in range(20_000):
        row = b"".join(rng.choice(tokens) for _ in range(rng.randint(0, 30)))
        assert possessive.match(row).end() == json_points._NUMBERS_ATOMIC.match(row).end(), row
