"""Training's collapsed padding must equal what WanPipeline feeds the DiT at inference."""

import pytest
import torch

from omnistage.demo import architecture
from omnistage.demo.text_conditioning import collapsed_padding, encode_captions
from omnistage.demo.trainer import Components

pytestmark = pytest.mark.unit


def test_collapsed_padding_equals_pipeline_padding():
    arch = architecture.DemoArchitecture.tiny()
    parts = Components.build(arch, seed=0)
    tokenizer, text_encoder, transformer = parts.tokenizer, parts.text_encoder, parts.transformer
    pipe = architecture.assemble_pipeline(tokenizer, text_encoder, parts.vae, transformer, parts.scheduler)
    captions = ["a red circle on the left on a blue background", "two squares", ""]
    with torch.no_grad():
        padded, _ = pipe.encode_prompt(
            captions,
            do_classifier_free_guidance=False,
            device="cpu",
            max_sequence_length=architecture.MAX_SEQUENCE_LENGTH,
        )
        compact, bias = encode_captions(tokenizer, text_encoder, captions)
        latents = torch.randn(3, arch.vae_z_dim, 1, 8, 8)
        timesteps = torch.tensor([100.0, 500.0, 900.0])
        expected = transformer(latents, timesteps, padded, return_dict=False)[0]
        with collapsed_padding(transformer, bias):
            actual = transformer(latents, timesteps, compact, return_dict=False)[0]
        restored = transformer(latents, timesteps, padded, return_dict=False)[0]
    assert padded.shape[1] == 512 and compact.shape[1] == 12
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)
    assert torch.equal(restored, expected)  # the stock processors are back
