"""Voices: each model's own, and the ones clients upload.

A model's own voices are its family's declaration (`Capabilities.voices`, with their aliases) plus what its
checkpoint holds (`Capabilities.voices_of`, read once at start). An uploaded voice is one safetensors file
under the voices dir — its samples, with name, consent, ref_text, sample rate and so on in the header — so a
restart finds every voice again by scanning the dir, and deleting a voice is deleting its file.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from omnistage.errors import InvalidRequestError, NotFoundError
from omnistage.media import voice_samples
from omnistage.serving.protocol import VOICE_NAME_PATTERN
from omnistage.serving.served import ServedModel, ServedModels

logger = logging.getLogger(__name__)

_NAME = re.compile(VOICE_NAME_PATTERN)
_SUFFIX = ".safetensors"


@dataclasses.dataclass(frozen=True)
class UploadedVoice:
    name: str
    consent: str
    created_at: int
    file_size: int  # of the upload
    mime_type: str
    sample_rate: int
    path: Path
    ref_text: str | None = None

    def describe(self) -> dict[str, Any]:
        entry = {
            "name": self.name,
            "consent": self.consent,
            "created_at": self.created_at,
            "file_size": self.file_size,
            "mime_type": self.mime_type,
            "sample_rate": self.sample_rate,
        }
        return {**entry, "ref_text": self.ref_text} if self.ref_text is not None else entry

    def samples(self) -> np.ndarray:
        return voice_samples(self.path)[0]

    @classmethod
    def read(cls, path: Path) -> UploadedVoice:
        from safetensors import safe_open

        with safe_open(path, "np") as handle:
            meta = handle.metadata() or {}
        return cls(
            name=meta["name"],
            consent=meta["consent"],
            created_at=int(meta["created_at"]),
            file_size=int(meta["file_size"]),
            mime_type=meta["mime_type"],
            sample_rate=int(meta["sample_rate"]),
            path=path,
            ref_text=meta.get("ref_text"),
        )


class VoiceStore:
    """The uploaded voices of one voices dir, at most `max_count` of them."""

    def __init__(self, root: Path, max_count: int):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_count = max_count
        self.voices: dict[str, UploadedVoice] = {}
        for path in sorted(self.root.glob(f"*{_SUFFIX}")):
            try:
                voice = UploadedVoice.read(path)
            except Exception as exc:  # a foreign or broken file must not stop the server
                logger.warning("skipping %s: not an uploaded voice (%s)", path, exc)
                continue
            self.voices[voice.name] = voice
        logger.info("%d uploaded voice(s) in %s", len(self.voices), self.root)

    def get(self, name: str) -> UploadedVoice | None:
        return self.voices.get(name)

    def list(self) -> list[UploadedVoice]:
        return [self.voices[name] for name in sorted(self.voices)]

    def add(
        self,
        name: str,
        samples: np.ndarray,
        sample_rate: int,
        *,
        consent: str,
        mime_type: str,
        file_size: int,
        ref_text: str | None = None,
    ) -> UploadedVoice:
        """Persist a voice (replacing one of the same name); the file appears whole or not at all."""
        from safetensors.numpy import save_file

        if not _NAME.match(name):
            raise InvalidRequestError(f"name: {name!r} must match {VOICE_NAME_PATTERN}", param="name")
        if name not in self.voices and len(self.voices) >= self.max_count:
            raise InvalidRequestError(
                f"audio_sample: the server holds its maximum of {self.max_count} uploaded voices; delete one "
                "first",
                param="audio_sample",
            )
        if name in self.voices:
            logger.warning("uploaded voice %r replaced", name)
        meta = {
            "name": name,
            "consent": consent,
            "created_at": str(int(time.time())),
            "file_size": str(file_size),
            "mime_type": mime_type,
            "sample_rate": str(sample_rate),
            **({"ref_text": ref_text} if ref_text is not None else {}),
        }
        path = self.root / f"{name}{_SUFFIX}"
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=_SUFFIX, dir=self.root)
        os.close(fd)
        try:
            save_file({"audio": np.ascontiguousarray(samples, dtype=np.float32)}, tmp, metadata=meta)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.voices[name] = UploadedVoice.read(path)
        return self.voices[name]

    def delete(self, name: str) -> None:
        voice = self.voices.pop(name, None)
        if voice is None:
            raise NotFoundError(f"voice {name!r} not found", param="name")
        voice.path.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class ModelVoices:
    """One model's own voices: every name it answers to, which of them are aliases, whether it clones."""

    model: str
    voices: tuple[str, ...]
    aliases: dict[str, str]
    clones_voices: bool

    def describe(self) -> dict[str, Any]:
        own = [v for v in self.voices if v not in self.aliases]
        aliases, clones = self.aliases, self.clones_voices
        return {"model": self.model, "voices": own, "aliases": aliases, "clones_voices": clones}


def model_voices(model: ServedModel) -> ModelVoices:
    """The model's declared voices plus its checkpoint's (`voices_of`, called with the model dir)."""
    caps = model.capabilities
    voices = list(caps.voices)
    model_dir = getattr(model.omni, "model_dir", None)
    if caps.voices_of and model_dir:
        module, _, function = caps.voices_of.partition(":")
        found = getattr(importlib.import_module(module), function)(model_dir)
        voices += [v for v in found if v not in voices]
    return ModelVoices(model.name, tuple(voices), dict(caps.voice_aliases), caps.clones_voices)


class Voices:
    """What `/v1/audio/voices` lists and what a request's `voice` may name."""

    def __init__(self, models: ServedModels, store: VoiceStore):
        self.store = store
        self.models = {m.name: model_voices(m) for m in models if m.produces("audio")}  # the ones that speak

    def builtin(self) -> set[str]:
        return {v for m in self.models.values() for v in m.voices}

    def check(self, model: ServedModel, voice: str | None, param: str = "voice") -> UploadedVoice | None:
        """The uploaded voice a request names (None: a model's own voice, or none named); 400 for a voice
        the model does not have or an uploaded voice on a model that cannot clone."""
        own = self.models.get(model.name) or model_voices(model)
        if not voice or voice in own.voices:
            return None
        uploaded = self.store.get(voice)
        if uploaded is not None:
            if not own.clones_voices:
                raise InvalidRequestError(
                    f"{param}: {voice!r} is an uploaded voice and model {model.name!r} cannot speak in "
                    f"uploaded voices; its voices: {list(own.voices)}",
                    param=param,
                )
            return uploaded
        if own.voices:
            raise InvalidRequestError(
                f"{param}: unknown voice {voice!r}; model {model.name!r} has {list(own.voices)}", param=param
            )
        return None  # a model that declares no voices: its stages decide
