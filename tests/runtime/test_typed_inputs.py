"""Engines' typed request inputs (stages/typed_inputs.py): a dict is converted once, strictly; streamed
chunks join field by field."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omnistage.errors import InvalidRequestError
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.base import StageRequest
from omnistage.stages.generation.engine import GenerationEngine
from omnistage.stages.generation.generation_inputs import GenerationInputs
from omnistage.stages.typed_inputs import extend, inputs_of
from tests.support.toy_stages import ToyVocoder


@dataclasses.dataclass
class Rows:
    rows: torch.Tensor
    pad: torch.Tensor | None = None
    tags: list[str] = dataclasses.field(default_factory=list)


def test_a_dict_becomes_the_struct_and_an_unknown_key_is_named_with_its_close_match() -> None:
    embeds = torch.zeros(2, 3)
    got = inputs_of(ARInputs, {"inputs_embeds": embeds, "rope_delta": 4})
    assert isinstance(got, ARInputs) and got.inputs_embeds is embeds and got.rope_delta == 4
    assert inputs_of(ARInputs, None) == ARInputs()
    same = ARInputs(rope_delta=1)
    assert inputs_of(ARInputs, same) is same
    with pytest.raises(InvalidRequestError) as info:
        inputs_of(ARInputs, {"input_embeds": embeds})
    assert info.value.param == "input_embeds"
    assert "did you mean 'inputs_embeds'?" in str(info.value)
    with pytest.raises(InvalidRequestError) as info:
        inputs_of(GenerationInputs, {"codes": embeds})  # the old magic key
    assert info.value.param == "codes" and "frames" in str(info.value)
    with pytest.raises(InvalidRequestError) as info:
        inputs_of(GenerationInputs, [1, 2])
    assert info.value.param == "inputs"


def test_chunks_grow_tensors_and_lists_fill_unset_fields_and_leave_the_rest() -> None:
    pad = torch.ones(3)
    inputs = ARInputs(rope_delta=5, extension=Rows(torch.zeros(2, 3), pad, ["a"]))
    extend(inputs, ARInputs(extension=Rows(torch.ones(1, 3), tags=["b"])))
    assert inputs.rope_delta == 5  # a chunk's default leaves the request's value
    assert inputs.extension.rows.tolist() == [[0.0] * 3, [0.0] * 3, [1.0] * 3]
    assert inputs.extension.pad is pad and inputs.extension.tags == ["a", "b"]
    extend(inputs, ARInputs(output_data={"k": 1}))
    assert inputs.output_data == {"k": 1} and inputs.extension.rows.shape == (3, 3)
    extend(inputs, None)
    assert inputs.extension.rows.shape == (3, 3)
    with pytest.raises(TypeError):
        extend(inputs, GenerationInputs(torch.zeros(1)))


def test_a_generation_request_with_an_unknown_input_fails_and_a_typed_one_decodes() -> None:
    engine = GenerationEngine(ToyVocoder(outputs_per_frame=2))
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(StageRequest("bad", inputs={"frame": torch.arange(3)}))
    assert info.value.param == "frame" and "'frames'" in str(info.value)
    engine.add_request(StageRequest("r", inputs=GenerationInputs(torch.arange(3))))
    (out,) = engine.step()
    assert out.finished and out.audio.shape == (6,)
