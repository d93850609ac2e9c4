"""Property-based requests generated from /openapi.json: whatever a client sends, no 5xx."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.serving.conftest import API_KEY

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {API_KEY}"}
EXAMPLES_PER_OPERATION = 8
sent: list[tuple[str, str, int]] = []


def local_openapi() -> dict:
    """The server's OpenAPI document, built here so the cases exist at collection time (the routes do not
    depend on the served models); `test_served_openapi_is_the_one_tested` checks it is what /openapi.json
    serves."""
    from omnistage.serving.app import create_app

    return create_app({}).openapi()


schema = schemathesis.openapi.from_dict(local_openapi())


def test_served_openapi_is_the_one_tested(http):
    assert http.get("/openapi.json").json() == local_openapi()


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_no_request_gets_a_server_error(case, server, http):
    response = case.call(base_url=server.url, headers=AUTH, timeout=60)
    sent.append((case.operation.method, case.operation.path, response.status_code))
    assert response.status_code < 500, f"{case.operation.method} {case.operation.path}: {response.text[:500]}"
    if (
        case.operation.method.upper() == "POST"
        and case.operation.path == "/v1/videos"
        and response.status_code == 200
    ):
        http.delete(f"/v1/videos/{response.json()['id']}")  # cancel: only the job's creation is under test


def test_examples_covered_every_route():
    assert len(sent) >= 200, len(sent)
    operations = {(method, path) for method, path, _ in sent}
    assert len(operations) >= 14, sorted(operations)
    assert any(status == 200 for method, path, status in sent if path == "/v1/chat/completions")
