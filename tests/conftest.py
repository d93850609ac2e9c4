"""Suite-wide settings and the one server several areas share (area fixtures: tests/<area>/conftest.py)."""

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

# Keep the suite within its time budget on 2 cores and independent of the caller's environment.
os.environ.setdefault("OMNISTAGE_LOG_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The areas whose tests run on the one `voice_demo_server`. Named here because xdist's controller, which
# forms the work units, sees node ids only, not fixtures; an area missing from it only starts a second server.
VOICE_DEMO_AREAS = {"speech", "whisper", "realtime", "bench"}


# Every test has a budget (pytest-timeout; fixture set-up included, so a test that starts a shared server
# pays for it): past it the test fails with every thread's stack, instead of holding the suite. Seconds per
# area of tests/; the slowest test of an area took under a fifth of its budget on 2 cores (--durations).
DEFAULT_BUDGET_S = 180
SLOW_AREAS = ("bench", "diffusion", "ray", "reliability", "playground", "startup")
AREA_BUDGETS_S = dict.fromkeys(SLOW_AREAS, 300)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every item a node id of its own (under pytest 9.2, schemathesis names its items per API
    operation but leaves them one node id, and pytest-xdist, which keys tests by node id, would run only one
    of them), and its area's time budget unless it names its own."""
    shared = {nodeid for nodeid, count in Counter(item.nodeid for item in items).items() if count > 1}
    for item in items:
        if item.nodeid in shared and item.parent is not None:
            item._id = item.parent.id.child(item.name)
        if item.get_closest_marker("timeout") is None:
            parts = item.nodeid.split("/")
            area = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
            item.add_marker(pytest.mark.timeout(AREA_BUDGETS_S.get(area, DEFAULT_BUDGET_S)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`pytest -n N`: a work unit is an area of tests/ (tests/<area>/...), so each area's session fixtures
    (servers, engines, references) start on one worker only; the voice demo's areas are one unit."""
    from xdist.scheduler import LoadScopeScheduling

    class AreaScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("/")
            area = parts[1] if len(parts) > 2 and parts[0] == "tests" else nodeid
            return "voice-demo" if area in VOICE_DEMO_AREAS else area

    return AreaScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def families_registered() -> None:
    """Every family's registrations (layer forms, step adapters, ...), as `Omni` and each stage process make
    them: for the tests that build engines and models in this process directly."""
    from omnistage.families import registry

    registry.load()


@pytest.fixture(scope="session")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="session")
def voice_demo_server(tmp_path_factory: pytest.TempPathFactory, voices_dir: Path) -> Iterator:
    """tests/support/voice_demo.py: the speaking and listening demo models, one server for the session."""
    from tests.support.server_process import ServerProcess
    from tests.support.voice_demo import voice_demo_args

    root = tmp_path_factory.mktemp("voice-demo-server")
    server = ServerProcess(
        voice_demo_args(voices_dir, root / "storage"), root / "server.log", module="omnistage"
    )
    try:
        server.wait_healthy(timeout=300)
        yield server
    finally:
        server.stop()
