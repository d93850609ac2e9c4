import pytest

from omnistage import AsyncOmni
from tests.support.toy_stages import speech_pipeline


@pytest.fixture(scope="module")
def gates(tmp_path_factory):
    """Where tests open the gates their held requests wait at (toy_stages.py, `HOLD:<name>`)."""
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def speech_omni(gates):
    """The toy 3-stage speech pipeline, every stage in its own process, shared-memory connectors."""
    omni = AsyncOmni(
        speech_pipeline(),
        stage_overrides={"0": {"engine_args": {"gate_dir": str(gates), "fail_marker": "BOOM"}}},
    )
    yield omni
    omni._close()
