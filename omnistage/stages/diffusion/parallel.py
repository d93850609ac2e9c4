"""Where a transformer forward runs: in this process, or across N processes over `torch.distributed`.

`LocalExecutor` runs the forward here. `DistributedExecutor` makes the engine's process rank 0 of a gloo (CPU)
or nccl (GPU) group and spawns ranks 1..N-1, each holding its own copy of the transformer(s):
  - CFG-parallel (`cfg_parallel_size: 2`): rank 0 runs the conditional rows, rank 1 the unconditional rows,
    and the outputs are all-gathered, so one CFG step costs one forward of wall time instead of two.
  - Ulysses context parallelism (`ulysses_degree: N`): every rank runs the whole batch with diffusers' context
    parallel hooks (the model's `_cp_plan`): the sequence is split across ranks and attention exchanges heads
    with all-to-all. (diffusers' `enable_parallelism` picks the device as `rank % accelerator count`, which
    divides by zero on a CPU-only machine, so the same configuration is applied here with a CPU mesh.)

Rank 0 broadcasts each forward's inputs: a msgspec header (names, dtypes, shapes, small values) followed by
the raw tensors; nothing is pickled.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from omnistage.errors import ConfigError
from omnistage.stages.diffusion import text_padding
from omnistage.stages.diffusion.offload import set_module_attention_backend

logger = logging.getLogger(__name__)

TRANSFORMER_COMPONENTS = ("transformer", "transformer_2")


def run_model(module: torch.nn.Module, kwargs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return module(**kwargs, return_dict=False)[0]


def _rows(inputs: list[dict[str, Any]], key: str) -> list[int]:
    """The batch rows of each branch input: those of its latents (the step adapter's `latent_input`)."""
    return [i[key].shape[0] for i in inputs]


class LocalExecutor:
    world_size = 1

    def __init__(self, pipe: Any):
        self.pipe = pipe

    def forward_local(
        self, model_name: str, inputs: list[dict[str, Any]], adapter: Any
    ) -> list[torch.Tensor]:
        """One forward per group of `inputs` that can share one (the step adapter's `forward_groups`; all of
        them for most families), concatenated by the step adapter and split back per input."""
        module, outs = getattr(self.pipe, model_name), [None] * len(inputs)
        for group in adapter.forward_groups(inputs):
            members = [inputs[i] for i in group]
            out = adapter.run_model(module, adapter.collate(members))
            for i, part in zip(group, out.split(_rows(members, adapter.latent_input)), strict=True):
                outs[i] = part
        return outs

    def forward(
        self, model_name: str, cond: list[dict[str, Any]], uncond: list[dict[str, Any]], adapter: Any
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Conditional and unconditional branch inputs of many requests → their noise predictions."""
        parts = self.forward_local(model_name, cond + uncond, adapter)
        return parts[: len(cond)], parts[len(cond) :]

    def shutdown(self) -> None:
        pass


# ---- wire format between ranks
class _TensorSpec(msgspec.Struct):
    dtype: str
    shape: list[int]


class _Command(msgspec.Struct):
    op: str  # forward | stop
    model: str = ""
    rows_key: str = "hidden_states"  # the branch input whose rows are the batch (the latents)
    # One kwargs description per branch: {name: _TensorSpec | plain value}; tensors follow in order.
    branches: list[dict[str, Any]] = msgspec.field(default_factory=list)
    tensor_specs: list[_TensorSpec] = msgspec.field(default_factory=list)


def _broadcast_bytes(payload: bytes | None) -> bytes:
    size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=0)
    buf = (
        torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        if payload
        else torch.empty(int(size), dtype=torch.uint8)
    )
    dist.broadcast(buf, src=0)
    return buf.numpy().tobytes()


def _encode_branches(branches: list[dict[str, Any]]) -> tuple[_Command, list[torch.Tensor]]:
    tensors, described = [], []
    for kwargs in branches:
        desc = {}
        for key, value in kwargs.items():
            if isinstance(value, torch.Tensor):
                desc[key] = {"tensor": len(tensors)}
                tensors.append(value.contiguous())
            else:
                desc[key] = {"value": value}
        described.append(desc)
    specs = [_TensorSpec(str(t.dtype).removeprefix("torch."), list(t.shape)) for t in tensors]
    return _Command("forward", branches=described, tensor_specs=specs), tensors


def _decode_branches(cmd: _Command, tensors: list[torch.Tensor]) -> list[dict[str, Any]]:
    out = []
    for desc in cmd.branches:
        out.append({k: tensors[v["tensor"]] if "tensor" in v else v["value"] for k, v in desc.items()})
    return out


def _send(cmd: _Command, tensors: list[torch.Tensor]) -> None:
    _broadcast_bytes(msgspec.msgpack.encode(cmd))
    for t in tensors:
        dist.broadcast(t, src=0)


def _receive() -> tuple[_Command, list[torch.Tensor]]:
    cmd = msgspec.msgpack.decode(_broadcast_bytes(None), type=_Command)
    tensors = []
    for spec in cmd.tensor_specs:
        t = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
        dist.broadcast(t, src=0)
        tensors.append(t)
    return cmd, tensors


# ---- the parallel strategies, identical on every rank
def enable_ulysses(module: torch.nn.Module, degree: int, device: torch.device, backend: str | None) -> None:
    """diffusers context parallelism (Ulysses) on a CPU or GPU mesh.

    Every rank pins the same attention backend on its processors (the stage's, else "native"): a processor
    without one follows diffusers' process-wide default, which other code in rank 0's process may have
    changed, and ranks whose attention takes different collectives deadlock.
    """
    from diffusers.hooks.context_parallel import apply_context_parallel
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry
    from torch.distributed.device_mesh import init_device_mesh

    plan = getattr(module, "_cp_plan", None)
    if plan is None:
        raise ConfigError(
            f"ulysses_degree > 1: {type(module).__name__} has no context-parallel plan (_cp_plan)"
        )
    backend = backend or AttentionBackendName.NATIVE.value
    if not _AttentionBackendRegistry._is_context_parallel_available(AttentionBackendName(backend)):
        raise ConfigError(
            f"ulysses_degree > 1: attention backend {backend!r} does not support context parallelism"
        )
    set_module_attention_backend(module, backend)
    cp = ContextParallelConfig(ulysses_degree=degree)
    config = ParallelConfig(context_parallel_config=cp)
    mesh = init_device_mesh(device.type, cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=mesh)
    module._parallel_config = config
    for sub in module.modules():
        processor = getattr(sub, "processor", None)
        if processor is not None and hasattr(processor, "_parallel_config"):
            processor._parallel_config = config
    apply_context_parallel(module, cp, plan)


def _parallel_step(
    modules: dict[str, torch.nn.Module], mode: str, cmd: _Command, tensors: list
) -> torch.Tensor:
    """This rank's share of one forward: its CFG branch, or the whole batch under Ulysses."""
    branches = _decode_branches(cmd, tensors)
    module = modules[cmd.model]
    if mode == "ulysses":
        return run_model(module, branches[0])
    rank = dist.get_rank()
    mine = branches[rank] if rank < len(branches) else None
    rows = [b[cmd.rows_key].shape[0] if b else 0 for b in branches]
    out = run_model(module, mine) if mine else None
    return _gather_rows(out, rows, module.dtype)


MAX_DIMS = 8


def _gather_rows(out: torch.Tensor | None, rows: list[int], dtype: torch.dtype) -> torch.Tensor:
    """All-gather every rank's output rows (padded to the largest share) and join them in rank order."""
    world = dist.get_world_size()
    meta = torch.full((MAX_DIMS + 1,), -1, dtype=torch.int64)
    if out is not None:
        meta[0] = out.dim() - 1
        meta[1 : out.dim()] = torch.tensor(out.shape[1:])
    metas = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(metas, meta)
    ref = next(m for m in metas if m[0] >= 0)
    tail = tuple(ref[1 : 1 + int(ref[0])].tolist())
    padded = torch.zeros((max(rows), *tail), dtype=dtype)
    if out is not None:
        padded[: out.shape[0]] = out
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return torch.cat([g[:n] for g, n in zip(gathered, rows, strict=False)])


def _worker_main(
    rank: int,
    world: int,
    port: int,
    model_dir: str,
    dtype: str,
    mode: str,
    args: dict,
    padding_processors: dict[str, str] | None = None,
) -> None:
    """Ranks 1..N-1 (`python -m omnistage.stages.diffusion.parallel '<json>'`): load the transformer(s),
    join the group, execute forwards until told to stop (or until rank 0's process is gone).
    `padding_processors`: rank 0's registrations (text_padding.py), so every rank attends alike."""
    from omnistage.processes import watch_parent

    watch_parent()
    for plain, padded in (padding_processors or {}).items():
        text_padding.register_padding_processor(plain, padded)
    if args.get("num_threads"):
        torch.set_num_threads(int(args["num_threads"]))
    modules = load_transformers(model_dir, dtype)
    _init_group(rank, world, port, float(args.get("parallel_timeout_s", 600)))
    for module in modules.values():
        _prepare_module(module, mode, world, args)
    while True:
        cmd, tensors = _receive()
        if cmd.op == "stop":
            break
        _parallel_step(modules, mode, cmd, tensors)
    dist.destroy_process_group()


def load_transformers(model_dir: str, dtype: str) -> dict[str, torch.nn.Module]:
    """Only the denoiser(s) of a pipeline directory: what a parallel rank needs."""
    import diffusers

    from omnistage.stages.diffusion.runner import DTYPES

    index = json.loads((Path(model_dir) / "model_index.json").read_text())
    modules = {}
    for name in TRANSFORMER_COMPONENTS:
        entry = index.get(name)
        if entry and entry[1]:
            cls = getattr(diffusers, entry[1])
            modules[name] = cls.from_pretrained(
                model_dir, subfolder=name, dtype=DTYPES.get(dtype, torch.float32)
            )
            modules[name].eval()
            text_padding.install(modules[name])  # as rank 0's pipeline (runner.load_pipeline)
    return modules


def _prepare_module(module: torch.nn.Module, mode: str, world: int, args: dict) -> None:
    if args.get("attention_backend"):
        set_module_attention_backend(module, args["attention_backend"])
    if mode == "ulysses":
        enable_ulysses(module, world, torch.device("cpu"), args.get("attention_backend"))


def _init_group(rank: int, world: int, port: int, timeout_s: float) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DistributedExecutor(LocalExecutor):
    """Rank 0 of a CFG-parallel or Ulysses group; the engine calls it like the local executor."""

    def __init__(self, pipe: Any, model_dir: str, dtype: str, mode: str, world: int, args: dict[str, Any]):
        super().__init__(pipe)
        if dist.is_initialized():
            raise ConfigError(
                "a torch.distributed group already exists in this process; one parallel stage per process"
            )
        self.mode, self.world_size = mode, world
        port = _free_port()
        self.workers = []
        for rank in range(1, world):
            spec = {"rank": rank, "world": world, "port": port, "model_dir": model_dir, "dtype": dtype}
            spec.update(mode=mode, args=args, padding_processors=text_padding.padding_processors())
            cmd = [sys.executable, "-m", "omnistage.stages.diffusion.parallel", json.dumps(spec)]
            # stdin: a pipe the rank watches, so it leaves with this process even if it is killed
            self.workers.append(subprocess.Popen(cmd, stdin=subprocess.PIPE))
        try:
            _init_group(0, world, port, float(args.get("parallel_timeout_s", 600)))
        except Exception:
            self._kill_workers()
            raise
        self.modules = {
            n: getattr(pipe, n) for n in TRANSFORMER_COMPONENTS if getattr(pipe, n, None) is not None
        }
        if mode == "ulysses":
            for module in self.modules.values():
                enable_ulysses(module, world, torch.device("cpu"), args.get("attention_backend"))
        logger.info("%s parallel group of %d ranks ready (port %d)", mode, world, port)

    def forward(self, model_name, cond, uncond, adapter):
        collate, key = adapter.collate, adapter.latent_input
        if self.mode == "ulysses":
            branches = [collate(cond + uncond)]
        else:
            branches = [collate(cond) if cond else {}, collate(uncond) if uncond else {}]
        cmd, tensors = _encode_branches(branches)
        cmd.model, cmd.rows_key = model_name, key
        _send(cmd, tensors)
        out = _parallel_step(self.modules, self.mode, cmd, tensors)
        if self.mode == "ulysses":
            parts = list(out.split(_rows(cond + uncond, key)))
            return parts[: len(cond)], parts[len(cond) :]
        n_cond = sum(_rows(cond, key))
        cond_out = list(out[:n_cond].split(_rows(cond, key)))
        uncond_out = list(out[n_cond:].split(_rows(uncond, key))) if uncond else []
        return cond_out, uncond_out

    def forward_local(self, model_name, inputs, adapter):
        raise ConfigError("step caching cannot be combined with CFG-parallel or Ulysses in this engine")

    def shutdown(self) -> None:
        """Stop the ranks explicitly: tell them, wait for them to leave the group, then leave it too."""
        if not dist.is_initialized():
            return
        grace_s = 30.0
        try:
            _send(_Command("stop"), [])
        except Exception:  # a rank is gone: the broadcast cannot complete, so nobody hears it
            logger.warning("%s group broken at shutdown; killing its ranks", self.mode, exc_info=True)
            grace_s = 0.0
        self._kill_workers(grace_s)
        dist.destroy_process_group()

    def _kill_workers(self, grace_s: float = 0) -> None:
        for proc in self.workers:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdin:
                proc.stdin.close()


def _check_ulysses(pipe: Any, degree: int) -> None:
    """Refuse before spawning anything: the model needs a context-parallel plan and heads divisible by N."""
    for name in TRANSFORMER_COMPONENTS:
        module = getattr(pipe, name, None)
        if module is None:
            continue
        if getattr(module, "_cp_plan", None) is None:
            model = type(module).__name__
            raise ConfigError(f"ulysses: diffusers has no _cp_plan (context-parallel plan) for {model}")
        heads = getattr(module.config, "num_attention_heads", None)
        if heads is not None and heads % degree:
            raise ConfigError(f"ulysses_degree={degree} must divide the {heads} attention heads")


def make_executor(pipe: Any, model_dir: str, dtype: str, engine_args: dict[str, Any]) -> LocalExecutor:
    cfg = int(engine_args.get("cfg_parallel_size", 1))
    ulysses = int(engine_args.get("ulysses_degree", 1))
    if cfg not in (1, 2):
        raise ConfigError(f"engine_args.cfg_parallel_size must be 1 or 2, got {cfg}")
    if ulysses < 1:
        raise ConfigError(f"engine_args.ulysses_degree must be >= 1, got {ulysses}")
    if cfg > 1 and ulysses > 1:
        raise ConfigError(
            "engine_args: combine cfg_parallel_size and ulysses_degree > 1 is not supported; pick one"
        )
    if cfg == 1 and ulysses == 1:
        return LocalExecutor(pipe)
    mode, world = ("cfg", 2) if cfg > 1 else ("ulysses", ulysses)
    if mode == "ulysses":
        _check_ulysses(pipe, ulysses)
    keys = ("attention_backend", "num_threads", "parallel_timeout_s")
    args = {k: engine_args[k] for k in keys if engine_args.get(k)}
    args.setdefault("num_threads", max(1, (os.cpu_count() or 2) // world))
    return DistributedExecutor(pipe, model_dir, dtype, mode, world, args)


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    _worker_main(**spec)
