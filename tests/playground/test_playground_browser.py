"""The playground in a real browser (headless Chromium) against a real demo server: each panel gets what the
API gives for the same request, media play, and a bad input shows the API's own message beside its field."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
from PIL import Image
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from omnistage.families.wan.shapes import DEMO_SHAPES_PIPELINE
from omnistage.serving.limits import effective_limits
from omnistage.serving.settings import ServerSettings
from tests.playground.conftest import API_KEY
from tests.support.polling import wait_until

pytestmark = pytest.mark.e2e

CHAT_MODEL = "smollm2-135m-instruct"
VOICE_MODEL = "hibari-en"
SHAPES_MODEL = "wan-shapes"
WHISPER_MODEL = "whisper-tiny.en"
WAIT_S = 120
ANSWER_TOKENS = 8  # the live voice answer's
# Which panel each model's capabilities (`/v1/models` "omnistage" block) allow.
OFFERS = {
    "chat": lambda caps: "chat" in caps["routes"] and {"text", "image"} & set(caps["modalities"]),
    "speech": lambda caps: "speech" in caps["routes"],
    "images": lambda caps: "images" in caps["routes"],
    "video": lambda caps: "videos" in caps["routes"],
    "live": lambda caps: "realtime" in caps["routes"],
}

# Decodes the media element's file in the page (WebAudio) and reports its length.
DECODE_AUDIO = """
const [selector, done] = [arguments[0], arguments[arguments.length - 1]];
fetch(document.querySelector(selector).src)
  .then((r) => r.arrayBuffer())
  .then((bytes) => new OfflineAudioContext(1, 1, 48000).decodeAudioData(bytes))
  .then((buffer) => done({ seconds: buffer.duration }), (e) => done({ error: String(e) }));
"""


def script(browser, source: str, *args):
    return browser.execute_script(source, *args)


def wait_for(browser, source: str, what: str, *args):
    """The first truthy value of a page expression (a bounded poll)."""
    return wait_until(lambda: script(browser, f"return {source};", *args), WAIT_S, what)


def ready(browser) -> bool:
    return script(browser, "return document.getElementById('models-status').dataset.state === 'ready';")


def open_playground(browser, url: str) -> None:
    """The page with the API key already in its session storage (as after a user typed it once)."""
    browser.get(url + "/")
    if not script(browser, "return sessionStorage.getItem('omnistage.apiKey');"):
        enter_key(browser)
    wait_until(lambda: ready(browser), WAIT_S, "models loaded")


def enter_key(browser) -> None:
    field = browser.find_element(By.ID, "api-key")
    field.clear()
    field.send_keys(API_KEY + "\t")  # leaving the field commits it (change event)


def show(browser, panel: str):
    browser.find_element(By.CSS_SELECTOR, f'#tabs button[data-panel="{panel}"]').click()
    root = browser.find_element(By.ID, f"panel-{panel}")
    assert root.is_displayed()
    return root


def fill(root, name: str, value) -> None:
    element = root.find_element(By.NAME, name)
    if element.tag_name == "select":
        Select(element).select_by_value(str(value))
    else:
        element.clear()
        element.send_keys(str(value))


def error_beside(root, param: str) -> str:
    return root.find_element(By.CSS_SELECTOR, f'.field[data-param="{param}"] .error').text


def error_beside_button(root, button: str) -> str:
    return root.find_element(By.CSS_SELECTOR, f'.error[data-for="{button}"]').text


def api_error(response) -> str:
    assert response.status_code == 400, response.text
    return response.json()["error"]["message"]


def wav_seconds(data: bytes) -> float:
    info = soundfile.info(io.BytesIO(data))
    return info.frames / info.samplerate


def page_requests(browser) -> list[str]:
    """The URLs the page asked for since the last call (Chromium's performance log)."""
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_the_page_loads_with_only_the_server_reachable(browser, server, http, shots):
    browser.get(server.url + "/")
    script(browser, "sessionStorage.clear();")
    browser.get(server.url + "/playground")
    key_error = browser.find_element(By.CSS_SELECTOR, '.field[data-param="api_key"] .error')
    wait_until(lambda: key_error.text, WAIT_S, "the missing key reported")
    assert key_error.text == http.get("/v1/models", headers={"Authorization": ""}).json()["error"]["message"]
    enter_key(browser)
    wait_until(lambda: ready(browser), WAIT_S, "models loaded")
    assert key_error.text == ""
    listed = http.get("/v1/models").json()["data"]
    # The capabilities the page reads: the shapes model's limits under the server's caps, the voice's voices.
    caps = {m["id"]: m["omnistage"] for m in listed}
    shapes = effective_limits(DEMO_SHAPES_PIPELINE.capabilities.limits, ServerSettings())
    assert caps[SHAPES_MODEL]["limits"] == dataclasses.asdict(shapes)
    assert caps[SHAPES_MODEL]["routes"] == ["chat", "images", "videos"]
    voices = http.get("/v1/audio/voices", params={"model": VOICE_MODEL}).json()["models"][0]["voices"]
    assert caps[VOICE_MODEL]["voices"] == voices and caps[CHAT_MODEL]["modalities"] == ["text", "audio"]
    assert browser.find_element(By.ID, "models-status").text.endswith(", ".join(m["id"] for m in listed))
    # Each panel is offered to the models whose capabilities allow it, and only to them.
    expected = {name: [m["id"] for m in listed if offers(m["omnistage"])] for name, offers in OFFERS.items()}
    assert set(expected["chat"]) == {CHAT_MODEL, SHAPES_MODEL}  # the shapes model answers with pictures
    assert expected["speech"] == [VOICE_MODEL]
    assert expected["images"] == expected["video"] == [SHAPES_MODEL]
    # The chat model does not hear audio, but Whisper transcribes for it: it holds live voice sessions.
    assert expected["live"] == [CHAT_MODEL] and "realtime" not in caps[WHISPER_MODEL]["routes"]
    for panel, models in expected.items():
        tab = browser.find_element(By.CSS_SELECTOR, f'#tabs button[data-panel="{panel}"]')
        assert tab.is_displayed() == bool(models)
        options = browser.find_elements(By.CSS_SELECTOR, f'#panel-{panel} select[name="model"] option')
        assert [o.get_attribute("value") for o in options] == models
    # The key is kept for the session: a reload needs no typing.
    browser.refresh()
    wait_until(lambda: ready(browser), WAIT_S, "models loaded again")
    urls = page_requests(browser)
    assert server.url + "/playground/app.js" in urls and server.url + "/v1/models" in urls
    outside = [u for u in urls if not u.startswith((server.url + "/", "data:", "blob:"))]
    assert outside == []
    browser.save_screenshot(str(shots / "start.png"))
    # And nothing else was reachable: the page stood on the server alone. (Asked from a server page
    # without the playground's content policy, so that only the network can refuse it.)
    browser.get(server.url + "/health")
    reached = "fetch('http://example.com/', {mode: 'no-cors'}).then(() => done(true), () => done(false));"
    assert browser.execute_async_script("const done = arguments[0]; " + reached) is False


def test_a_chat_turn_shows_the_models_answer_and_speaks_it(browser, server, http, shots):
    open_playground(browser, server.url)
    root = show(browser, "chat")
    fill(root, "temperature", 0)
    fill(root, "max_tokens", 8)
    system = "You are a friendly assistant."
    fill(root, "system", system)
    turns: list[dict] = [{"role": "system", "content": system}]
    for turn, text in enumerate(("Say hello.", "And now goodbye."), 1):
        fill(root, "message", text)
        root.find_element(By.NAME, "send").click()
        answers = root.find_elements(By.CSS_SELECTOR, ".msg.assistant")
        assert len(answers) == turn  # the turn shows at once, its answer streams into it
        answer = answers[-1]
        wait_until(lambda a=answer: a.get_attribute("data-state") != "streaming", WAIT_S, "the answer")
        assert answer.get_attribute("data-state") == "done", root.text
        turns.append({"role": "user", "content": text})
        expected = http.post(
            "/v1/chat/completions",
            json={
                "model": CHAT_MODEL,
                "messages": turns,
                "temperature": 0,
                "max_tokens": 8,
                "modalities": ["text"],
            },
        ).json()["choices"][0]["message"]["content"]
        assert expected and answer.find_element(By.TAG_NAME, "p").text == expected.strip()
        turns.append({"role": "assistant", "content": expected})
        # The spoken answer came in chunks as it streamed, and its whole file plays.
        assert int(answer.get_attribute("data-audio-chunks")) >= 1
        decoded = browser.execute_async_script(DECODE_AUDIO, ".msg.assistant:last-child audio")
        assert "error" not in decoded and decoded["seconds"] > 0.2
    assert len(root.find_elements(By.CSS_SELECTOR, ".msg.user")) == 2
    browser.save_screenshot(str(shots / "chat.png"))


def test_a_chat_turn_answers_with_a_picture(browser, server, http, shots):
    """A model that draws (the shapes model: images, no text) answers the chat panel with a picture: its
    denoising steps fill the answer's progress bar, then the image shows at the size the API answers with."""
    open_playground(browser, server.url)
    root = show(browser, "chat")
    fill(root, "model", SHAPES_MODEL)
    draw = root.find_element(By.NAME, "draw")
    assert draw.is_displayed() and draw.is_selected() and not draw.is_enabled()  # it cannot write
    fill(root, "message", "a red circle")
    root.find_element(By.NAME, "send").click()
    answer = root.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    wait_until(lambda: answer.get_attribute("data-state") != "streaming", WAIT_S, "the picture")
    assert answer.get_attribute("data-state") == "done", root.text
    wait_for(browser, "document.querySelector('#panel-chat .msg.assistant:last-child img')?.complete", "img")
    picture = "document.querySelector('#panel-chat .msg.assistant:last-child img')"
    natural = script(browser, f"return [{picture}.naturalWidth, {picture}.naturalHeight];")
    steps = "document.querySelector('#panel-chat .msg.assistant:last-child progress')"
    value, total = script(browser, f"return [{steps}.value, {steps}.max];")
    assert total > 1 and value == total
    body = {
        "model": SHAPES_MODEL,
        "messages": [{"role": "user", "content": "a red circle"}],
        "modalities": ["image"],
    }
    reply = http.post("/v1/chat/completions", json=body).json()
    url = reply["choices"][0]["message"]["content"][0]["image_url"]["url"]
    expected = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert natural == list(expected.size)
    browser.save_screenshot(str(shots / "chat-picture.png"))


def test_speech_plays_the_servers_wav(browser, server, http, shots):
    open_playground(browser, server.url)
    root = show(browser, "speech")
    voices = http.get("/v1/audio/voices", params={"model": VOICE_MODEL}).json()["models"][0]["voices"]
    options = root.find_elements(By.CSS_SELECTOR, 'select[name="voice"] option')
    assert [o.get_attribute("value") for o in options][1:] == voices
    text = "The playground speaks."
    fill(root, "input", text)
    fill(root, "voice", voices[0])
    fill(root, "seed", 7)
    body = {"model": VOICE_MODEL, "input": text, "voice": voices[0], "seed": 7, "response_format": "wav"}
    expected = wav_seconds(http.post("/v1/audio/speech", json=body).content)
    result = root.find_element(By.CLASS_NAME, "result")
    for stream in (False, True):
        checkbox = root.find_element(By.NAME, "stream")
        if checkbox.is_selected() != stream:
            checkbox.click()
        root.find_element(By.NAME, "speak").click()
        wait_until(lambda: result.get_attribute("data-state") == "done", WAIT_S, "the speech")
        decoded = browser.execute_async_script(DECODE_AUDIO, "#panel-speech .result audio")
        assert "error" not in decoded, decoded
        assert decoded["seconds"] == pytest.approx(expected, abs=1e-3)
        link = result.find_element(By.LINK_TEXT, "Download")
        assert link.get_attribute("download") == "speech.wav"
        # The <audio> element itself reads the same length from the file.
        seconds = wait_for(browser, "document.querySelector('#panel-speech audio').duration", "metadata")
        assert seconds == pytest.approx(expected, abs=1e-3)
        browser.save_screenshot(str(shots / f"speech{'-streamed' if stream else ''}.png"))


def test_an_image_appears_at_the_requested_size(browser, server, http, shots):
    open_playground(browser, server.url)
    root = show(browser, "images")
    limits = http.get(f"/v1/models/{SHAPES_MODEL}").json()["omnistage"]["limits"]
    options = root.find_elements(By.CSS_SELECTOR, 'select[name="size"] option')
    sizes = [o.get_attribute("value") for o in options]
    for size in sizes[1:]:
        width, height = map(int, size.split("x"))
        assert width <= limits["max_width"] and height <= limits["max_height"]
        assert width * height <= limits["max_pixels"]
    assert "64x32" in sizes
    fill(root, "size", "64x32")
    fill(root, "num_inference_steps", 4)
    fill(root, "seed", 3)
    root.find_element(By.NAME, "generate").click()
    wait_for(browser, "document.querySelector('#panel-images .gallery img')?.complete", "the image")
    image = "document.querySelector('#panel-images .gallery img')"
    natural = script(browser, f"return [{image}.naturalWidth, {image}.naturalHeight];")
    assert natural == [64, 32]
    assert "64x32" in root.find_element(By.TAG_NAME, "figcaption").text
    browser.save_screenshot(str(shots / "images.png"))


def test_a_video_job_completes_and_plays(browser, server, shots):
    open_playground(browser, server.url)
    root = show(browser, "video")
    fill(root, "num_inference_steps", 4)
    fill(root, "seed", 1)
    root.find_element(By.NAME, "create").click()
    status = root.find_element(By.CLASS_NAME, "job-status")
    wait_until(lambda: status.get_attribute("data-status"), WAIT_S, "the job's end")
    assert status.get_attribute("data-status") == "completed", root.text
    assert root.find_element(By.TAG_NAME, "progress").get_attribute("value") == "100"
    video = "document.querySelector('#panel-video video')"
    wait_for(browser, f"{video}.readyState >= 2", "the clip decoded")
    assert script(browser, f"return [{video}.videoWidth, {video}.videoHeight];") == [32, 32]
    wait_for(browser, f"{video}.currentTime > 0", "the clip playing")
    browser.save_screenshot(str(shots / "video.png"))


def test_bad_inputs_show_the_apis_message_beside_their_field(browser, server, http, shots, tmp_path):
    open_playground(browser, server.url)
    root = show(browser, "images")
    fill(root, "prompt", " ")
    root.find_element(By.NAME, "generate").click()
    expected = api_error(http.post("/v1/images/generations", json={"model": SHAPES_MODEL, "prompt": " "}))
    wait_until(lambda: error_beside(root, "prompt"), WAIT_S, "the prompt's error")
    assert error_beside(root, "prompt") == expected
    # The shapes model draws from text only: an edit is refused, and the page says why beside the upload.
    picture = tmp_path / "picture.png"
    Image.fromarray(np.full((32, 32, 3), 200, np.uint8)).save(picture)
    fill(root, "prompt", "a blue square")
    root.find_element(By.NAME, "image").send_keys(str(picture))
    root.find_element(By.NAME, "edit").click()
    files = {"image": ("picture.png", Path(picture).read_bytes(), "image/png")}
    edit = http.post("/v1/images/edits", data={"model": SHAPES_MODEL, "prompt": "a blue square"}, files=files)
    wait_until(lambda: error_beside(root, "image"), WAIT_S, "the upload's error")
    assert error_beside(root, "image") == api_error(edit)
    browser.save_screenshot(str(shots / "images-errors.png"))
    root = show(browser, "speech")
    fill(root, "response_format", "mp3")
    if not root.find_element(By.NAME, "stream").is_selected():
        root.find_element(By.NAME, "stream").click()
    root.find_element(By.NAME, "speak").click()
    body = {"model": VOICE_MODEL, "input": "hi", "response_format": "mp3", "stream_format": "sse"}
    wait_until(lambda: error_beside(root, "response_format"), WAIT_S, "the format's error")
    assert error_beside(root, "response_format") == api_error(http.post("/v1/audio/speech", json=body))


def test_live_voice_hears_the_microphone_answers_and_speaks(browser, server, http, shots, microphone):
    open_playground(browser, server.url)
    root = show(browser, "live")
    fill(root, "temperature", 0)
    fill(root, "max_output_tokens", ANSWER_TOKENS)
    # A wrong key: the server refuses the socket and the page says so beside the button.
    script(browser, "sessionStorage.setItem('omnistage.apiKey', 'wrong');")
    root.find_element(By.NAME, "start").click()
    refused = wait_until(lambda: error_beside_button(root, "start"), WAIT_S, "the refusal")
    assert refused == "the server refused the session (1006): check the API key"  # a refused handshake
    script(browser, "sessionStorage.setItem('omnistage.apiKey', arguments[0]);", API_KEY)
    root.find_element(By.NAME, "start").click()  # the microphone (the question's WAV) starts now
    heard_turn = "document.querySelector('#panel-live .msg.user[data-state=\"done\"]')"
    wait_for(browser, heard_turn, "the transcript")
    answer = root.find_element(By.CSS_SELECTOR, ".msg.assistant")
    wait_until(lambda: answer.get_attribute("data-state") != "streaming", WAIT_S, "the answer")
    assert answer.get_attribute("data-state") == "completed", root.text
    # The user's turn reads as Whisper reads the WAV the microphone played.
    files = {"file": ("question.wav", microphone.read_bytes(), "audio/wav")}
    heard = http.post("/v1/audio/transcriptions", data={"model": WHISPER_MODEL}, files=files)
    assert heard.status_code == 200, heard.text
    transcript = heard.json()["text"]
    assert transcript and root.find_element(By.CSS_SELECTOR, ".msg.user p").text == transcript.strip()
    # The answer is the chat model's greedy answer to that transcript, and its audio played out.
    messages = [{"role": "user", "content": transcript}]
    body = {"model": CHAT_MODEL, "messages": messages, "temperature": 0, "max_tokens": ANSWER_TOKENS}
    chat = http.post("/v1/chat/completions", json={**body, "modalities": ["text"]}).json()
    expected = chat["choices"][0]["message"]["content"]
    assert expected and answer.find_element(By.TAG_NAME, "p").text == expected.strip()
    samples_played = "Number(document.getElementById('panel-live').dataset.samplesPlayed || 0)"
    played = wait_for(browser, samples_played, "the answer's audio played")
    assert played > 0 and int(root.get_attribute("data-samples-sent")) > 0
    assert [e.text for e in root.find_elements(By.CSS_SELECTOR, ".error") if e.text] == []
    browser.save_screenshot(str(shots / "live.png"))
    # Stop: the session closes and the panel can start again.
    root.find_element(By.NAME, "stop").click()
    status = root.find_element(By.CLASS_NAME, "live-status")
    wait_until(lambda: status.get_attribute("data-state") == "closed", WAIT_S, "the session closed")
    buttons = [root.find_element(By.NAME, name).is_enabled() for name in ("start", "stop")]
    assert buttons == [True, False]
