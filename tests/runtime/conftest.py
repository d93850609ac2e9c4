import pytest

from omnistage import AsyncOmni
from tests.runtime.toy_stages import speech_pipeline


@pytest.fixture(scope="module")
def speech_omni():
    """The toy 3-stage speech pipeline, every stage in its own process, shared-memory connectors."""
    omni = AsyncOmni(
        speech_pipeline(), stage_overrides={"0": {"engine_args": {"step_delay": 0.03, "fail_marker": "BOOM"}}}
    )
    yield omni
    omni._close()
