"""LoRA adapters per request on a diffusion stage: loaded through diffusers' own loader (the pipeline's
`load_lora_weights`: PEFT / diffusers / kohya safetensors), kept in a bounded cache, and switched in before
each forward of a group of requests that share one adapter and scale (the engine never batches requests
with different adapters: `key`).

A request's adapter is loaded when the request arrives (a file diffusers cannot read is a 400 naming
`lora`), and pinned until the request ends: the cache evicts the least recently used adapter no request
holds; when every cached adapter is held, a new one is refused rather than swapped under a running request.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.params import LoraRequest
from omnistage.stages.diffusion import offload

logger = logging.getLogger(__name__)
DEFAULT_MAX_LORAS = 4
_STALE = ("stale",)  # the layers' adapter state changed underneath (a load or an unload)


def adapter_name(lora: LoraRequest) -> str:
    """The name the adapter has inside the pipeline: its name and path (a name registered again with
    another file is another adapter), as a module-key-safe string."""
    digest = hashlib.sha1(f"{lora.name}\0{lora.path}".encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() else "_" for c in lora.name)[:40]
    return f"{safe}_{digest}"


def key(lora: LoraRequest | None) -> tuple | None:
    """What requests must share to run in one forward: the adapter and its scale (None: no adapter)."""
    return None if lora is None else (adapter_name(lora), float(lora.scale))


class LoraCache:
    """`offload`: the stage's offload mode (engine_args), whose hooks a load must take off and put back."""

    def __init__(self, pipe: Any, max_loras: int = DEFAULT_MAX_LORAS, offload: str | None = None):
        if max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        self.pipe = pipe
        self.max_loras = max_loras
        self.offload = offload
        self.loaded: collections.OrderedDict[str, LoraRequest] = collections.OrderedDict()  # LRU order
        self.holders: collections.Counter[str] = collections.Counter()
        self.active: tuple | None = None  # what the pipeline's layers apply now
        self.loads = 0

    @property
    def supported(self) -> bool:
        return hasattr(self.pipe, "load_lora_weights")

    def acquire(self, lora: LoraRequest | None) -> None:
        """Load (if needed) and pin the request's adapter."""
        if lora is None:
            return
        if not self.supported:
            raise InvalidRequestError(
                f"lora: {type(self.pipe).__name__} does not take LoRA adapters", param="lora"
            )
        name = adapter_name(lora)
        if name not in self.loaded:
            self._make_room(lora)
            self._load(lora, name)
        self.loaded.move_to_end(name)
        self.holders[name] += 1

    def release(self, lora: LoraRequest | None) -> None:
        if lora is None:
            return
        name = adapter_name(lora)
        self.holders[name] -= 1
        if self.holders[name] <= 0:
            del self.holders[name]

    def apply(self, lora: LoraRequest | None) -> None:
        """Make the pipeline's layers apply `lora` at its scale (or no adapter) for the next forwards."""
        wanted = key(lora)
        if wanted == self.active:
            return
        if wanted is None and not self.loaded:
            pass  # no adapter anywhere in the layers
        elif wanted is None:
            self.pipe.disable_lora()
        else:
            self.pipe.enable_lora()
            self.pipe.set_adapters([wanted[0]], adapter_weights=[wanted[1]])
        self.active = wanted

    def _make_room(self, lora: LoraRequest) -> None:
        while len(self.loaded) >= self.max_loras:
            idle = next((n for n in self.loaded if n not in self.holders), None)
            if idle is None:
                raise InvalidRequestError(
                    f"lora: {self.max_loras} adapters are in use by running requests (max_loras "
                    f"{self.max_loras}); retry {lora.name!r} when one of them finishes",
                    param="lora",
                )
            self._unload(idle)

    def _load(self, lora: LoraRequest, name: str) -> None:
        if not lora.path or not os.path.exists(lora.path):
            raise InvalidRequestError(
                f"lora: adapter {lora.name!r} has no file at {lora.path!r}", param="lora"
            )
        folder, weight_name = lora.path, None
        if os.path.isfile(lora.path):
            folder, weight_name = os.path.dirname(lora.path), os.path.basename(lora.path)
        elif os.path.exists(os.path.join(lora.path, "adapter_model.safetensors")):  # PEFT's save_pretrained
            weight_name = "adapter_model.safetensors"
        try:
            with self._without_offload_hooks():
                self.pipe.load_lora_weights(
                    folder, weight_name=weight_name, adapter_name=name, local_files_only=True
                )
        except Exception as exc:  # noqa: BLE001 - whatever diffusers cannot read is the client's file
            self._forget_partial(name)
            reason = f"{type(exc).__name__}: {exc}"[:300]
            raise InvalidRequestError(
                f"lora: adapter {lora.name!r} at {lora.path!r} could not be loaded: {reason}", param="lora"
            ) from exc
        self.loaded[name] = lora
        self.loads += 1
        self.active = _STALE  # loading activates the new adapter: set the wanted one again
        logger.info("loaded LoRA adapter %r from %s (%d cached)", lora.name, lora.path, len(self.loaded))

    @contextlib.contextmanager
    def _without_offload_hooks(self) -> Iterator[None]:
        """diffusers takes a pipeline's whole-model offload hooks off to load an adapter and puts them back
        for an accelerator only; here they come off and go back on the stage's own device."""
        if self.offload not in ("model", "sequential"):
            yield
            return
        self.pipe.remove_all_hooks()
        try:
            yield
        finally:
            offload.enable_offload(self.pipe, self.offload)

    def _unload(self, name: str) -> None:
        self.pipe.delete_adapters([name])
        del self.loaded[name]
        self.active = _STALE
        logger.info("unloaded LoRA adapter %s (cache bound %d)", name, self.max_loras)

    def _forget_partial(self, name: str) -> None:
        """A load that failed part-way may have added the adapter to some components: remove it there."""
        with contextlib.suppress(Exception):  # nothing was added
            self.pipe.delete_adapters([name])
