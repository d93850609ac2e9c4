"""The AR engine's `engine_args` (checked at start against this struct, stages/engine_args.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from omnistage.stages.engine_args import EngineArgs


class ARArgs(EngineArgs):
    block_size: int = 16
    enable_prefix_caching: bool = True
    # Of free memory, for the KV cache, where the deployment sets no kv_cache_bytes.
    kv_cache_memory_fraction: float = 0.1
    max_model_len: int | None = None  # None: the config's max_position_embeddings
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    seed: int | None = None  # None: unseeded sampling
    # The CPU fast path (stages/ar/cpu/): prepacked oneDNN linears, the lean decoder and the native
    # kernels where they are built. False: the model's own forward on plain torch ops.
    cpu_fast_path: bool = True
    # Weight-only quantized linears on the CPU (stages/ar/cpu/quantized_linear.py), in llama.cpp's block
    # forms (groups of 32): "auto" keeps the blocks a checkpoint holds (a GGUF's Q4_1 / Q4_0 / Q8_0, head
    # included) and leaves float weights as they are; "int8" / "int4" also quantize the decoder's float
    # linears (the head and the embeddings keep their dtype); "none" computes with float weights only.
    quantization: Literal["auto", "none", "int8", "int4"] = "auto"
    # Quantized linears also keep a dense copy of their weights in the compute dtype (oneDNN's packed form)
    # and compute inputs of at least this many rows with it: prefills and large batches are bound by
    # arithmetic, which the weight-only kernels do slower than a dense GEMM; 0: no copy (the weights'
    # dense bytes saved).
    quantized_dense_rows: int = 0
    # Functions, "module:function" (or the callable itself from Python):
    model_loader: Any = None  # (model_dir, dtype, device) -> LoadedModel (loader.py)
    step_embed_hook: Any = None  # (request ARInputs, step, embedding) -> the step's input embedding
    # (request ARInputs, step) -> bool: whether the inputs the step hook needs for generated token `step` have
    # arrived (a request added with `streaming_input` gets more through `add_chunk`)
    step_ready_hook: Any = None
    post_sample_hook: Any = None  # batched, after each step's sampling (post_sample.py)

    refs: ClassVar[tuple[str, ...]] = (
        "model_loader",
        "step_embed_hook",
        "step_ready_hook",
        "post_sample_hook",
    )
