"""Structured fields in multipart forms: JSON text (curl) and bracket notation (the `openai` client's
`extra_body` in an images.edit form) read into the same lists and objects; malformed ones are 400s."""

from __future__ import annotations

import pytest
from starlette.datastructures import FormData

from omnistage.serving.errors import SchemaError
from omnistage.serving.forms import text_fields

STRUCTURED = frozenset({"stage_params"})


def read(*items: tuple[str, str]) -> dict:
    return text_fields(FormData(list(items)), {"image"}, STRUCTURED)


def test_json_and_brackets_read_alike() -> None:
    want = [{"top_k": 1, "temperature": 0.5}, {"num_inference_steps": 3}]
    assert (
        read(("stage_params", '[{"top_k": 1, "temperature": 0.5}, {"num_inference_steps": 3}]'))[
            "stage_params"
        ]
        == want
    )
    brackets = read(
        ("prompt", "[draw] a cat"),
        ("stage_params[][top_k]", "1"),
        ("stage_params[][temperature]", "0.5"),
        ("stage_params[][num_inference_steps]", "3"),
    )
    assert brackets["stage_params"] == [{"top_k": 1, "temperature": 0.5, "num_inference_steps": 3}]
    assert brackets["prompt"] == "[draw] a cat"  # other fields stay text
    two = read(("stage_params[][top_k]", "1"), ("stage_params[][top_k]", "2"))
    assert two["stage_params"] == [{"top_k": 1}, {"top_k": 2}]
    nested = read(("stage_params[][extra][style]", "ink"))
    assert nested["stage_params"] == [{"extra": {"style": "ink"}}]


@pytest.mark.parametrize(
    "item", [("stage_params", "[{not json"), ("stage_params[top_k", "1"), ("stage_params[]x", "1")]
)
def test_malformed_structured_fields_are_refused(item: tuple[str, str]) -> None:
    with pytest.raises(SchemaError) as refused:
        read(item)
    assert refused.value.param == "stage_params"
