"""The Qwen3-Omni talker runs on the engine's lean decoder (stages/ar/cpu/lean_decoder.py), and so does its
code predictor's frame, over a dense per-frame KV cache (stages/ar/cpu/dense_kv.py) instead of transformers'
`DynamicCache`: every logit of a frame is the predictor's own forward's (bit for bit on torch ops, to float
rounding through the native kernels), and so are its codes. test_stages.py checks the whole talker against
the reference through the engine."""

import pytest
import torch

from omnistage.families.qwen3_omni.loaders import load_talker
from omnistage.families.shared import depth_codes as frames
from omnistage.stages.ar.cpu.lean_decoder import LeanDecoder
from omnistage.stages.ar.cpu.packed_linear import pack_linears, packing_available
from tests.ar.ar_helpers import use_pointwise

pytestmark = pytest.mark.engine


def test_the_talker_engine_runs_the_lean_decoder(engines):
    runner = engines[1].runner
    assert isinstance(runner.decoder, LeanDecoder)
    assert runner.decoder.model is engines[1].model.decoder


@pytest.mark.parametrize("pointwise", ["torch", "native"])
def test_code_predictor_frame_equals_its_own_forward(omni3_dir, pointwise):
    model = load_talker(str(omni3_dir), torch.float32, "cpu")
    if packing_available():  # as the engine does
        for module in (model.decoder, model.head, *model.step_modules):
            pack_linears(module)
    predictor = model.talker.code_predictor
    lean = frames._frame_decoder(predictor.model, None)
    assert isinstance(lean, LeanDecoder)
    use_pointwise(lean, pointwise)

    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, model.config.hidden_size, generator=gen)
    code0 = model.embed(torch.tensor([0, 7, 100, 1500, 2047]))
    logits: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    out = {}
    with torch.inference_mode():
        for use_lean, log in logits.items():

            def pick(j, step_logits, log=log):
                log.append(step_logits.clone())
                return step_logits.argmax(dim=-1)

            out[use_lean] = frames.residual_codes(
                predictor.model,
                predictor.lm_head,
                predictor.model.codec_embedding,
                hidden,
                code0,
                pick=pick,
                lean=use_lean,
            )
    assert out[True][0].shape == (5, 15)
    assert torch.equal(out[True][0], out[False][0])
    assert torch.equal(out[True][1], out[False][1])
    assert len(logits[True]) == len(logits[False]) == 15
    for lean_logits, own_logits in zip(logits[True], logits[False], strict=True):
        if pointwise == "torch":
            assert torch.equal(lean_logits, own_logits)
        else:
            torch.testing.assert_close(lean_logits, own_logits, rtol=1e-5, atol=1e-5)
