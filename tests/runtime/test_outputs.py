"""A stage's accumulated result: the payload streamed in chunks, read whole or by its newest rows."""

import pytest
import torch

from omnistage.outputs import StageOutput, StageResult

pytestmark = pytest.mark.unit


def test_tail_reads_the_newest_rows_across_chunk_boundaries():
    result = StageResult(stage_id=0)
    for rows in (3, 1, 4):
        result.add(StageOutput("r", tensors={"h": torch.randn(rows, 5)}))
    whole = result.tensor("h")
    assert whole.shape == (8, 5)
    for rows in (0, 2, 4, 5, 8):
        assert torch.equal(result.tail("h", rows), whole[8 - rows :])
    assert result.tail("h", 0).shape == (0, 5)
    with pytest.raises(ValueError, match="8 rows, 9 requested"):
        result.tail("h", 9)
    with pytest.raises(ValueError, match="0 rows"):
        result.tail("missing", 0)
