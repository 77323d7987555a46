"""The docs tests' live app, started once for the package."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def live():
    """A ready in-process app (model loaded: lidarseg_model_info has its labels)."""
    from tests.app.contract_helpers import serving

    with serving() as client:
        yield client.app
