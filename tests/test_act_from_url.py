"""``gpufleet act --from URL`` reads a running gpufleet's /v1/advice itself, and observe mode
(the default) prints what it would do."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, http_get

XID_NODE = "gpu-010"  # an A100 node without MIG of the tests' small simulated fleet


def _act(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exporter", "act", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=60, env={"PYTHONPATH": str(REPO)})


def _drain_advised(url: str) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        advice = json.loads(http_get(f"{url}/v1/advice"))
        recent = (advice.get("health") or {}).get("recent_remediation") or []
        if any(e["type"] == "drain" and e["node"] == XID_NODE for e in recent):
            return advice
        time.sleep(0.5)
    raise AssertionError("no drain advised")


@pytest.mark.slow
def test_act_from_a_served_exporter_prints_what_it_would_do(exporter_factory, tmp_path):
    served = exporter_factory(config=f"""
collect_interval: 1s
sources:
  sim:
    scenarios:
      - {{kind: xid, node: {XID_NODE}, gpu: 4, value: 79}}
""")
    advice = _drain_advised(served.url)
    drain = next(e for e in advice["health"]["recent_remediation"]
                 if e["type"] == "drain" and e["node"] == XID_NODE)
    command = (f'scontrol update NodeName={XID_NODE} State=DRAIN '
               f'Reason="gpufleet: {drain["reason"]}"')

    observed = _act("--slurm", "--from", served.url, cwd=tmp_path)
    assert observed.returncode == 0, observed.stderr
    assert f"{drain['id']}: would run: {command}" in observed.stdout.splitlines()
    audit = [json.loads(line) for line in (tmp_path / "gpufleet-act.jsonl").read_text().splitlines()]
    assert {(r["id"], r["outcome"]) for r in audit} >= {(drain["id"], "observed")}

    # the /v1/advice URL itself works the same; dry-run prints the command alone
    printed = _act("--slurm", "--mode", "dry-run", "--from", f"{served.url}/v1/advice",
                   cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert command in printed.stdout.splitlines()


def test_observe_mode_prints_what_each_event_would_do(tmp_path):
    event = {"type": "drain", "node": "a-3", "pool": "a", "reason": "XID 79 on GPU 0",
             "at": 1764547500.0}
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps(event) + "\n")
    done = _act("--slurm", "--events", str(events), cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == ('drain:a-3:1764547500000: would run: scontrol update NodeName=a-3 '
                           'State=DRAIN Reason="gpufleet: XID 79 on GPU 0"\n')
    kube = _act("--kubernetes", "--events", str(events), cwd=tmp_path)
    assert kube.stdout == ("drain:a-3:1764547500000: would drain node a-3 (the patch is built "
                           "from the node as it is then: --mode dry-run shows it)\n")


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://x/v1/advice", "gpufleet: --from: must be an http(s) URL, got 'ftp://x/v1/advice'"),
    ("http://127.0.0.1:9", "gpufleet: --from http://127.0.0.1:9/v1/advice: cannot read: "),
])
def test_a_bad_from_is_one_line_and_exit_2(tmp_path, url, message):
    done = _act("--slurm", "--from", url, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1


def test_an_answer_that_is_not_advice_is_one_line(tmp_path):
    import http.server
    import threading

    class NotAdvice(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"status": "success"}' if self.path == "/v1/advice" else b"{}"
            self.send_response(200 if self.path == "/v1/advice" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotAdvice)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        done = _act("--slurm", "--from", url, cwd=tmp_path)
        assert (done.returncode, done.stderr) == (2, (
            f"gpufleet: --from {url}/v1/advice: the answer has no "
            "health.recent_remediation (is it gpufleet's /v1/advice?)\n"))
        missing = _act("--slurm", "--from", f"{url}/nothing/v1/advice", cwd=tmp_path)
        assert (missing.returncode, missing.stderr) == (
            2, f"gpufleet: --from {url}/nothing/v1/advice: HTTP 404 Not Found\n")
    finally:
        server.shutdown()
