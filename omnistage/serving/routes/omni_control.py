"""POST /v1/omni/sleep and /v1/omni/wakeup: vLLM-Omni's stage sleep control, over `AsyncOmni.sleep` and
`wake_up`.

Sleep: `{"stage_ids": [...], "level": 1, "model": ...}` (every stage, level 1, every served model when
left out) → `{"status": "SUCCESS", "acks": [{"model", "stage_id", "replica", "level"}]}`. Level 0 pauses a
stage's scheduling; 1 (and vLLM-Omni's 2) also frees its cache and moves its weights off the device. Requests
that arrive while a stage sleeps wait at its admission, and run after the wake. Wakeup: `{"stage_ids": [...]}`
(the sleeping ones when left out) → SUCCESS with acks, or `{"status": "SKIPPED", "reason": ...}` when none of
them sleeps. A stage whose engine cannot sleep answers 501 naming it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from omnistage.errors import InvalidRequestError
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.served import ServedModel

router = APIRouter()


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise InvalidRequestError("the body must be a JSON object", param="body") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object", param="body")
    return body


def _targets(ctx: ServerContext, body: dict[str, Any]) -> list[ServedModel]:
    name = body.get("model")
    if name is None:
        return list(ctx.models)
    return [ctx.models.get(str(name))]


def _stage_ids(model: ServedModel, body: dict[str, Any]) -> list[int] | None:
    ids = body.get("stage_ids")
    if ids is None:
        return None
    known = {s.stage_id for s in model.stages}
    if not isinstance(ids, list) or any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        raise InvalidRequestError("stage_ids must be a list of stage ids", param="stage_ids")
    unknown = sorted(set(ids) - known)
    if unknown:
        raise InvalidRequestError(
            f"stage_ids: model {model.name!r} has no stage {unknown[0]} (it has {sorted(known)})",
            param="stage_ids",
        )
    return list(ids)


def _acks(model: ServedModel, results: list[dict[str, Any]], level: int | None) -> list[dict[str, Any]]:
    failed = [r for r in results if isinstance(r.get("result"), dict) and "error" in r["result"]]
    if failed:
        first = failed[0]
        return [{"error": f"stage {first['stage_id']} of {model.name!r}: {first['result']['error']}"}]
    ack = {"level": level} if level is not None else {}
    return [{"model": model.name, "stage_id": r["stage_id"], "replica": r["replica"], **ack} for r in results]


def _answer(acks: list[dict[str, Any]]) -> JSONResponse:
    errors = [a["error"] for a in acks if "error" in a]
    if errors:
        body = {
            "error": {"message": errors[0], "type": "NotImplementedError", "param": "stage_ids", "code": 501}
        }
        return JSONResponse(body, status_code=501)
    return JSONResponse({"status": "SUCCESS", "acks": acks})


@router.post("/v1/omni/sleep")
async def sleep(request: Request, ctx: ServerContext = Depends(get_context)) -> JSONResponse:
    body = await json_body(request)
    level = body.get("level", 1)
    if not isinstance(level, int) or isinstance(level, bool) or level not in (0, 1, 2):
        raise InvalidRequestError("level must be 0, 1 or 2", param="level")
    acks: list[dict[str, Any]] = []
    for model in _targets(ctx, body):
        ids = _stage_ids(model, body)
        results = await model.omni.sleep(min(level, 1), ids)
        acks += _acks(model, results, level)
        ctx.sleeping.setdefault(model.name, set()).update({r["stage_id"] for r in results})
    return _answer(acks)


@router.post("/v1/omni/wakeup")
async def wakeup(request: Request, ctx: ServerContext = Depends(get_context)) -> JSONResponse:
    body = await json_body(request)
    acks: list[dict[str, Any]] = []
    for model in _targets(ctx, body):
        asleep = ctx.sleeping.get(model.name, set())
        ids = _stage_ids(model, body)
        wanted = sorted(asleep if ids is None else asleep & set(ids))
        if not wanted:
            continue
        acks += _acks(model, await model.omni.wake_up(wanted), None)
        asleep.difference_update(wanted)
    if not acks:
        return JSONResponse({"status": "SKIPPED", "reason": "Target stages are not sleeping."})
    return _answer(acks)
