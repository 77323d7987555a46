"""The GPU check's whole-suite step leaves out test files whose packages are missing, and only
those (deploy/gpu_check/skip_missing.py)."""

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_skip_missing_leaves_out_only_files_with_missing_packages(tmp_path):
    (tmp_path / "test_needs_missing.py").write_text(
        "import no_such_package_for_lidarseg\n\ndef test_never():\n    assert False\n"
    )
    (tmp_path / "test_plain.py").write_text("def test_runs():\n    assert True\n")
    (tmp_path / "test_our_bug.py").write_text("import kernels.no_such_module\n")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(REPO_ROOT / "deploy" / "gpu_check"), str(REPO_ROOT), str(tmp_path)]
        ),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "skip_missing",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert "test_needs_missing.py: needs no_such_package_for_lidarseg" in out
    assert "1 passed" in out
    # A missing module of our own is a real error, not excused.
    assert "test_our_bug.py" in out and "1 error" in out and proc.returncode != 0
