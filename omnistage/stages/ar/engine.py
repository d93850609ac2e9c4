"""The AR engine: continuous batching over a paged KV cache, driving a transformers decoder.

Each `step()` is one iteration of: schedule (scheduler.py) → one packed forward (model_runner.py) →
sample (sampler.py) → append tokens, detokenize, check stop conditions → emit deltas. The engine is
synchronous and single-threaded; the worker loop adds and aborts requests between steps.

engine_args: `ARArgs` (args.py). A request whose step-ready hook says its inputs have not arrived sits out
the steps that would need them; the post-sample hook may emit a frame's other codebooks and make the next
step's input embeddings (post_sample.py).

Encoder-decoder models (a loader that gives `cross_kv`) take each request's encoder output in
`ARInputs.encoder_hidden_states`; see cross_attention.py.

Classifier-free guidance (`ARInputs.guidance`): each sequence runs beside an unconditional twin, scheduled
as one with it; see guidance.py.

Hidden states out: `SamplingParams.hidden_state_layers` (transformers' `hidden_states` indices) and
`return_hidden_states` (the last layer, index -1) put one row per computed position into
`StageOutput.hidden_states[index]`; a request asking for them takes nothing from the prefix cache.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import nn

from omnistage.config.pipeline import load_ref
from omnistage.errors import ConfigError, InvalidRequestError, OmniError
from omnistage.outputs import Choice, StageOutput, error_output
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.args import ARArgs
from omnistage.stages.ar.cpu import native
from omnistage.stages.ar.cpu.packed_linear import pack_linears, packing_available
from omnistage.stages.ar.cpu.quantized_linear import attach_blocks, quantize_linears, weight_only_summary
from omnistage.stages.ar.cross_attention import encoder_states, project
from omnistage.stages.ar.detokenizer import IncrementalDetokenizer, decoder_for
from omnistage.stages.ar.guidance import guided_logits, twin_request
from omnistage.stages.ar.inputs import InputRules, make_request
from omnistage.stages.ar.kv_cache import (
    BlockManager,
    KVStorage,
    available_memory,
    bytes_per_token,
    plan_num_blocks,
)
from omnistage.stages.ar.loader import LoadedModel, check_loaded, load_causal_lm, resolve_dtype
from omnistage.stages.ar.model_runner import ForwardResult, ModelRunner, uses_mrope
from omnistage.stages.ar.post_sample import SampledStep, run_hook
from omnistage.stages.ar.sampler import Sampler
from omnistage.stages.ar.scheduler import ScheduledSeq, Scheduler
from omnistage.stages.ar.sequence import ARRequest, Sequence, SequenceInputError, cacheable_tokens
from omnistage.stages.base import EngineContext, StageRequest
from omnistage.stages.typed_inputs import extend, inputs_of

logger = logging.getLogger(__name__)


def create_engine(ctx: EngineContext) -> AREngine:
    return AREngine(ctx)


create_engine.args_type = ARArgs


class AREngine:
    def __init__(self, ctx: EngineContext):
        args, deploy = ARArgs.of(ctx.engine_args), ctx.deploy
        self.device = torch.device(ctx.device)
        # The CPU fast path (stages/ar/cpu/), one switch: packed linears, the lean decoder, native kernels.
        self.fast_path = args.cpu_fast_path and self.device.type == "cpu"
        self.model = self._load_model(ctx, args)
        config = self.model.config
        self.tokenizer = self.model.tokenizer
        self.max_model_len = int(args.max_model_len or getattr(config, "max_position_embeddings", 4096))
        self.block_size = args.block_size
        self._kv_shape = _kv_shape(config)
        self.num_blocks = plan_num_blocks(
            bytes_per_token(*self._kv_shape, self.dtype),
            self.block_size,
            deploy.kv_cache_bytes,
            args.kv_cache_memory_fraction,
            self.device,
            max_useful_blocks=deploy.max_num_seqs * -(-self.max_model_len // self.block_size) + 1,
        )
        self.blocks = BlockManager(self.num_blocks, self.block_size, args.enable_prefix_caching)
        policy = args.scheduling_policy
        self.step_ready = load_ref(args.step_ready_hook)
        self.scheduler = Scheduler(
            self.blocks,
            deploy.max_num_seqs,
            deploy.max_num_batched_tokens,
            policy,
            ready=self._input_ready if self.step_ready else None,
        )
        self.step_hook = load_ref(args.step_embed_hook)
        self.post_sample = load_ref(args.post_sample_hook)
        self.runner = ModelRunner(
            self.model,
            self._new_kv(),
            self.block_size,
            self.device,
            self.step_hook,
            feeds_embeds=self.post_sample is not None,
            fast_path=self.fast_path,
        )
        self.num_layers = self._kv_shape[0]
        self.sampler = Sampler(self.model.eos_token_ids, seed=args.seed)
        self.rules = InputRules(
            tokenizer=self.tokenizer,
            vocab_size=getattr(self.model.embed, "num_embeddings", None) or config.vocab_size,
            # inputs_embeds rows have the embedding's width (a talker projects them to its own width)
            hidden_size=getattr(self.model.embed, "embedding_dim", None) or config.hidden_size,
            position_rows=3 if uses_mrope(config) else 1,
            max_model_len=self.max_model_len,
            dtype=self.dtype,
            default_params=dict(deploy.default_params or {}),
            constraints=dict(ctx.stage.sampling_constraints or {}),
            pad_token_id=getattr(config, "pad_token_id", None) or 0,
            num_layers=self.num_layers,
            heads=tuple(self.model.heads),
            eos_token_ids=tuple(self.model.eos_token_ids),
        )
        self.requests: dict[str, ARRequest] = {}
        # Requests that want hidden states of layers below the last: request id → those layer indices.
        self._layer_requests: dict[str, tuple[int, ...]] = {}
        self._pending: list[StageOutput] = []
        self._sleep_level: int | None = None
        # Set when a step found nothing it could run (every sequence waits for streamed input): the engine
        # reports no work, so the worker blocks on its inbox instead of spinning, until something changes.
        self._stalled = False
        self.peak_running = 0

    def _load_model(self, ctx: EngineContext, args: ARArgs) -> LoadedModel:
        model_dir = ctx.model_dir
        if model_dir and ctx.stage.model_subfolder:
            model_dir = os.path.join(model_dir, ctx.stage.model_subfolder)
        self.dtype = resolve_dtype(ctx.deploy.dtype, model_dir, ctx.device)
        self.weight_only: dict[str, int] = {}
        ref = args.model_loader
        loader = load_ref(ref) if ref else load_causal_lm
        model = check_loaded(loader(model_dir, self.dtype, str(self.device)), str(ref or "default"))
        if args.quantization in ("int8", "int4") and self.device.type != "cpu":
            raise ConfigError(
                "engine_args.quantization int8/int4 runs on the CPU only (its kernels are CPU ones)"
            )
        if args.quantization != "none" and self.device.type == "cpu":
            root, heads = model.root or model.decoder, (model.head, *model.heads.values())
            attach_blocks(root, model_dir, args.quantization)
            dense = self._dense_rows(args.quantized_dense_rows, root, args.quantization)
            quantize_linears(model.decoder, args.quantization, self.dtype, heads, root, dense)
            for head in heads:  # the heads' own blocks only (a GGUF's tied embeddings)
                quantize_linears(head, "auto", self.dtype, root=root, dense_rows=dense)
            self.weight_only = weight_only_summary(root)
        if self.fast_path and packing_available():
            for module in (model.decoder, model.head, *model.heads.values(), *model.step_modules):
                pack_linears(module)
        return model

    def _dense_rows(self, rows: int, root: nn.Module, quantization: str) -> int:
        """`quantized_dense_rows`, unless the dense copies would take over half the free memory (a large
        GGUF): then none are kept, and the log says so."""
        if rows <= 0:
            return 0
        linears = [m for m in root.modules() if type(m) is nn.Linear]
        if quantization == "auto":  # only the linears the checkpoint holds blocks for are quantized
            linears = [m for m in linears if getattr(m, "weight_only", None) is not None]
        needed = sum(m.weight.numel() for m in linears) * self.dtype.itemsize
        if needed > available_memory(self.device) // 2:
            logger.warning(
                "quantized_dense_rows: dense copies of the weights would take %.1f GiB, over half the free "
                "memory; the weight-only kernels compute every input",
                needed / 2**30,
            )
            return 0
        return rows

    def _new_kv(self) -> KVStorage:
        return KVStorage(
            self._kv_shape[0], self.num_blocks, self.block_size, *self._kv_shape[1:], self.dtype, self.device
        )

    # ---- requests --------------------------------------------------------------------------------------
    def add_request(self, request: StageRequest) -> None:
        rid = request.request_id
        try:
            if rid in self.requests:
                raise InvalidRequestError(
                    f"request id {rid!r} is already running on this stage", param="request_id"
                )
            ar = make_request(request, self.rules)
            twin = self._twin(ar)
            self._check_fits(ar, 1 if twin is None else 2)
            twin_cross = self._cross_kv(ar, ar.inputs.guidance) if twin is not None else None
            cross = self._cross_kv(ar)
        except OmniError as exc:
            self._pending.append(error_output(rid, exc))
            return
        if request.streaming_input:
            ar.inputs.input_finished = False
        self.requests[rid] = ar
        self._stalled = False
        # a guided pair shares the cache with its twin: each may have half of it
        capacity = self.blocks.num_total_blocks // (1 if twin is None else 2) * self.block_size
        limit = min(self.max_model_len, capacity) - len(ar.prompt_token_ids)
        max_tokens = min(ar.params.max_tokens or limit, limit)
        hooked = self.step_hook is not None or self.post_sample is not None
        cacheable = cacheable_tokens(ar, hooked)
        if cross is not None:
            cacheable = 0  # self-attention KV depends on the encoder output: never shared by prefix
        ar.logits_processors[:0] = self.model.logits_processors
        inner = tuple(sorted({i for i in ar.hidden_layers.values() if i < self.num_layers}))
        if inner:
            self._layer_requests[rid] = inner
        for index in range(ar.params.n):
            seq = Sequence(
                request=ar,
                index=index,
                token_ids=list(ar.prompt_token_ids),
                max_tokens=max_tokens,
                detokenizer=self._detokenizer(ar),
                generator=_generator(ar.params.seed, index),
                max_cacheable_tokens=cacheable,
                cross_kv=cross[index] if cross is not None else None,
            )
            if twin is not None:
                seq.guide = Sequence(
                    request=twin,
                    index=index,
                    token_ids=list(twin.prompt_token_ids),
                    max_tokens=max_tokens,
                    detokenizer=None,
                    max_cacheable_tokens=0 if cross is not None else cacheable_tokens(twin, hooked),
                    cross_kv=twin_cross[index] if twin_cross is not None else None,
                    guided=seq,
                )
            ar.sequences.append(seq)
            self.scheduler.add(seq)

    def _cross_kv(self, ar: ARRequest, inputs: Any = None) -> list | None:
        """Encoder-decoder models: each sequence's cross-attention K/V, computed once, here, from the
        request's encoder output (or `inputs`' : the guidance twin's)."""
        if self.model.cross_kv is None:
            return None
        inputs = inputs if inputs is not None else ar.inputs
        width = self.model.encoder_hidden_size or self.rules.hidden_size
        states = encoder_states(inputs, ar.params.n, width)
        inputs.encoder_hidden_states = None  # the projections are all the decoder needs from now on
        return project(self.model.cross_kv, states, self.dtype, self.device)

    def _twin(self, ar: ARRequest) -> ARRequest | None:
        """A guided request's unconditional twin (guidance.py), or None."""
        guidance = ar.inputs.guidance
        if guidance is None:
            return None
        if ar.hidden_layers:
            raise InvalidRequestError(
                "hidden states are not returned for a guided request", param="hidden_state_layers"
            )
        rules = self.rules
        return twin_request(ar, guidance, rules.vocab_size, rules.hidden_size, self.dtype)

    def _check_fits(self, ar: ARRequest, rows: int) -> None:
        """`rows`: 2 for a guided request's sequence and its twin."""
        need = self.blocks.blocks_needed(len(ar.prompt_token_ids) + 1) * rows
        if need > self.blocks.num_total_blocks:
            raise InvalidRequestError(
                f"the prompt needs {need} KV blocks but the whole cache has {self.blocks.num_total_blocks}",
                param="prompt",
            )
        if rows > self.scheduler.max_num_seqs:
            raise InvalidRequestError(
                f"a guided request runs {rows} sequences at once; this stage's max_num_seqs is "
                f"{self.scheduler.max_num_seqs}",
                param="guidance",
            )

    def _detokenizer(self, ar: ARRequest) -> IncrementalDetokenizer | None:
        if self.tokenizer is None or not ar.params.detokenize:
            return None
        decode = decoder_for(self.tokenizer, ar.params.skip_special_tokens)
        return IncrementalDetokenizer(decode, ar.prompt_token_ids)

    def add_chunk(self, request_id: str, inputs: ARInputs | None, last: bool) -> None:
        """More inputs for a streaming request (e.g. thinker hidden rows a talker's step hook reads)."""
        ar = self.requests.get(request_id)
        if ar is not None:
            extend(ar.inputs, inputs_of(ARInputs, inputs))
            ar.inputs.input_finished = bool(last)
            self._stalled = False

    def _input_ready(self, seq: Sequence, position: int) -> bool:
        """Whether position `position` of `seq` can be computed: prompt positions always can; a generated
        token's, once the step hook's inputs for it have arrived."""
        step = position - seq.num_prompt_tokens
        return step < 0 or self.step_ready(seq.request.inputs, step)

    def abort(self, request_id: str) -> None:
        self._pending = [o for o in self._pending if o.request_id != request_id]
        ar = self.requests.pop(request_id, None)
        self._layer_requests.pop(request_id, None)
        self._stalled = False
        if ar is not None:
            for seq in ar.sequences:
                if not seq.finished:
                    self.scheduler.finish(seq)

    def has_work(self) -> bool:
        return bool(self._pending) or (
            self._sleep_level is None and not self._stalled and self.scheduler.has_work()
        )

    # ---- the loop --------------------------------------------------------------------------------------
    def step(self) -> list[StageOutput]:
        outputs, self._pending = self._pending, []
        if self._sleep_level is not None:
            return outputs
        preemptions = self.scheduler.num_preemptions
        batch = self.scheduler.schedule()
        if not batch:
            # Nothing ran and nothing was preempted (a preemption changes what the next step can admit).
            self._stalled = self.scheduler.num_preemptions == preemptions
            return outputs
        self.peak_running = max(self.peak_running, len(self.scheduler.running))
        try:
            return outputs + self._run(batch)
        except SequenceInputError as exc:
            return outputs + self._fail(exc.seq.request, exc.cause)
        except Exception as exc:  # noqa: BLE001 - a failed step fails the requests in it, not the engine
            logger.exception("AR step failed")
            for ar in dict.fromkeys(item.seq.request for item in batch if item.seq.guided is None):
                if ar.request_id in self.requests:
                    outputs += self._fail(ar, exc)
            return outputs

    def _run(self, batch: list[ScheduledSeq]) -> list[StageOutput]:
        layers = ()
        if self._layer_requests:
            layers = tuple(sorted(set().union(*self._layer_requests.values())))
        result = self.runner.execute(batch, layers)
        for item in batch:
            item.seq.num_computed_tokens += item.num_tokens
            self.blocks.commit(item.seq)
        outputs = self._sample(result.logits, result.sampling, result.sampled_hidden)
        rows = {item.seq.seq_id: (item, result.offsets[i]) for i, item in enumerate(batch)}
        for ar in dict.fromkeys(item.seq.request for item in batch if item.seq.guided is None):
            if ar.request_id in self.requests:
                outputs += self._request_outputs(ar, result, rows)
        return outputs

    def _sample(
        self, logits: torch.Tensor | None, sampling: list[ScheduledSeq], hidden: torch.Tensor | None
    ) -> list[StageOutput]:
        failed: list[StageOutput] = []
        seqs = [item.seq for item in sampling if item.seq.guided is None]
        guide_hidden = None
        if len(seqs) < len(sampling):  # guidance twins: their rows combine into their sequences'
            rows = {item.seq.seq_id: i for i, item in enumerate(sampling)}
            logits = guided_logits(logits, seqs, rows)
            guide_hidden = hidden[[rows[(s.guide or s).seq_id] for s in seqs]]
            hidden = hidden[[rows[s.seq_id] for s in seqs]]
        while seqs:
            try:
                sample = self.sampler(logits, seqs)
                break
            except SequenceInputError as exc:
                failed += self._fail(exc.seq.request, exc.cause)
                keep = [i for i, s in enumerate(seqs) if s.request is not exc.seq.request]
                seqs, logits, hidden = [seqs[i] for i in keep], logits[keep], hidden[keep]
                guide_hidden = guide_hidden[keep] if guide_hidden is not None else None
        else:
            return failed
        if self.post_sample is not None:
            return failed + self._post_sample(seqs, sample.token_ids, sample.logprobs, hidden, guide_hidden)
        for seq, token, logprob in zip(seqs, sample.token_ids, sample.logprobs, strict=True):
            self._append_token(seq, token, logprob)
        return failed

    def _post_sample(
        self,
        seqs: list[Sequence],
        tokens: list[int],
        logprobs: list[Any],
        hidden: torch.Tensor,
        guide_hidden: torch.Tensor | None = None,
    ) -> list[StageOutput]:
        """Run the family's hook on the step's sampled sequences, then append their tokens with the frames
        and next embeddings it made; a sequence the hook failed fails its request."""
        step = SampledStep(
            token_ids=torch.tensor(tokens, dtype=torch.long, device=self.device),
            hidden=hidden,
            steps=[seq.num_output_tokens for seq in seqs],
            inputs=[seq.request.inputs for seq in seqs],
            histories=[seq.token_ids[len(seq.request.prompt_token_ids) :] for seq in seqs],
            guide_hidden=guide_hidden,
        )
        embed = (self.rules.hidden_size, self.dtype, self.device)
        failed: list[StageOutput] = []
        rows = run_hook(self.post_sample, self.model, step, embed)
        for seq, token, logprob, row in zip(seqs, tokens, logprobs, rows, strict=True):
            if seq.request.request_id not in self.requests:
                continue  # another sequence of its request failed
            if isinstance(row, BaseException):
                failed += self._fail(seq.request, row)
                continue
            frame, next_embed, stop, chosen, payloads = row
            token = token if chosen is None else chosen
            if frame is not None:
                seq.pending_codes.append(frame)
            for key, value in payloads.items():
                seq.pending_tensors.setdefault(key, []).append(value)
            seq.fed_embeds.append(next_embed)
            if seq.guide is not None:
                seq.guide.fed_embeds.append(next_embed)
            self._append_token(seq, token, logprob, stop)
        return failed

    def _append_token(
        self, seq: Sequence, token: int, logprob: dict[str, Any] | None, stop: bool = False
    ) -> None:
        """`stop`: a post-sample hook ended the sequence with this token's frame (as an EOS would)."""
        seq.token_ids.append(token)
        if seq.guide is not None:
            seq.guide.token_ids.append(token)  # the twin is fed what its sequence is fed
        if logprob is not None:
            seq.pending_logprobs.append(logprob)
        new_text = seq.detokenizer.step(seq.token_ids) if seq.detokenizer else ""
        seq.output_text += new_text
        reason = self._stop_reason(seq, token, new_text, stop)
        if reason is None:
            return
        seq.finish_reason = reason
        if seq.detokenizer and not isinstance(seq.stop_reason, str):
            seq.output_text += seq.detokenizer.flush(seq.token_ids)
        self.scheduler.finish(seq)

    def _stop_reason(self, seq: Sequence, token: int, new_text: str, stop: bool = False) -> str | None:
        p = seq.params
        if seq.num_output_tokens >= p.min_tokens:
            if (stop or token in self.sampler.eos_token_ids) and not p.ignore_eos:
                return "stop"
            if token in p.stop_token_ids:
                seq.stop_reason = token
                return "stop"
            if p.stop and new_text and self._find_stop_string(seq, len(new_text)):
                return "stop"
        if seq.num_output_tokens >= seq.max_tokens:
            return "length"
        return None

    def _find_stop_string(self, seq: Sequence, new_len: int) -> bool:
        """Truncate the output at the first stop string the new text completed."""
        text = seq.output_text
        longest = max(len(s) for s in seq.params.stop)
        from_pos = max(0, len(text) - new_len - longest + 1)
        found = [(i, s) for s in seq.params.stop if (i := text.find(s, from_pos)) >= 0]
        if not found:
            return False
        index, stop = min(found)
        seq.output_text = text[: index + len(stop)] if seq.params.include_stop_str_in_output else text[:index]
        seq.stop_reason = stop
        return True

    # ---- outputs ---------------------------------------------------------------------------------------
    def _request_outputs(
        self, ar: ARRequest, result: ForwardResult, rows: dict[int, tuple[ScheduledSeq, int]]
    ) -> list[StageOutput]:
        outputs = []
        for seq in ar.sequences:
            out = self._seq_output(seq, result, rows.get(seq.seq_id))
            if out is not None:
                outputs.append(out)
        if ar.finished:
            del self.requests[ar.request_id]
            self._layer_requests.pop(ar.request_id, None)
            if not outputs:  # cannot happen for a request that finished this step, but never end silently
                outputs.append(StageOutput(request_id=ar.request_id))
            outputs[-1].finished = True
            outputs[-1].finish_reason = ar.sequences[-1].finish_reason if ar.params.n == 1 else _overall(ar)
        if outputs and not ar.first_output_sent:
            ar.first_output_sent = True
            outputs[0].prompt_token_ids = list(ar.prompt_token_ids)
            outputs[0].num_cached_tokens = ar.sequences[0].num_cached_tokens
            outputs[0].token_counts = ar.token_counts
            # Request facts the input processor computed for downstream stages (e.g. multimodal positions)
            outputs[0].data.update(ar.inputs.output_data)
        return outputs

    def _seq_output(self, seq: Sequence, result: ForwardResult, row: tuple | None) -> StageOutput | None:
        p = seq.params
        token_ids = seq.token_ids[seq.num_prompt_tokens + seq.num_tokens_sent :]
        seq.num_tokens_sent += len(token_ids)
        end = len(seq.output_text)
        if p.stop and not seq.finished:
            end -= max(len(s) for s in p.stop) - 1  # a stop string may still complete over this tail
        text = seq.output_text[seq.num_text_sent : max(end, seq.num_text_sent)]
        seq.num_text_sent += len(text)
        out = StageOutput(request_id=seq.request.request_id, token_ids=token_ids, text=text)
        if seq.pending_logprobs:
            out.logprobs, seq.pending_logprobs = seq.pending_logprobs, []
        if seq.pending_codes:
            out.codes, seq.pending_codes = torch.cat(seq.pending_codes), []
        if seq.pending_tensors:
            out.tensors = {key: torch.cat(rows) for key, rows in seq.pending_tensors.items()}
            seq.pending_tensors = {}
        if seq.request.hidden_layers and row is not None:
            self._hidden_out(out, seq, result, *row)
        just_finished = seq.finished and not seq.finish_sent
        if not (
            token_ids or text or out.hidden_states or out.codes is not None or out.tensors or just_finished
        ):
            return None
        if p.n > 1:
            out.choice = Choice(seq.index, just_finished, seq.finish_reason if just_finished else None)
        if just_finished:
            seq.finish_sent = True
            out.stop_reason = seq.stop_reason
        return out

    def _hidden_out(
        self, out: StageOutput, seq: Sequence, result: ForwardResult, item: ScheduledSeq, offset: int
    ) -> None:
        """The rows of each asked layer for the positions computed this step that were not sent before
        (a recomputed prefix after preemption was)."""
        first = max(item.start, seq.num_hidden_rows_sent)
        last = item.start + item.num_tokens
        if last <= first:
            return
        span = slice(offset + first - item.start, offset + last - item.start)
        for key, layer in seq.request.hidden_layers.items():
            rows = result.hidden if layer == self.num_layers else result.layers[layer]
            out.hidden_states[key] = rows[span].clone()
        seq.num_hidden_rows_sent = last

    def _fail(self, ar: ARRequest, exc: BaseException) -> list[StageOutput]:
        logger.warning("request %s failed: %s", ar.request_id, exc)
        self.abort(ar.request_id)
        return [error_output(ar.request_id, exc)]

    # ---- sleep -----------------------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Level 0 pauses scheduling; level 1 also frees the KV cache and moves the weights to CPU.
        Requests keep arriving while asleep; running ones are preempted and recompute after wake_up."""
        if level not in (0, 1):
            raise ValueError(f"sleep level must be 0 or 1, got {level}")
        self._sleep_level = max(level, self._sleep_level or 0)
        if level == 1 and self.runner.kv is not None:
            self.scheduler.preempt_all()
            self.blocks.reset_prefix_cache()
            self.runner.offload()

    def wake_up(self) -> None:
        """Restore weights and cache; admission resumes by itself (has_work() is true again)."""
        if self.runner.kv is None:
            self.runner.restore(self._new_kv())
        self._sleep_level = None
        self._stalled = False

    def input_resources(self) -> LoadedModel:
        """The loaded model (tokenizer, config, and whatever the family's loader added) for processors."""
        return self.model

    def stats(self) -> dict[str, Any]:
        return {
            "num_requests": len(self.requests),
            "num_waiting": len(self.scheduler.waiting),
            "num_running": len(self.scheduler.running),
            "peak_running": self.peak_running,
            "num_preemptions": self.scheduler.num_preemptions,
            "sleep_level": self._sleep_level,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "native_kernels": self.fast_path and native.kernels() is not None,
            "decoder_path": self.runner.path,
            "weight_only_linears": self.weight_only,
            **self.blocks.stats(),
        }

    def shutdown(self) -> None:
        """The worker is leaving: end every request (their blocks go back) and drop the KV cache, the
        engine's one large allocation besides the weights."""
        for rid in list(self.requests):
            self.abort(rid)
        self._pending.clear()
        self.runner.kv = None


def _kv_shape(config: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a transformers text config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv_heads, head_dim


def _generator(seed: int | None, index: int) -> torch.Generator | None:
    if seed is None:
        return None
    return torch.Generator().manual_seed(seed + index)


def _overall(ar: ARRequest) -> str:
    reasons = {s.finish_reason for s in ar.sequences}
    return "length" if reasons == {"length"} else "stop"
