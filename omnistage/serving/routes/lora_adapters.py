"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's routes): register a LoRA adapter by name
for diffusion requests to name in `lora`, or remove one (serving/loras.py). Stages load an adapter when a
request first names it; one removed here stays cached in a stage until the stage's bound evicts it."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.routes.omni_control import json_body

router = APIRouter()


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request, ctx: ServerContext = Depends(get_context)):
    body = await json_body(request)
    ctx.loras.add(body.get("lora_name"), body.get("lora_path"))
    return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request, ctx: ServerContext = Depends(get_context)):
    body = await json_body(request)
    ctx.loras.remove(body.get("lora_name"))
    return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")
