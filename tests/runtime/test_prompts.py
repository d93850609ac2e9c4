"""What a Python API user may pass as a prompt becomes one typed prompt, or a 400 naming the field."""

import numpy as np
import pytest

from omnistage.errors import InvalidRequestError
from omnistage.prompts import AudioPrompt, ChatPrompt, SpeechPrompt, TextPrompt, as_prompt, prompt_text

pytestmark = pytest.mark.unit


def test_strings_ids_and_vllm_dicts_become_typed_prompts():
    assert as_prompt("hi") == TextPrompt(text="hi")
    assert as_prompt([1, 2]) == TextPrompt(token_ids=[1, 2])
    assert as_prompt({"prompt_token_ids": [3]}) == TextPrompt(token_ids=[3], templated=True)
    image, wave = np.zeros((4, 4, 3), np.uint8), np.zeros(160, np.float32)
    text = as_prompt({"prompt": "<img> x", "negative_prompt": "blur", "multi_modal_data": {"image": image}})
    assert isinstance(text, TextPrompt) and text.templated and text.negative_prompt == "blur"
    assert list(text.media()) == ["image"] and text.images[0] is image
    messages = [{"role": "user", "content": "a"}]
    chat = as_prompt({"messages": messages, "multi_modal_data": {"audio": (wave, 16000)}, "speaker": "x"})
    assert isinstance(chat, ChatPrompt) and chat.speaker == "x"
    assert len(chat.audios) == 1 and chat.audios[0][1] == 16000  # one (samples, rate) pair, not two clips
    speech = as_prompt({"input": "say", "voice_style": "calm", "speed": 1.5})
    assert isinstance(speech, SpeechPrompt) and speech.speed == 1.5
    assert speech.options == {"voice_style": "calm"}  # the family's own options, checked where declared
    audio = as_prompt({"audio": wave, "task": "translate"})
    assert isinstance(audio, AudioPrompt) and audio.task == "translate"
    assert [prompt_text(p) for p in (text, chat, speech, audio)] == ["<img> x", "a", "say", ""]


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (3.5, "prompt"),
        ({"text": "hi"}, "prompt"),
        ({"prompt": "x", "multi_modal_data": [1]}, "multi_modal_data"),
        ({"prompt": "x", "multi_modal_data": {"images": [1]}}, "multi_modal_data"),
    ],
)
def test_what_is_not_a_prompt_is_refused_by_field(value, param):
    with pytest.raises(InvalidRequestError) as err:
        as_prompt(value)
    assert err.value.param == param
