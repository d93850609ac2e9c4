"""The hibari voice as a generation-engine generator: one input frame is one sentence.

`hibari-tts` (PyPI, Apache-2.0) ships a 6M-parameter int8 ONNX voice distilled from Kokoro-82M's
`af_heart`, with its own grapheme-to-phoneme front end. Its model takes one phoneme sequence at a time
(batch 1), so a pass over several requests runs their sentences one after the other, yielding between
sentences: a request's first sentence (its time to first audio) can overtake a long pass.

A sentence's noise comes from its own generator, seeded by (request seed, sentence index): a text spoken
whole, sentence by sentence, or as it streams in from an LLM gives the same samples. The waveform is made
from the network's spectra by hibari's own DSP or by a faster equivalent of it (`engine_args.synthesis`,
synthesis.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Generator as Steps
from typing import Any, Literal

import numpy as np
import torch

from omnistage.errors import ConfigError, InvalidRequestError
from omnistage.families.hibari.synthesis import SYNTHESES, fast_noise, synthesize
from omnistage.stages.engine_args import EngineArgs

PACKAGE = "hibari-tts"
PACKAGE_VERSION = "0.2.1"
BUNDLED_VOICE = "heart"  # the only voice inside the wheel; any other would be downloaded (never, here)
SAMPLE_RATE = 24000
SPEED_RANGE = (0.5, 2.0)  # the voice's own; pipeline.py declares it to the server
PAD = -1  # sentence rows are phoneme ids padded to one width
_LONG_NUMBER = re.compile(r"\d{13,}")
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class VoiceSettings:
    """What one request asks of the voice (carried in GenerationParams.extra)."""

    speed: float = 1.0
    seed: int = 0


def load_hibari(threads: int = 1) -> Any:
    """The bundled voice. Only `heart` ships in the package; the library would download any other."""
    try:
        from hibari import Hibari
        from hibari.voices import voice_path
    except ImportError:
        raise ConfigError(
            f"the demo voice needs the PyPI package {PACKAGE}; `pip install {PACKAGE}=={PACKAGE_VERSION}` "
            "(`make setup` does)"
        ) from None
    from omnistage.cache import cache_root

    # onnxruntime writes a folder under $XDG_CACHE_HOME (~/.cache/Microsoft) as it makes the session: point
    # it into omnistage's cache for that moment only (the variable also decides omnistage's own cache).
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache_root())
    try:
        model = voice_path(BUNDLED_VOICE, download_missing=False)
        return Hibari(voice=BUNDLED_VOICE, model=model, threads=threads)
    finally:
        if before is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = before


class HibariVoice:
    """`generate_steps(windows, params, starts, spans)`: the waveform of each window's sentences."""

    emits_spans = True
    outputs_per_frame = 1  # unused: a sentence's length in samples is the model's to decide
    sample_rate = SAMPLE_RATE

    def __init__(self, tts: Any, synthesis: str = "library"):
        if synthesis not in SYNTHESES:
            choices = ", ".join(SYNTHESES)
            raise ConfigError(f"engine_args.synthesis: must be one of {choices}, got {synthesis!r}")
        self.tts = tts
        self.synthesis = synthesis
        self.width = self._max_ids()

    def _max_ids(self) -> int:
        from hibari.tts import MAX_PHONEMES

        return MAX_PHONEMES + 2  # the two pads hibari puts around a sentence

    # ---- text → frames (runs in the input processors, in this stage's process) ------------------------
    def sentence_rows(self, text: str) -> torch.Tensor:
        """One padded row of phoneme ids per sentence the model will speak (none for text it cannot say)."""
        text = _LONG_NUMBER.sub(lambda m: " ".join(m.group()), text)  # hibari's numbers stop at 10**15
        try:
            phonemized = self.tts.phonemize(text)
        except Exception:  # noqa: BLE001 - its G2P on odd text; one unsayable unit must not fail a reply
            logger.warning("the voice cannot phonemize %r; skipping it", text[:80], exc_info=True)
            phonemized = []
        rows = [self.tts.ids(phonemes) for phonemes in phonemized]
        rows = [ids for ids in rows if len(ids) > 2]
        frames = torch.full((len(rows), self.width), PAD, dtype=torch.long)
        for i, ids in enumerate(rows):
            frames[i, : len(ids)] = torch.tensor(ids[: self.width])
        return frames

    # ---- frames → audio --------------------------------------------------------------------------------
    def generate_steps(
        self, windows: list[torch.Tensor], params: list[Any], starts: list[int], spans: list[tuple[int, int]]
    ) -> Steps[None, None, list[torch.Tensor]]:
        outputs = []
        for window, param, start, (skip, count) in zip(windows, params, starts, spans, strict=True):
            settings = settings_of(param)
            pieces = []
            for row in range(skip, skip + count):
                pieces.append(self.speak(window[row], settings, start + row))
                yield
            outputs.append(torch.cat(pieces) if pieces else torch.empty(0))
        return outputs

    def run(self, batch: Any) -> Steps[None, None, list[torch.Tensor]]:
        """The engine's call (stages/generation: `GenerationBatch`): a unit per sentence."""
        return self.generate_steps(batch.windows, batch.params, batch.starts, batch.spans)

    def generate(self, windows, params, starts, spans) -> list[torch.Tensor]:
        from omnistage.stages.generation.engine import run_to_end

        return run_to_end(self.generate_steps(windows, params, starts, spans))

    def speak(self, row: torch.Tensor, settings: VoiceSettings, index: int) -> torch.Tensor:
        ids = row[row != PAD].tolist()
        if self.synthesis == "library":
            rng = np.random.default_rng([settings.seed, index])
            return torch.from_numpy(self.tts.from_ids(ids, settings.speed, rng).astype(np.float32))
        if len(ids) < 3:  # what `from_ids` makes of a sentence with no phonemes
            return torch.empty(0)
        outputs = self.spectra(ids, settings.speed)
        noise = fast_noise(settings.seed, index, (outputs[0].shape[0], 2 * outputs[0].shape[1]))
        return torch.from_numpy(synthesize(outputs, noise))

    def spectra(self, ids: list[int], speed: float) -> list[np.ndarray]:
        """The network's outputs for one sentence, as `Hibari.from_ids` computes them."""
        feeds = {"ids": np.asarray([ids], np.int64), "speed": np.asarray([speed], np.float32)}
        return [out[0] for out in self.tts.sess.run(None, feeds)]


def settings_of(params: Any) -> VoiceSettings:
    extra = getattr(params, "extra", None) or {}
    seed = getattr(params, "seed", None)
    return VoiceSettings(speed=float(extra.get("speed", 1.0)), seed=0 if seed is None else int(seed))


def check_speed(speed: float, param: str = "speed") -> float:
    low, high = SPEED_RANGE
    if not low <= speed <= high:
        raise InvalidRequestError(
            f"{param}: must be in [{low}, {high}] for this voice, got {speed}", param=param
        )
    return speed


class VoiceArgs(EngineArgs):
    """The voice stage's `engine_args`."""

    threads: int = 1  # onnxruntime threads of the voice's network
    synthesis: Literal["library", "fast"] = "library"  # hibari's own DSP, or the faster equivalent
    max_chunk_sentences: int = 1  # sentences spoken in one pass by a request that fell behind


def create_engine(ctx: Any) -> Any:
    """The voice stage: one sentence per chunk, no context (sentences are spoken independently)."""
    from omnistage.stages.generation.engine import GenerationEngine

    args = VoiceArgs.of(ctx.engine_args)
    voice = HibariVoice(load_hibari(args.threads), args.synthesis)
    voice.sentence_rows("Ready.")  # its G2P loads its lexicons on first use: now, not in a request
    return GenerationEngine(
        voice, max_num_seqs=ctx.deploy.max_num_seqs, chunk_size=1, max_chunk_size=args.max_chunk_sentences
    )


create_engine.args_type = VoiceArgs
