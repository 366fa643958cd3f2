"""A minimal scheduler-side receiver for gpufleet advisor plans and remediation events.

Run: ``GPUFLEET_WEBHOOK_SECRET=... python receiver.py --port 8080`` and point
``advisor.receivers[].url`` at ``http://HOST:8080/gpufleet/plan``.

It does the three things every receiver must do:

1. verify ``X-Gpufleet-Signature`` (HMAC-SHA256 of the raw body with the shared
   secret) in constant time, and answer 401 when it does not match;
2. deduplicate on ``Idempotency-Key`` (the plan id, ``<plan id>.<n>`` when an
   expired or rejected plan is proposed again): gpufleet retries until it
   sees a 2xx, so the same proposal can arrive more than once;
3. answer 2xx only once the plan is safely recorded, 5xx (or 429 with
   ``Retry-After``) when it should be sent again later, and 4xx only when the
   request itself is wrong: gpufleet never retries a 4xx other than 429.

Acting on the plan is the scheduler's business; see docs/advisor.md for how a
Slurm site or a Kubernetes operator would. This example only logs it.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os

from aiohttp import web

SECRET_KEY = web.AppKey("secret", bytes)
SEEN_KEY = web.AppKey("seen", dict)


def signature_ok(body: bytes, secret: bytes, header: str) -> bool:
    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header or "")


async def receive_plan(request: web.Request) -> web.Response:
    body = await request.read()
    if not signature_ok(body, request.app[SECRET_KEY], request.headers.get("X-Gpufleet-Signature", "")):
        return web.json_response({"error": "bad signature"}, status=401)
    plan_id = request.headers.get("Idempotency-Key", "")
    seen = request.app[SEEN_KEY]
    if plan_id in seen:
        return web.json_response({"status": "duplicate", "plan_id": plan_id})
    try:
        plan = json.loads(body)
    except json.JSONDecodeError:
        return web.json_response({"error": "body is not JSON"}, status=400)
    seen[plan_id] = plan
    if request.headers.get("X-Gpufleet-Event") == "remediation":
        # issue 31: drain, reset_gpu, resume, replace or page. Appended one a line to a file,
        # the bodies are what `gpufleet act --slurm|--kubernetes --events FILE` carries out
        print(f"{plan_id}: {plan.get('type')} {plan.get('node') or plan.get('pool')}: "
              f"{plan.get('reason', '')}", flush=True)
        return web.json_response({"status": "accepted", "event_id": plan_id})
    for move in plan.get("migrations", []):
        print(f"{plan_id}: {move['action']} {move['job']} {move['from']} -> {move['to']}", flush=True)
    return web.json_response({"status": "accepted", "plan_id": plan_id})


def make_app(secret: bytes) -> web.Application:
    app = web.Application()
    app[SECRET_KEY] = secret
    app[SEEN_KEY] = {}
    app.router.add_post("/gpufleet/plan", receive_plan)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    secret = os.environ.get("GPUFLEET_WEBHOOK_SECRET", "").encode()
    if not secret:
        raise SystemExit("set GPUFLEET_WEBHOOK_SECRET to the secret shared with gpufleet")
    web.run_app(make_app(secret), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
