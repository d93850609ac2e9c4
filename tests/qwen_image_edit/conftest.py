"""Single-threaded torch (the tiny models are overhead-bound, and on two shared cores torch's thread pool
spins against other processes: a tiny transformer forward takes 4 ms on 1 thread, 0.6 s on 2 under load), and
the plain pipelines' images, computed once for the engine and the serving tests."""

from collections.abc import Iterator

import pytest
import torch

from omnistage.families.qwen_image_edit.tiny import tiny_qwen_image_edit_dir, tiny_qwen_image_edit_plus_dir
from tests.qwen_image_edit.helpers import EDIT_CASES, PLUS_CASES, reference


@pytest.fixture(scope="package", autouse=True)
def _one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="package")
def edit_references() -> dict[str, torch.Tensor]:
    directory = tiny_qwen_image_edit_dir()
    return {rid: reference(directory, prompt, fields, several=False) for rid, prompt, fields in EDIT_CASES}


@pytest.fixture(scope="package")
def plus_references() -> dict[str, torch.Tensor]:
    directory = tiny_qwen_image_edit_plus_dir()
    return {rid: reference(directory, prompt, fields, several=True) for rid, prompt, fields in PLUS_CASES}
