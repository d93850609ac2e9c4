"""Suite-wide settings. Area fixtures live in tests/<area>/conftest.py."""

import os

# Keep the suite within its time budget on 2 cores and independent of the caller's environment.
os.environ.setdefault("OMNISTAGE_LOG_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), a test area (tests/<area>) runs on one
    worker, so its session-scoped servers and references start once."""
    import pytest

    for item in items:
        parts = item.nodeid.split("/")
        item.add_marker(pytest.mark.xdist_group(parts[1] if len(parts) > 2 else "root"))
