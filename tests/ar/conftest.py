"""Fixtures for the AR engine tests (shared helpers live in ar_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from omnistage.families.llm.tiny import tiny_llm_dir


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a shared 2-core machine OpenMP threads that
    spin-wait for a busy core make each step 20x slower. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def qwen2_dir() -> str:
    return str(tiny_llm_dir("qwen2"))
