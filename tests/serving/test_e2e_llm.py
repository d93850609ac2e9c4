"""`omnistage serve DIR_A DIR_B`: two real tiny checkpoints (Qwen2, Llama) on the AR engine, one server."""

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from omnistage.families.llm.tiny import tiny_llm_dir
from omnistage.params import SamplingParams
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.e2e
MAX_MODEL_LEN = 96
ENGINE = {"0": {"engine_args": {"max_model_len": MAX_MODEL_LEN}}}
MESSAGES = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def model_dirs():
    return {"qwen2": tiny_llm_dir("qwen2"), "llama": tiny_llm_dir("llama")}


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory, model_dirs):
    root = tmp_path_factory.mktemp("llm")
    args = ["serve", *map(str, model_dirs.values()), "--placement", "inline", "--num-threads", "1"]
    args += ["--stage-overrides", json.dumps(ENGINE), "--storage-dir", str(root / "storage")]
    proc = ServerProcess(args, root / "server.log", module="omnistage")
    try:
        proc.wait_healthy()
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


@pytest.fixture(scope="module")
def llm_client(llm_server):
    import openai

    return openai.OpenAI(base_url=llm_server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def offline(model_dirs):
    from omnistage import Omni

    omnis = {}

    def run(name, prompt, params):
        if name not in omnis:
            omnis[name] = Omni(
                str(model_dirs[name]), placement="inline", num_threads=1, stage_overrides=ENGINE
            )
        (out,) = omnis[name].generate([prompt], params, use_tqdm=False)
        return out

    yield run
    for omni in omnis.values():
        omni.shutdown()


def test_both_models_are_served_by_directory_name(llm_client, model_dirs):
    assert sorted(m.id for m in llm_client.models.list().data) == sorted(p.name for p in model_dirs.values())


def test_chat_equals_offline_greedy_and_is_routed_by_model(llm_client, model_dirs, offline):
    qwen, llama = model_dirs["qwen2"].name, model_dirs["llama"].name
    reply = llm_client.chat.completions.create(model=qwen, messages=MESSAGES, max_tokens=8, temperature=0)
    expected = offline("qwen2", {"messages": MESSAGES}, SamplingParams(max_tokens=8, temperature=0.0))
    assert reply.model == qwen and reply.choices[0].message.content == expected.text
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    stream = llm_client.chat.completions.create(
        model=qwen, messages=MESSAGES, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected.text
    # The other checkpoint answers under its own name, with its own tokenizer and weights.
    other = llm_client.chat.completions.create(model=llama, messages=MESSAGES, max_tokens=8, temperature=0)
    assert other.model == llama and other.choices[0].message.content != expected.text
    assert other.usage.prompt_tokens != reply.usage.prompt_tokens


def test_completions_on_the_real_engine(llm_client, model_dirs, offline):
    name = model_dirs["qwen2"].name
    reply = llm_client.completions.create(model=name, prompt="Once upon a time", max_tokens=6, temperature=0)
    expected = offline("qwen2", "Once upon a time", SamplingParams(max_tokens=6, temperature=0.0))
    assert reply.choices[0].text == expected.text
    long = llm_client.completions.create(model=name, prompt="a b", max_tokens=10_000, temperature=0)
    assert long.choices[0].finish_reason == "length"
    assert long.usage.prompt_tokens + long.usage.completion_tokens == MAX_MODEL_LEN  # capped by the context


def test_metrics_show_queue_depth_and_kv_usage_of_ar_stages(llm_server, llm_client, model_dirs):
    import httpx

    llm_client.completions.create(model=model_dirs["qwen2"].name, prompt="hi", max_tokens=2)
    text = httpx.get(llm_server.url + "/metrics").text
    qwen = f'model="{model_dirs["qwen2"].name}"'
    for name in ("omnistage_stage_queue_depth", "omnistage_stage_kv_cache_usage", "omnistage_stage_requests"):
        assert any(line.startswith(name + "{") and qwen in line for line in text.splitlines()), name
    assert any(
        line.startswith("omnistage_time_to_first_token_seconds_count") and qwen in line
        for line in text.splitlines()
    )


def test_input_the_engine_refuses_is_a_400(llm_server):
    import httpx

    response = httpx.post(llm_server.url + "/v1/completions", json={"prompt": [100_000], "max_tokens": 2})
    assert response.status_code == 400
    assert "rejected the request" in response.json()["error"]["message"]


def llm_openapi() -> dict:
    from omnistage.serving.app import create_app

    return create_app({}).openapi()


llm_schema = schemathesis.openapi.from_dict(llm_openapi()).include(path_regex="^/v1/(chat/)?completions$")


@llm_schema.parametrize()
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_real_engine_never_answers_5xx(case, llm_server):
    response = case.call(base_url=llm_server.url, timeout=60)
    assert response.status_code < 500, response.text[:500]


def _queued(url: str, name: str) -> float:
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    lines = [line for line in text.splitlines() if line.startswith("omnistage_stage_queue_depth{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if name in line)


def test_omni_sleep_and_wakeup_round_trip_and_hold_requests(llm_server, model_dirs):
    """vLLM-Omni's control routes: wakeup with nothing asleep is SKIPPED; a slept stage acks; a request sent
    meanwhile waits at the stage (queued, not failed) and completes after the wake; bad fields are 400s."""
    import concurrent.futures

    import httpx

    from tests.support.polling import wait_until

    name = model_dirs["qwen2"].name
    with httpx.Client(base_url=llm_server.url, timeout=120) as http:
        assert http.post("/v1/omni/wakeup", json={}).json()["status"] == "SKIPPED"
        slept = http.post("/v1/omni/sleep", json={"model": name, "stage_ids": [0], "level": 2})
        assert slept.status_code == 200 and slept.json()["status"] == "SUCCESS", slept.text
        assert [(a["model"], a["stage_id"], a["level"]) for a in slept.json()["acks"]] == [(name, 0, 2)]
        body = {"model": name, "prompt": "Hello", "max_tokens": 3, "temperature": 0}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(http.post, "/v1/completions", json=body)
            wait_until(
                lambda: _queued(llm_server.url, name) >= 1, what="the request queued at the sleeping stage"
            )
            assert not pending.done()
            woke = http.post("/v1/omni/wakeup", json={"model": name})
            assert woke.json()["status"] == "SUCCESS" and woke.json()["acks"][0]["stage_id"] == 0
            reply = pending.result(timeout=120)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
        assert http.post("/v1/omni/wakeup", json={"model": name}).json()["status"] == "SKIPPED"
        for bad, param in (({"stage_ids": [7]}, "stage_ids"), ({"level": 5}, "level")):
            refused = http.post("/v1/omni/sleep", json=bad)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param
