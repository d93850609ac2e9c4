"""`omnistage bench serve` flag and connection errors: a message and exit status 2, no traceback."""

from __future__ import annotations

import pytest

from omnistage.cli import main as cli_main
from tests.support.server_process import free_port

pytestmark = pytest.mark.unit


def test_no_server_is_an_error_message(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert cli_main(["bench", "serve", "--base-url", url, "--backend", "chat"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_bad_flags_are_error_messages(capsys):
    flags = ["bench", "serve", "--backend", "chat", "--model", "m", "--base-url", "http://127.0.0.1:9"]
    assert cli_main([*flags, "--goodput", "latency:5"]) == 2
    assert "--goodput" in capsys.readouterr().err
    assert cli_main([*flags, "--dataset", "tts-file"]) == 2
    assert "--dataset-path" in capsys.readouterr().err
    assert cli_main([*flags, "--speak-prompts-with", "hibari-en"]) == 2
    assert "--backend realtime" in capsys.readouterr().err  # only realtime sends spoken turns
