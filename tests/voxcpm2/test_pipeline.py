"""The voxcpm2 pipeline end to end (offline API, one process, full handoff): a checkpoint directory resolves
to the family by its files, a request speaks the reference's waveform (`VoxCPM2Model.generate` with the same
noise) within 1e-4, and so does a cloned voice, continued (`ref_audio` + `ref_text`, the reference's
`prompt_wav_path` + `prompt_text`) or referenced (`ref_audio` alone, its `reference_wav_path`); the VAE
stage's async chunks, each decoded behind its exact left context, join into the one-pass waveform."""

from __future__ import annotations

import io

import pytest
import soundfile
import torch

from omnistage import Omni
from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageSpec
from omnistage.families.resolve import resolve_pipeline
from omnistage.families.voxcpm2.tiny import tiny_voxcpm2_dir
from omnistage.families.voxcpm2.vae import create_engine
from omnistage.params import SamplingParams
from omnistage.prompts import SpeechPrompt
from omnistage.stages.base import EngineContext, StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.voxcpm2.reference import MAX_NEW, PROMPTS, SEEDS, clip, reference_audio, reference_latents

pytestmark = pytest.mark.engine

INLINE = "omnistage/families/voxcpm2/voxcpm2_inline.yaml"
TOLERANCE = 1e-4


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and float((got - want).abs().max()) <= TOLERANCE


def wav_bytes(samples) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, 16000, format="WAV", subtype="FLOAT")
    return out.getvalue()


def test_speech_and_cloned_voices_equal_reference_waveform(tmp_path) -> None:
    model_dir = str(tiny_voxcpm2_dir())
    assert resolve_pipeline(model_dir)[0].name == "voxcpm2"
    sample = clip(0.3, 180.0)
    path = tmp_path / "voice.wav"
    path.write_bytes(wav_bytes(sample))
    cases = [
        (PROMPTS[0], SEEDS[0], {}, {}),
        (PROMPTS[1], SEEDS[1], {}, {}),
        (
            PROMPTS[2],
            3,
            {"ref_audio": wav_bytes(sample), "ref_text": "Once upon a time."},
            {"prompt_wav_path": str(path), "prompt_text": "Once upon a time."},
        ),
        (PROMPTS[3], 4, {"ref_audio": wav_bytes(sample)}, {"reference_wav_path": str(path)}),
    ]
    with Omni(model_dir, INLINE) as omni:
        for text, seed, options, reference_kwargs in cases:
            params = SamplingParams(seed=seed, max_tokens=MAX_NEW)
            out = omni.generate(SpeechPrompt(input=text, options=options), [params, None], use_tqdm=False)[0]
            assert out.error is None, out.error
            want = reference_audio(text, seed, **reference_kwargs)
            assert out.sample_rate == 16000 and want.shape[0] > 0 and float(want.abs().max()) > 0.0
            assert close(out.audio.reshape(-1), want), (text, options.keys())


def vae_engine(**engine_args):
    """The VAE stage's engine, async chunk, on the tiny checkpoint."""
    deploy = StageDeploy(stage_id=1, async_chunk=True, max_num_seqs=8, engine_args=engine_args)
    stage = StageSpec(1, "vae", "generation", final_output=True, output_modality="audio")
    return create_engine(EngineContext(stage=stage, deploy=deploy, model_dir=str(tiny_voxcpm2_dir())))


@pytest.mark.parametrize("left", ["stream", "exact"])
def test_async_chunks_join_into_the_one_pass_waveform(left: str) -> None:
    """The VAE engine fed a request's patches a few at a time decodes each chunk continuing the request's
    stream (the default) or behind its exact left context: joined, the one-pass waveform within 1e-4 (two
    requests interleaved)."""
    eng = vae_engine(chunk_frames=3, first_chunk_frames=1, left_context_frames=left)
    assert eng.streams == (left == "stream") and (eng.left_context > 0) == (left == "exact")
    patches = [reference_latents(PROMPTS[i], SEEDS[i]) for i in (0, 1)]
    whole = [eng.generator.generate([p], [None])[0] for p in patches]
    audio: dict[str, list[torch.Tensor]] = {"r0": [], "r1": []}
    fed = [2, 2]
    for i in (0, 1):
        eng.add_request(StageRequest(f"r{i}", inputs=GenerationInputs(patches[i][:2]), streaming_input=True))
    finished: set[str] = set()
    for _ in range(1000):
        for i in (0, 1):
            if fed[i] < len(patches[i]):
                new = patches[i][fed[i] : fed[i] + 2]
                fed[i] += len(new)
                eng.add_chunk(f"r{i}", GenerationInputs(new), last=fed[i] == len(patches[i]))
        for out in eng.step():
            audio[out.request_id].append(out.audio)
            finished |= {out.request_id} if out.finished else set()
        if finished == {"r0", "r1"}:
            break
    for i in (0, 1):
        assert close(torch.cat(audio[f"r{i}"]), whole[i]), i


def test_a_stage_that_fell_behind_streams_the_same_bits() -> None:
    """The served chunking (a first patch, then 8 a pass): a request whose patches reach the VAE one at a time
    and one whose last 19 arrive with its end (the stage fell behind) are decoded on the same grid, whole
    chunks apart from the tail, and give the same bits (a 19-patch pass rounds ~2e-7 apart): the same
    request speaks the same audio however busy the machine is."""
    patches = reference_latents(PROMPTS[0], SEEDS[0])
    assert len(patches) == 20

    def joined(feeds: list[int]) -> tuple[torch.Tensor, list[int]]:
        eng = vae_engine(chunk_frames=8, first_chunk_frames=1)
        eng.add_request(StageRequest("r", inputs=GenerationInputs(patches[:1]), streaming_input=True))
        fed, audio = 1, []
        for _ in range(100):
            if feeds:
                new = patches[fed : fed + feeds.pop(0)]
                fed += len(new)
                eng.add_chunk("r", GenerationInputs(new), last=fed == len(patches))
            outs = eng.step()
            audio += [out.audio.reshape(-1) for out in outs]
            if any(out.finished for out in outs):
                break
        return torch.cat(audio), [len(piece) // 80 for piece in audio]

    kept_up, kept_up_spans = joined([1] * 19)
    behind, behind_spans = joined([19])
    assert kept_up_spans == [1, 8, 8, 3] and behind_spans == [1, 16, 3]
    assert torch.equal(kept_up, behind)
