"""One real `omnistage serve` of the demo set (behind an API key) and one headless Chromium driving the
playground it serves. Chromium resolves no host name and uses no proxy: only the server's own address
(an IP literal) can be reached, which is how the tests show the page needs nothing from the internet."""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile

from tests.support.server_process import ServerProcess

API_KEY = "playground-key"
QUESTION = "What is the capital of France?"  # what the browser's microphone asks
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser_options(shots: Path, microphone: Path):
    """Headless Chromium whose microphone is the WAV `microphone` (played once, then silence) and whose
    permission prompts are granted."""
    from selenium.webdriver.chrome.options import Options

    options = Options()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # the tests may run as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
        "--autoplay-policy=no-user-gesture-required",
        "--mute-audio",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        # Nothing but the server: no host name resolves, no proxy is used.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--no-proxy-server",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone}%noloop",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return options


def demo_models() -> list[str]:
    """The demo models the panels need: the chat model that speaks its answers, the voice, the shapes
    model (images and clips) and Whisper (it transcribes live voice turns for the chat model)."""
    from omnistage.demo.model import demo_model_dir
    from omnistage.demo.smollm import smollm2_dir
    from omnistage.demo.voice import spoken_chat_dir, voice_dir
    from omnistage.demo.whisper import whisper_dir

    return [str(spoken_chat_dir(smollm2_dir())), str(voice_dir()), str(demo_model_dir()), str(whisper_dir())]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("playground-server")
    # Every stage inline (one replica each) in the server process: the page sees the same API, and the
    # server starts without a process per stage.
    args = ["serve", *demo_models(), "--placement", "inline", "--replicas", "1", "--num-threads", "1"]
    args += ["--api-key", API_KEY]
    args += ["--storage-dir", str(root / "storage"), "--voices-dir", str(root / "voices")]
    server = ServerProcess(args, root / "server.log", module="omnistage")
    try:
        server.wait_healthy(timeout=300)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the run writes a screenshot of each panel."""
    return tmp_path_factory.mktemp("playground-shots")


@pytest.fixture(scope="module")
def microphone(http: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the browser's microphone hears: the hibari voice asking QUESTION, between silences (the
    trailing one long enough for the server's VAD to end the turn)."""
    body = {"model": "hibari-en", "input": QUESTION, "response_format": "wav", "seed": 0}
    response = http.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    speech, rate = soundfile.read(io.BytesIO(response.content), dtype="int16")
    lead, tail = np.zeros(rate // 4, np.int16), np.zeros(6 * rate // 5, np.int16)
    path = tmp_path_factory.mktemp("microphone") / "question.wav"
    soundfile.write(path, np.concatenate([lead, speech, tail]), rate, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def browser(shots: Path, microphone: Path):
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed (`make browser` installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = browser_options(shots, microphone)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which(CHROMEDRIVER)))
    driver.set_script_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
