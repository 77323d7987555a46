"""Settings read as documented: the names every LIDARSEG_* variable may have, a misspelt one
named at start-up, the log level in either case."""

from __future__ import annotations

import re
from pathlib import Path

from app.service.config import OTHER_VARIABLES, Settings, unread_variables

REPO = Path(__file__).resolve().parents[2]
READERS = ("app", "models", "kernels", "bench", "train", "synth", "deploy", ".ci")


def test_every_variable_the_code_names_is_a_setting_or_known():
    """unread_variables must not warn about a variable something reads: every LIDARSEG_* name in
    the code, scripts and manifests is a Settings field or in OTHER_VARIABLES (config.py, which
    names misspellings in its docs, aside)."""
    fields = {f"LIDARSEG_{name.upper()}" for name in Settings.model_fields}
    named = set()
    for top in READERS:
        for path in (REPO / top).rglob("*"):
            readable = path.suffix in {".py", ".sh", ".yaml", ".yml", ""} and path.is_file()
            if readable and path.name != "config.py":
                named |= set(
                    re.findall(r"LIDARSEG_[A-Z0-9_]*[A-Z0-9]", path.read_text("utf-8", "ignore"))
                )
    named |= set(re.findall(r"LIDARSEG_[A-Z0-9_]*[A-Z0-9]", (REPO / "Dockerfile").read_text()))
    assert named - fields - OTHER_VARIABLES == set()
    assert not OTHER_VARIABLES & fields


def test_a_misspelt_setting_is_named_with_its_likely_meaning():
    env = {
        "LIDARSEG_MAX_BATCHES": "3",
        "LIDARSEG_MAX_BATCH": "2",
        "LIDARSEG_BUILD_DIR": "/opt/lidarseg/lib",
        "LIDARSEG_ZZZ": "1",
        "PATH": "/bin",
    }
    warnings = unread_variables(env)
    assert len(warnings) == 2
    assert (
        "LIDARSEG_MAX_BATCHES" in warnings[0] and "did you mean LIDARSEG_MAX_BATCH?" in warnings[0]
    )
    assert "LIDARSEG_ZZZ" in warnings[1] and "no setting" in warnings[1]


def test_log_level_in_either_case(monkeypatch):
    monkeypatch.setenv("LIDARSEG_LOG_LEVEL", "WARNING")
    assert Settings().log_level == "warning"
