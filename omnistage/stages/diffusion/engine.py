"""The diffusion stage engine: serves any diffusers pipeline directory.

Two execution modes (`engine_args.execution`):
  - "step" (default for the families that register a step adapter): the engine drives encode → one denoise
    step → decode itself; each `step()` admits waiting requests, advances one group of compatible requests by
    one step in one transformer forward, reports progress, and decodes the requests that finished.
  - "request" (any other pipeline, or by choice): compatible requests run as one plain pipeline call.

Other `engine_args`: request_batch_max_wait_ms, step_policy (srpt | fcfs), aging_s, step_token_budget (latent
tokens per shared forward; 0 = unlimited; default: 1 on CPU, i.e. one request per forward, unlimited on an
accelerator — see `default_token_budget`), cache ({backend, ...} for
every request), cfg_parallel_size, ulysses_degree, attention_backend, quantization, vae_tiling, vae_slicing,
offload, offload_group_size, limits ({max_pixels, max_num_frames, max_inference_steps, max_outputs}),
parallel_timeout_s (how long a parallel rank waits on the others; default 600), skip_components (pipeline
components this stage never calls, not loaded: an AR→DiT family's AR model, which its own stage runs).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import msgspec
import torch

from omnistage import media
from omnistage.config.deploy import StageDeploy
from omnistage.errors import ConfigError, InvalidRequestError
from omnistage.outputs import Progress, StageOutput, error_output
from omnistage.params import DiffusionParams, layer_params
from omnistage.prompts import ChatPrompt, SpeechPrompt, TextPrompt, as_prompt, prompt_text
from omnistage.stages.base import EngineContext, StageRequest
from omnistage.stages.diffusion import lora
from omnistage.stages.diffusion.request import DiffusionRequest, VideoWithAudio
from omnistage.stages.diffusion.runner import DiffusionRunner
from omnistage.stages.diffusion.scheduler import RequestBatchScheduler, StepScheduler

logger = logging.getLogger(__name__)

ENGINE_ARGS = {
    "execution",
    "request_batch_max_wait_ms",
    "step_policy",
    "aging_s",
    "cache",
    "cfg_parallel_size",
    "ulysses_degree",
    "attention_backend",
    "quantization",
    "vae_tiling",
    "vae_slicing",
    "offload",
    "offload_group_size",
    "limits",
    "num_threads",
    "parallel_timeout_s",
    "step_token_budget",
    "skip_components",
    "max_loras",
}


def default_token_budget(device: str) -> int | None:
    """On a CPU a forward over k requests costs about k forwards over one (measured: batching gains 5-7%
    there), so sharing a forward only makes every member finish as late as the last; running the most urgent
    request alone lets short requests finish first (9-frame p50 behind an 81-frame video, vs FCFS: 5.6x
    against 2.6x for shared forwards on the loaded machine, 4.85x against 4.93x on the quiet one, see
    benchmarks/RESULTS.md). An accelerator has spare width, so there requests share forwards freely."""
    return 1 if torch.device(device).type == "cpu" else None


class DiffusionEngine:
    """`modality` is what the stage serves (its `output_modality`): a pipeline without a step adapter is known
    to the engine only by that."""

    def __init__(
        self,
        model_dir: str,
        deploy: StageDeploy,
        device: str = "cpu",
        engine_args: dict | None = None,
        modality: str | None = None,
    ):
        args = dict(engine_args if engine_args is not None else deploy.engine_args)
        unknown = sorted(set(args) - ENGINE_ARGS)
        if unknown:
            raise ConfigError(
                f"unknown diffusion engine_args key {unknown[0]!r}; known: {', '.join(sorted(ENGINE_ARGS))}"
            )
        if deploy.num_threads:
            torch.set_num_threads(deploy.num_threads)
        self.deploy = deploy
        self.default_params = dict(deploy.default_params)
        self.runner = DiffusionRunner(model_dir, deploy.dtype, device, args, modality)
        self.adapter = self.runner.adapter
        self.mode = args.get("execution") or ("step" if self.runner.supports_steps else "request")
        self._check_mode(args)
        self.runner.start_executor(args)
        if self.mode == "step":
            budget = args.get("step_token_budget", default_token_budget(device))
            self.scheduler = StepScheduler(
                self._with_lora(self.adapter.step_batch_key),
                self.adapter.latent_tokens,
                deploy.max_num_seqs,
                policy=args.get("step_policy", "srpt"),
                aging_s=float(args.get("aging_s", 30.0)),
                tokens=self.adapter.latent_tokens,
                token_budget=int(budget) if budget else None,
            )
        else:
            self.scheduler = RequestBatchScheduler(
                self._with_lora(self.adapter.request_batch_key),
                deploy.max_num_seqs,
                float(args.get("request_batch_max_wait_ms", 0)),
            )
        self.requests: dict[str, DiffusionRequest] = {}
        self._pending: list[StageOutput] = []
        self._asleep = False
        self._finished = 0
        logger.info("diffusion engine: %s in %s mode", self.adapter.class_name, self.mode)

    @staticmethod
    def _with_lora(batch_key: Any) -> Any:
        """Requests with different LoRA adapters (or scales, or none) never share a forward."""
        return lambda req: (lora.key(req.params.lora), batch_key(req))

    def _check_mode(self, args: dict[str, Any]) -> None:
        if self.mode not in ("step", "request"):
            raise ConfigError(f"engine_args.execution must be 'step' or 'request', got {self.mode!r}")
        if self.mode == "step" and not self.runner.supports_steps:
            raise ConfigError(f"{self.adapter.class_name} has no step adapter; use execution: request")
        parallel = int(args.get("cfg_parallel_size", 1)) > 1 or int(args.get("ulysses_degree", 1)) > 1
        if parallel and self.mode != "step":
            raise ConfigError("cfg_parallel_size / ulysses_degree need execution: step")
        refused = getattr(self.adapter, "parallel_refused", None)
        if parallel and refused:
            raise ConfigError(f"cfg_parallel_size / ulysses_degree: {self.adapter.class_name} {refused}")

    # ---- StageEngine
    def add_request(self, request: StageRequest) -> None:
        rid = request.request_id
        if rid in self.requests:
            raise ValueError(f"request_id {rid!r} is already active")
        try:
            req = self._parse(request)
        except Exception as exc:  # bad input ends the request, never the engine
            self._pending.append(error_output(rid, exc))
            return
        self.requests[rid] = req
        self.scheduler.add(req)

    def add_chunk(self, request_id: str, inputs: Any, last: bool) -> None:
        raise NotImplementedError("diffusion stages take whole inputs (no streaming input)")

    def abort(self, request_id: str) -> None:
        self.scheduler.remove(request_id)
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.runner.loras.release(req.params.lora)
        self._pending = [o for o in self._pending if o.request_id != request_id]

    def step(self) -> list[StageOutput]:
        outputs, self._pending = self._pending, []
        if self._asleep:
            return outputs
        outputs += self._step_mode() if self.mode == "step" else self._request_mode()
        return outputs

    def has_work(self) -> bool:
        return bool(self._pending) or (len(self.scheduler) > 0 and not self._asleep)

    def sleep(self, level: int = 1) -> None:
        """Stop scheduling (requests stay queued). On a CPU there is no device memory to release."""
        self._asleep = True

    def wake_up(self) -> None:
        self._asleep = False

    def stats(self) -> dict[str, Any]:
        running = len(getattr(self.scheduler, "running", []))
        return {
            "num_requests": len(self.requests),
            "num_running": running,
            "num_waiting": len(self.scheduler) - running,
            "num_finished": self._finished,
            "mode": self.mode,
            "pipeline": self.adapter.class_name,
        }

    def shutdown(self) -> None:
        self.runner.shutdown()

    # ---- input
    def _parse(self, request: StageRequest) -> DiffusionRequest:
        prompt, negative, images = request.prompt, None, []
        if isinstance(prompt, dict):  # vLLM's prompt dicts, as a direct engine user may give them
            prompt = as_prompt(prompt)
        if isinstance(prompt, TextPrompt):
            prompt, negative, images = prompt.text or "", prompt.negative_prompt, list(prompt.images)
        elif isinstance(prompt, ChatPrompt):
            prompt, images = prompt_text(prompt), list(prompt.images)
        elif isinstance(prompt, SpeechPrompt):
            prompt = prompt_text(prompt)
        if not isinstance(prompt, str):
            raise InvalidRequestError("a diffusion stage takes a text or image prompt", param="prompt")
        params = request.params
        if params is not None and not isinstance(params, dict | DiffusionParams):
            raise InvalidRequestError(
                f"params must be DiffusionParams, got {type(params).__name__}", param="params"
            )
        if not isinstance(params, DiffusionParams):  # typed params arrive layered (api.StageParamsResolver)
            params = self._with_stage_defaults(msgspec.convert(params or {}, DiffusionParams))
        if params.negative_prompt is None and negative is not None:
            params = msgspec.structs.replace(params, negative_prompt=negative)
        images = [media.decode_image(i) for i in (params.image or images)]
        params = self.runner.resolve(params, images)
        for name in ("flow_shift", "boundary_ratio"):
            if getattr(params, name) is not None and self.mode != "step":
                raise InvalidRequestError(
                    f"{name}: read step by step; this stage runs whole pipeline calls (execution: request)",
                    param=name,
                )
        self.runner.loras.acquire(params.lora)  # loaded (or refused) now, held until the request ends
        return DiffusionRequest(
            request.request_id, prompt, params, images, request.priority, request.arrival_time, request.inputs
        )

    def _with_stage_defaults(self, params: DiffusionParams) -> DiffusionParams:
        """The deploy's default_params under the fields of a request that came untyped (`layer_params`: the
        one rule, applied once: requests through the runtime arrive layered)."""
        return layer_params(DiffusionParams, self.default_params, params) if self.default_params else params

    # ---- request mode
    def _request_mode(self) -> list[StageOutput]:
        wave = self.scheduler.next_wave()
        if not wave.requests:
            if wave.wait_s > 0:
                time.sleep(min(wave.wait_s, 0.005))  # coalescing window: yield instead of spinning
            return []
        start = time.perf_counter()
        for req in wave.requests:
            req.started_at = time.monotonic()
        try:
            results = self.runner.run_wave(wave.requests)
        except Exception as exc:
            logger.exception("pipeline call failed for %d request(s)", len(wave.requests))
            return [self._fail(req, exc) for req in wave.requests]
        elapsed = time.perf_counter() - start
        outputs = []
        for req, result in zip(wave.requests, results, strict=True):
            req.timings["generate_s"] = elapsed
            outputs.append(self._final(req, result))
        return outputs

    # ---- step mode
    def _step_mode(self) -> list[StageOutput]:
        outputs = []
        for req in self.scheduler.admit():
            try:
                start = time.perf_counter()
                req.started_at = time.monotonic()
                self.runner.prepare(req)
                req.timings["encode_s"] = time.perf_counter() - start
            except Exception as exc:
                logger.exception("preparing %s failed", req.request_id)
                outputs.append(self._fail(req, exc))
        group = self.scheduler.next_group()
        if not group:
            return outputs
        start = time.perf_counter()
        try:
            self.runner.denoise(group)
        except Exception as exc:
            logger.exception("denoise step failed for %d request(s)", len(group))
            return outputs + [self._fail(req, exc) for req in group]
        elapsed = time.perf_counter() - start
        for req in group:
            req.timings["denoise_s"] = req.timings.get("denoise_s", 0.0) + elapsed
            if req.state.done:
                outputs.append(self._decode(req))
            else:
                progress = Progress(req.state.step_index, req.state.total_steps)
                outputs.append(StageOutput(req.request_id, progress=progress))
        return outputs

    def _decode(self, req: DiffusionRequest) -> StageOutput:
        start = time.perf_counter()
        try:
            result = self.runner.decode(req)
        except Exception as exc:
            logger.exception("decoding %s failed", req.request_id)
            return self._fail(req, exc)
        req.timings["decode_s"] = time.perf_counter() - start
        return self._final(req, result)

    # ---- output
    def _forget(self, req: DiffusionRequest) -> None:
        self.scheduler.remove(req.request_id)
        if self.requests.pop(req.request_id, None) is not None:
            self.runner.loras.release(req.params.lora)
        self._finished += 1

    def _fail(self, req: DiffusionRequest, exc: Exception) -> StageOutput:
        self._forget(req)
        return error_output(req.request_id, exc)

    def _final(self, req: DiffusionRequest, result: torch.Tensor | VideoWithAudio) -> StageOutput:
        """The request's one terminal output: media tensors per the output conventions, plus metrics."""
        self._forget(req)
        p = req.params
        soundtrack = result if isinstance(result, VideoWithAudio) else None
        if soundtrack is not None:
            result = soundtrack.frames
        as_float = p.output_format == "tensor"
        convert = (lambda x: x.float().contiguous()) if as_float else media.to_uint8
        out = StageOutput(
            req.request_id,
            metrics=self._metrics(req),
            data={"seed": p.seed, "output_format": p.output_format},
            finished=True,
            finish_reason="stop",
            progress=Progress(req.num_steps, req.num_steps),  # every step done
        )
        if self.adapter.modality == "audio":
            _put_audio(out, result, self.adapter.sample_rate())
        elif result.dim() == 5 and (p.num_frames != 1 or p.output_format == "mp4"):
            out.video, out.fps = convert(result), p.fps
        else:
            out.images = convert(result[:, 0] if result.dim() == 5 else result)
        if soundtrack is not None:  # the video's own sound track, as an audio model's output carries it
            _put_audio(out, soundtrack.audio, soundtrack.sample_rate)
        return out

    def _metrics(self, req: DiffusionRequest) -> dict[str, Any]:
        n = req.num_steps
        metrics: dict[str, Any] = {"num_steps": n, "computed_steps": n, "cached_steps": 0}
        cache = req.state.cache.metrics() if req.state is not None and req.state.cache is not None else None
        metrics.update(cache or req.timings.get("cache") or {})
        now = time.monotonic()
        if req.started_at is not None:
            metrics["queue_s"] = round(req.started_at - req.arrival_time, 6)
        metrics["e2e_s"] = round(now - req.arrival_time, 6)
        for key in ("encode_s", "denoise_s", "decode_s", "generate_s"):
            if key in req.timings:
                metrics[key] = round(req.timings[key], 6)
        return metrics


def _put_audio(out: StageOutput, audio: torch.Tensor, sample_rate: int | None) -> None:
    """Float samples, `[k, N]` or `[k, C, N]`: the first output's mono mix in `audio` (what audio routes play)
    and, where there is more than one output or channel, all of them in `tensors["audios"]`."""
    audio = audio.float()
    out.audio = (audio[0].mean(0) if audio.dim() == 3 else audio[0]).contiguous()
    if audio.shape[0] > 1 or audio.dim() == 3:
        out.tensors["audios"] = audio.contiguous()  # every output, every channel
    out.sample_rate = sample_rate


def create_engine(ctx: EngineContext) -> DiffusionEngine:
    """Factory named by `DEFAULT_ENGINES[StageKind.DIFFUSION]`."""
    if not ctx.model_dir:
        raise ConfigError(
            f"stage {ctx.stage.stage_id} ({ctx.stage.name}): a diffusion stage needs a model directory"
        )
    model_dir = Path(ctx.model_dir)
    if ctx.stage.model_subfolder:
        model_dir = model_dir / ctx.stage.model_subfolder
    if not (model_dir / "model_index.json").exists():
        raise ConfigError(f"{model_dir} has no model_index.json: not a diffusers pipeline directory")
    args = {**ctx.stage.engine_args, **ctx.engine_args}
    return DiffusionEngine(str(model_dir), ctx.deploy, ctx.device, args, ctx.stage.output_modality)
