"""schemathesis against a live exporter (issue 14, Build 7): every /v1 operation of
GET /v1/openapi.json, with the advisor's bearer token and without one.

Checks, on every answer: no 5xx (not_a_server_error), the status code is documented
(status_code_conformance), and so are the content type (content_type_conformance) and
the body (response_schema_conformance).

Run length, fixed: schema-valid and invalid bodies (both generation modes), at most
``EXAMPLES`` (40) drawn examples per operation and mode, plus schemathesis' deterministic
coverage cases (each bound and type of the schema, one past it, and the methods an
operation lacks, 405). Drawn derandomized under the suite's hypothesis profile
(tests/conftest.py), so every run sends the same requests: about 1,730 per token mode
(POST /v1/plan 1,442, POST /v1/alerts 246, 3 per GET, 35 method probes), some 45 s on 2
shared cores for both modes. docs/reliability.md has the tally and what it found.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from exporter.advisor import openapi
from tests.helpers.servers import Server, http_get, start_exporter, stop

# one process, not xdist (make test runs the `serial` tests beside the xdist part): its last
# tests read what its runs recorded in this process, and xdist would run one of the
# per-operation tests sharing a node id. No timing wait: it passed on a machine at load 9-11
# (2 cores), and under stress-ng --cpu 2
pytestmark = [pytest.mark.slow, pytest.mark.serial]

TOKEN = "schemathesis-token"
EXAMPLES = 40  # per operation and generation mode: bounded, and minutes at most on 2 cores
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One live exporter for both runs: the tests' small simulated fleet, the advisor on, its
    token set."""
    server = start_exporter(tmp_path_factory.mktemp("schemathesis"), env={"GPUFLEET_ADVISOR_TOKEN": TOKEN},
                            drop_env=("GPUFLEET_ADVISOR_TOKEN",), fleet="small")
    yield server
    stop(server.proc)


# Loaded from the document itself, not the live URL: schemathesis' lazy from_fixture fails under
# pytest 9 (it reads Function._nodeid). The live server serves this same document, and
# test_the_live_document_is_this_one checks it; every request goes to the live server.
schema = schemathesis.openapi.from_dict(openapi.document())
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


# (token?, "METHOD /path", generation mode, status) -> requests, to check the run's shape at the end
SENT: Counter[tuple[bool, str, str, int]] = Counter()


def _call(case, base_url: str, with_token: bool) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"} if with_token else {}
    if not with_token and case.headers:
        case.headers.pop("Authorization", None)  # none at all, not a generated one
    response = case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=30)
    mode = case.meta.generation.mode.value if case.meta is not None else "explicit"
    SENT[with_token, f"{case.method.upper()} {case.path}", mode, response.status_code] += 1
    # schemathesis also sends methods an operation lacks (405); a POST the document has,
    # without the token, is refused before its body is read, unless the body is too big;
    # but the admission webhook, which the apiserver calls with no token and which only admits
    if (not with_token and case.method.upper() == case.operation.method.upper() == "POST"
            and case.operation.path != "/v1/admission"):
        assert response.status_code in (401, 413), response.text[:200]


@schema.parametrize()
@settings(max_examples=EXAMPLES)
def test_live_api_with_the_token(case, exporter: Server):
    _call(case, exporter.url, with_token=True)


@schema.parametrize()
@settings(max_examples=EXAMPLES)
def test_live_api_without_a_token(case, exporter: Server):
    _call(case, exporter.url, with_token=False)


def test_the_live_document_is_this_one(exporter: Server):
    assert json.loads(http_get(f"{exporter.url}/v1/openapi.json")) == openapi.document()


def test_the_runs_reached_the_handlers(exporter: Server):
    """Both modes ran with and without the token, and bodies got past the token into the
    checks: schema-valid what-ifs answered 200, invalid ones 400. It reads what the runs
    above recorded in this process (pytest runs a module in order; slow tests run without
    xdist)."""
    if not SENT:
        pytest.skip("the schemathesis runs did not run in this process")
    by_status: Counter[tuple[bool, str, str, int]] = Counter()
    for (token, operation, mode, status), n in SENT.items():
        by_status[token, operation, mode, status] += n
    assert by_status[True, "POST /v1/plan", "positive", 200] > 0
    assert by_status[True, "POST /v1/plan", "negative", 400] > 0
    assert by_status[True, "POST /v1/alerts", "negative", 400] > 0
    assert by_status[False, "POST /v1/plan", "positive", 401] > 0
    # the webhook answered the apiserver's shape without a token, and refused what is not one
    assert by_status[False, "POST /v1/admission", "positive", 200] > 0
    assert by_status[False, "POST /v1/admission", "negative", 400] > 0
    assert {status for (_, _, _, status) in SENT} <= {200, 202, 400, 401, 405, 413}


def test_the_server_stayed_up(exporter: Server):
    # after both runs (module order): no traceback in the log, the process still serving
    log = exporter.log.read_text()
    assert exporter.proc.poll() is None
    assert "Traceback" not in log, log[log.find("Traceback"):][:2000]

