"""train/real.py roles_of on a folder of one's own scans: a role other than the two that
roles.json may name is refused, with the frame and the role in the message."""

from __future__ import annotations

import json

import pytest

from train.real import ROLES_FILE, TESTS_ONLY, TRAIN, VALIDATION, roles_of


@pytest.mark.parametrize("bad", ["valdation", "Validation", TESTS_ONLY, "", None])
def test_a_role_that_is_not_training_or_validation_is_refused(tmp_path, bad):
    for name in ("a", "b"):
        (tmp_path / f"{name}.bin").write_bytes(b"")
        (tmp_path / f"{name}.label").write_bytes(b"")
    (tmp_path / ROLES_FILE).write_text(json.dumps({"a": TRAIN, "b": VALIDATION}))
    assert roles_of(str(tmp_path)) == {"a": TRAIN, "b": VALIDATION}
    folder = tmp_path / "typo"
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"{name}.bin").write_bytes(b"")
        (folder / f"{name}.label").write_bytes(b"")
    (folder / ROLES_FILE).write_text(json.dumps({"a": TRAIN, "b": bad}))
    with pytest.raises(ValueError, match=f"'b': role {bad!r} is not"):
        roles_of(str(folder))
