"""Chat completions through the official openai client against a real server process."""

import base64
import io
import json

import numpy as np
import openai
import pytest
import soundfile as sf
from PIL import Image

from omnistage.media import encode_image
from omnistage.params import DiffusionParams, SamplingParams
from omnistage.serving.media import data_url, wav_bytes

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "hello"}]
HELLO_PROMPT = {"messages": [{"role": "user", "content": "hello"}]}


def test_chat_text_equals_offline_generation(client, reference):
    reply = client.chat.completions.create(model="toy-omni", messages=HELLO, max_tokens=6)
    expected = reference.run("toy-omni", HELLO_PROMPT, SamplingParams(max_tokens=6), ["text"])
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 6
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids) > 0
    assert reply.model == "toy-omni" and reply.id.startswith("chatcmpl-")


def test_chat_streaming_deltas_add_up_to_the_same_text(client, reference):
    stream = client.chat.completions.create(
        model="toy-omni", messages=HELLO, max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected = reference.run("toy-omni", HELLO_PROMPT, SamplingParams(max_tokens=6), ["text"])
    assert text == expected.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert all(c.model_extra.get("modality") == "text" for c in chunks if c.choices)


def test_tools_on_a_model_that_takes_none_are_a_400_naming_them(client):
    """toy-omni's pipeline declares no tool-call format: `tools` is refused, `tool_choice: none` is not."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="toy-omni", messages=HELLO, max_tokens=2, tools=[tool])
    assert refused.value.body["param"] == "tools" and "does not call tools" in refused.value.body["message"]
    reply = client.chat.completions.create(
        model="toy-omni", messages=HELLO, max_tokens=2, tools=[tool], tool_choice="none"
    )
    assert reply.choices[0].message.tool_calls is None


def test_chat_n_choices_and_developer_role(client):
    reply = client.chat.completions.create(
        model="toy-omni",
        messages=[{"role": "developer", "content": "be brief"}, *HELLO],
        max_tokens=3,
        n=2,
        seed=1,
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage.completion_tokens == 6


def test_chat_media_parts_are_decoded_and_passed_on(client, reference, media_dir):
    image = encode_image(np.full((8, 8, 3), 200, dtype=np.uint8))
    (media_dir / "cat.png").write_bytes(image)
    audio = base64.b64encode(wav_bytes(np.zeros(1600, dtype=np.float32), 16000)).decode()
    content = [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": data_url("image/png", image)}},
        {"type": "image_url", "image_url": {"url": f"file://{media_dir}/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}},
    ]
    reply = client.chat.completions.create(
        model="toy-omni", messages=[{"role": "user", "content": content}], max_tokens=5
    )
    parts = [
        {"type": "text", "text": "what is this"},
        {"type": "image"},
        {"type": "image"},
        {"type": "audio"},
    ]
    prompt = {
        "messages": [{"role": "user", "content": parts}],
        "multi_modal_data": {"image": [None, None], "audio": [None]},
    }
    expected = reference.run("toy-omni", prompt, SamplingParams(max_tokens=5), ["text"])
    assert reply.choices[0].message.content == expected.text


def decode_wav(b64: str) -> tuple[np.ndarray, int]:
    samples, rate = sf.read(io.BytesIO(base64.b64decode(b64)), dtype="int16")
    return samples, rate


def test_chat_text_and_audio_out(client, reference):
    reply = client.chat.completions.create(
        model="toy-omni",
        messages=HELLO,
        max_tokens=4,
        modalities=["text", "audio"],
        audio={"voice": "x", "format": "wav"},
    )
    message = reply.choices[0].message
    prompt = {**HELLO_PROMPT, "speaker": "x"}  # the requested voice reaches the pipeline
    expected = reference.run("toy-omni", prompt, SamplingParams(max_tokens=4), ["text", "audio"])
    assert message.content == expected.text
    samples, rate = decode_wav(message.audio.data)
    assert rate == message.audio.model_extra["sample_rate"] == 16000
    want = (expected.audio.numpy().clip(-1, 1) * 32767).round().astype(np.int16)
    np.testing.assert_array_equal(samples, want)
    assert message.audio.transcript == expected.text


def test_chat_audio_streaming_chunks_are_wavs_that_concatenate_to_the_whole(client, reference):
    stream = client.chat.completions.create(
        model="toy-omni", messages=HELLO, max_tokens=4, modalities=["text", "audio"], stream=True
    )
    chunks = [c for c in stream if c.choices]
    audio_chunks = [
        c.choices[0].delta.content
        for c in chunks
        if c.model_extra["modality"] == "audio" and c.choices[0].delta.content
    ]
    assert len(audio_chunks) >= 2  # the vocoder streams while codes arrive
    pcm = np.concatenate([decode_wav(a)[0] for a in audio_chunks])
    expected = reference.run("toy-omni", HELLO_PROMPT, SamplingParams(max_tokens=4), ["text", "audio"])
    want = (expected.audio.numpy().clip(-1, 1) * 32767).round().astype(np.int16)
    np.testing.assert_array_equal(pcm, want)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.model_extra["modality"] == "text")
    assert text == expected.text


def test_chat_on_a_diffusion_model_returns_images(client, reference, http):
    reply = client.chat.completions.create(
        model="toy-image",
        messages=[{"role": "user", "content": "a red fox"}],
        extra_body={"size": "16x8", "seed": 3, "num_inference_steps": 2},
    )
    parts = reply.choices[0].message.content
    assert isinstance(parts, list) and parts[0]["type"] == "image_url"
    png = base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1])
    expected = reference.run(
        "toy-image", "a red fox", DiffusionParams(width=16, height=8, seed=3, num_inference_steps=2)
    )
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), np.asarray(expected.images[0]))
    # curl style: the generation fields nested under "extra_body" give the same image
    nested = {
        "model": "toy-image",
        "messages": [{"role": "user", "content": "a red fox"}],
        "extra_body": {"size": "16x8", "seed": 3, "num_inference_steps": 2},
    }
    again = http.post(
        "/v1/chat/completions", content=json.dumps(nested), headers={"content-type": "application/json"}
    )
    assert (
        again.json()["choices"][0]["message"]["content"][0]["image_url"]["url"]
        == parts[0]["image_url"]["url"]
    )
