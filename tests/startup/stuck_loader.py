"""A model loader that never finishes: it waits on a stale torch build lock, as every stage start did when a
JIT compile of the native kernels was killed part-way (issue 53). Named by deploy YAMLs as `model_loader`."""

from __future__ import annotations

import os

LOCK_VARIABLE = "OMNISTAGE_TEST_STALE_LOCK"


def wait_on_stale_lock(model_dir: str, dtype, device: str):
    from torch.utils.file_baton import FileBaton

    FileBaton(os.environ[LOCK_VARIABLE]).wait()  # until the test that planted it removes it
    raise RuntimeError("the stale lock was removed: this loader loads nothing")


def doing_in(message: str) -> bool:
    """Whether a start-up error shows the stuck stage's stack: the loader's wait on the lock, or, where a
    loaded machine's imports outlasted the deadline (CI: past 15 s), the import it was in. The inline
    test in test_startup.py, whose stage imports nothing new, always shows the wait."""
    return ("wait_on_stale_lock" in message and "file_baton" in message) or "_find_and_load" in message
