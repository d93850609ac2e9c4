"""One real `omnistage serve` of the demo set (behind an API key) and one headless Chromium driving the
playground it serves. Chromium resolves no host name and uses no proxy: only the server's own address
(an IP literal) can be reached, which is how the tests show the page needs nothing from the internet."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serving.server_process import ServerProcess

API_KEY = "playground-key"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser_options(shots: Path):
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
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return options


def demo_models() -> list[str]:
    """The demo models the panels need: the chat model that speaks its answers, the voice, and the shapes
    model (images and clips)."""
    from omnistage.demo.model import demo_model_dir
    from omnistage.demo.smollm import smollm2_dir
    from omnistage.demo.voice import spoken_chat_dir, voice_dir

    return [str(spoken_chat_dir(smollm2_dir())), str(voice_dir()), str(demo_model_dir())]


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
def browser(shots: Path):
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed (`make browser` installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(options=browser_options(shots), service=Service(shutil.which(CHROMEDRIVER)))
    driver.set_script_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
