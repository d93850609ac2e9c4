"""Fixtures for the SmolLM2 tests: the demo's real GGUF model, converted once per machine, served by a real
`omnistage serve <file.gguf>` process, and the transformers reference on the same dequantized weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from omnistage.demo.smollm import smollm2_dir, smollm2_gguf
from tests.support.server_process import ServerProcess


@pytest.fixture(scope="session")
def smol_gguf() -> Path:
    return smollm2_gguf()


@pytest.fixture(scope="session")
def smol_dir(smol_gguf: Path) -> Path:
    return smollm2_dir()


@pytest.fixture(scope="module")
def smol_server(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One thread: on a shared 2-core machine a second OpenMP thread spin-waits for a busy core. Float32
    asked for: the tests compare with transformers' float32 model (a GGUF runs in bf16 by default where the
    CPU has it natively)."""
    log = tmp_path_factory.mktemp("smol-server") / "server.log"
    args = ["serve", str(smollm2_gguf()), "--num-threads", "1", "--dtype", "float32"]
    server = ServerProcess(args, log, module="omnistage")
    try:
        server.wait_healthy(timeout=300)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def reference(smol_dir: Path):
    """transformers' own model and tokenizer, loaded from the converted directory in float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(smol_dir)


@pytest.fixture
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
