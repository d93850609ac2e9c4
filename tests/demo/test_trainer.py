"""A tiny slice of `omnistage demo train`, so the trainer keeps working: every phase, resume, and learning."""

import random

import pytest
import torch
from diffusers import DiffusionPipeline

from omnistage.demo import architecture, trainer
from omnistage.demo.checkpoint import load_state, save_state
from omnistage.demo.dit_training import LatentSet, flow_matching_loss
from omnistage.demo.text_conditioning import encode_captions
from omnistage.demo.vae_training import decode_unclamped

pytestmark = pytest.mark.engine


def test_every_phase_runs_resumes_and_exports(tmp_path):
    args = ["--tiny", "--workdir", str(tmp_path / "work"), "--output", str(tmp_path / "pipe"), "--seed", "1"]
    first = ["--vae-steps", "2", "--dit-steps", "4", "--dit-stop-at", "2", "--phases", "vae,latents,dit"]
    assert trainer.main([*args, *first]) == 0
    assert torch.load(tmp_path / "work" / "dit_state.pt", weights_only=False)["step"] == 2
    assert trainer.main([*args, "--vae-steps", "2", "--dit-steps", "4", "--phases", "dit,export"]) == 0
    log = (tmp_path / "work" / "train.log").read_text()
    assert (
        "resumed dit_state.pt at step 2" in log and "dit step 4/4" not in log.split("resumed dit_state.pt")[0]
    )
    assert torch.load(tmp_path / "work" / "dit_state.pt", weights_only=False)["step"] == 4
    pipe = DiffusionPipeline.from_pretrained(tmp_path / "pipe")
    assert pipe.vae.config.latents_std != [1.0] * pipe.vae.config.z_dim  # measured statistics recorded
    frames = pipe(
        "a red circle", height=32, width=32, num_frames=5, num_inference_steps=2, output_type="np"
    ).frames
    assert frames.shape == (1, 5, 32, 32, 3)


def test_flow_matching_fits_a_batch():
    """A few optimizer steps on one batch lower the loss: objective, padding and text path are connected."""
    arch = architecture.DemoArchitecture.tiny()
    parts = trainer.Components.build(arch, seed=0)
    tokenizer, text_encoder, transformer = parts.tokenizer, parts.text_encoder, parts.transformer
    latents = LatentSet(
        torch.randn(4, arch.vae_z_dim, 1, 8, 8).half(), ["a red circle", "two blue squares", "a", ""]
    )
    batch, captions = latents.batch(random.Random(0), 4)
    params = [*transformer.parameters(), *text_encoder.parameters()]
    optimizer = torch.optim.AdamW(params, lr=3e-3)

    def loss_at(seed: int) -> torch.Tensor:
        embeddings, bias = encode_captions(tokenizer, text_encoder, captions)
        return flow_matching_loss(
            transformer, batch, embeddings, bias, torch.Generator().manual_seed(seed), 2.0
        )

    with torch.no_grad():
        before = float(sum(loss_at(s) for s in range(4)))
    for step in range(25):
        loss_at(step % 4).backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        after = float(sum(loss_at(s) for s in range(4)))
    assert after < 0.8 * before


def test_unclamped_decode_matches_diffusers_decode():
    """The VAE trains through a copy of diffusers' decode loop; it must stay the same computation."""
    torch.manual_seed(0)
    vae = architecture.build_vae(architecture.DemoArchitecture.tiny())
    z = torch.randn(2, vae.config.z_dim, 3, 8, 8)
    with torch.no_grad():
        reference = vae.decode(z).sample
        unclamped = decode_unclamped(vae, z)
    assert unclamped.shape == reference.shape == (2, 3, 9, 32, 32)
    assert unclamped.abs().max() > 1  # a random decoder overshoots, so the clamp matters
    torch.testing.assert_close(unclamped.clamp(-1, 1), reference)


def test_a_checkpoint_from_another_configuration_is_named_not_loaded(tmp_path):
    """A workdir left by an earlier architecture (the DiT went from patch 2 to patch 1) must not resume into
    a size-mismatch traceback: the error names the file and what to do."""
    path = tmp_path / "dit_state.pt"
    save_state(path, 7, {"transformer": torch.nn.Linear(2, 3)})
    with pytest.raises(RuntimeError, match="dit_state.pt does not fit this run's transformer"):
        load_state(path, {"transformer": torch.nn.Linear(2, 4)})
    resumed = torch.nn.Linear(2, 3)
    assert load_state(path, {"transformer": resumed}) == 7
