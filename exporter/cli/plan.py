"""``gpufleet plan``: the advisor's current plan, as JSON or as Kubernetes objects to apply;
or its remediation, as scontrol commands or node patches.

Reads the plan from a running gpufleet (``GET /v1/advice``, the default) or from a saved
file (a plan, or a saved ``/v1/advice`` answer; ``-`` is stdin), checks it against the
plan schema (docs/advisor-plan.schema.json) and that its id is its content's hash, and
prints it:

  json         the plan itself;
  koordinator  one Koordinator PodMigrationJob per move, reservation first
               (kubectl apply -f -);
  eviction     one policy/v1 Eviction per move, with the destination as a node-affinity
               hint (each goes to its pod's eviction subresource; see docs/advisor.md);
  slurm        the remediation in the advice's health (docs/health.md): each node's latest
               drain or resume as its scontrol command, one a line; resets, replacements
               and pages, which have no command, on stderr;
  kubernetes   the same as node merge patches (cordon and taint, or their removal), one JSON
               object a line, each built from the node as --api-server answers it (read,
               never written) and guarded by its resourceVersion.

With --format slurm --weights, the advice's placement preferences (its steering section)
follow the remediation, after a "# steering" comment line: scontrol update NodeName=X
Weight=N for each node whose weight is not Slurm's default 1, the highest weight first.
gpufleet act --weights applies them within its budget and leaves an operator's weight
alone (docs/advisor.md); these lines do neither.

gpufleet act runs the same commands and patches, with its checks (an operator's drain is
left alone) and its audit log; plan only prints them.

wait_until moves render no object: the next plan carries them. /v1/advice keeps the last
plan until it expires, through the cooldown that follows it (stderr then says the plan is
not new). An expired plan is refused (--ignore-expiry renders it anyway, for review).
What is read is bounded: at most --max-bytes (16 MiB), within --timeout seconds (10), at
most 1,000 moves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from exporter import logs
from exporter.advisor import bounds
from exporter.advisor.kube_render import RenderError, render_evictions, render_koordinator, to_yaml
from exporter.advisor.wire import PlanFormatError, plan_from_json
from exporter.bounded_file import USAGE, read_bounded
from exporter.config import DEFAULT_PORT
from exporter.errors import UsageError, one_line

if TYPE_CHECKING:
    from exporter.health.remediation import Event

DESCRIPTION = __doc__.split("\n\n", 1)[1].replace("``", "") if __doc__ else ""
EPILOG = f"""examples:
  gpufleet plan --format koordinator | kubectl apply -f -
  gpufleet plan --from https://gpufleet.example:{DEFAULT_PORT} --token-file /var/run/secrets/token
  curl -s localhost:{DEFAULT_PORT}/v1/advice > advice.json
  gpufleet plan --from advice.json --format eviction
  gpufleet plan --format slurm
  gpufleet plan --format kubernetes --api-server https://10.0.0.1:6443 \\
      --api-token-file /var/run/secrets/kubernetes.io/serviceaccount/token"""

REMEDIATION_FORMATS = ("slurm", "kubernetes")
FORMATS = ("json", "koordinator", "eviction", *REMEDIATION_FORMATS)
DEFAULT_FROM = f"http://localhost:{DEFAULT_PORT}/v1/advice"
MAX_BYTES = 16 * 1024 * 1024  # advisor.max_body_bytes' default: what /v1/plan takes
# advisor.max_migrations defaults to 10 a plan; 1,000 renders in about 3 s (checking the
# schema and writing YAML take 1-1.5 ms a move), 10,000 took 27 s
MAX_MIGRATIONS = 1_000
MAX_TOKEN_BYTES = 64 * 1024  # a service account token is ~1 KB
MAX_EVENTS = 1_000  # the advice lists at most 100 (health.monitor.MAX_LISTED)


class PlanError(Exception):
    """The plan could not be fetched or rendered; one line, exit 1."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="json",
                        help="what to print (default json)")
    parser.add_argument("--from", dest="source", metavar="URL_OR_FILE", default=DEFAULT_FROM,
                        help=f"a gpufleet URL (its /v1/advice), a saved plan or advice JSON file, "
                        f"or - for stdin (default {DEFAULT_FROM})")
    parser.add_argument("--token-file", metavar="FILE",
                        help="bearer token for the URL (e.g. a service account token)")
    parser.add_argument("--ca-file", metavar="FILE", help="CA bundle for an https URL")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="the whole fetch (default 10)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, metavar="N",
                        help=f"largest answer or file read (default {MAX_BYTES})")
    parser.add_argument("--ignore-expiry", action="store_true",
                        help="render a plan past its expires_at (to review it, not to apply it)")
    parser.add_argument("--weights", action="store_true",
                        help="--format slurm: also the advice's steering, as node Weight updates")
    parser.add_argument("--preemption", action="store_true",
                        help="--format slurm or kubernetes: only the advice's preemption, its victims "
                        "for the blocked high-priority head as scontrol commands or policy/v1 Evictions "
                        "(one JSON object a line)")
    parser.add_argument("--preempt-mode", choices=("requeue", "suspend"), default="requeue",
                        help="--preemption --format slurm: the site's PreemptMode (default requeue)")
    parser.add_argument("--api-server", metavar="URL",
                        help="the Kubernetes apiserver each node is read from (--format kubernetes)")
    parser.add_argument("--api-token-file", metavar="FILE", help="bearer token for the apiserver")
    parser.add_argument("--api-ca-file", metavar="FILE", help="CA bundle for an https apiserver")


def run(args: argparse.Namespace) -> int:
    logs.setup("warning")
    if not 0 < args.timeout <= 600:
        raise UsageError(f"--timeout: must be in (0, 600] seconds, got {args.timeout:g}")
    if not 0 < args.max_bytes <= 1024 * 1024 * 1024:
        raise UsageError(f"--max-bytes: must be from 1 to 1 GiB, got {args.max_bytes}")
    if args.weights and args.format != "slurm":
        raise UsageError("--weights: only with --format slurm")
    if args.preemption:
        if args.format not in REMEDIATION_FORMATS:
            raise UsageError("--preemption: only with --format slurm or kubernetes")
        return _preemption(args)
    if args.format in REMEDIATION_FORMATS:
        return _remediation(args)
    if args.api_server or args.api_token_file or args.api_ca_file:
        raise UsageError("--api-server, --api-token-file, --api-ca-file: only with --format kubernetes")
    try:
        body = _read(args)
        data = _plan_json(body, args.source)
        if data is None:
            return 0
        out = render(data, args.format, now=None if args.ignore_expiry else time.time())
    except PlanError as exc:
        print(f"gpufleet: {one_line(str(exc))}", file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0


def render(data: dict[str, Any], fmt: str, now: float | None) -> str:
    """The output for a checked plan; ``now`` None renders an expired plan too. The plan is
    read into its typed form (which checks its id); the YAML formats are written from that,
    and ``json`` prints the plan as read, so a field a newer advisor adds is not dropped."""
    try:
        plan = plan_from_json(data)
        if fmt == "json":
            if now is not None and plan.expires_at <= now:
                raise RenderError(f"plan {plan.plan_id} expired")
            return json.dumps(data, indent=2) + "\n"
        renderer = render_koordinator if fmt == "koordinator" else render_evictions
        when = plan.snapshot_time if now is None else now
        if now is None:  # review mode: the TTL as if rendered when the plan was made
            when = min(when, plan.expires_at - 1)
        header = [f"gpufleet plan {plan.plan_id} ({plan.scope}): {len(plan.migrations)} moves, "
                  f"fragmented GPUs {plan.before.fragmented_gpus:g} -> {plan.after.fragmented_gpus:g}"]
        return to_yaml(renderer(plan, when), header)
    except PlanFormatError as exc:  # RenderError too
        message = str(exc)
        if "expired" in message:
            message += " (--ignore-expiry renders it for review)"
        raise PlanError(message) from None


# --- remediation ------------------------------------------------------------------------


def _remediation(args: argparse.Namespace) -> int:
    from exporter.health.act import Actor, KubernetesApi

    api = None
    if args.format == "kubernetes":
        if not args.api_server:
            raise UsageError("--api-server: needed with --format kubernetes (each node is read, "
                             "never written, to build its patch)")
        if not args.api_server.startswith(("http://", "https://")):
            raise UsageError(f"--api-server: must be an http(s) URL, got {args.api_server!r}")
        api = KubernetesApi(args.api_server, _token(args.api_token_file), args.api_ca_file,
                            timeout=args.timeout)
    elif args.api_server or args.api_token_file or args.api_ca_file:
        raise UsageError("--api-server, --api-token-file, --api-ca-file: only with --format kubernetes")
    try:
        body = _read(args)
        events = _remediation_events(body, args.source)
        weights = steering_lines(body, args.source) if args.weights else []
    except PlanError as exc:
        print(f"gpufleet: {one_line(str(exc))}", file=sys.stderr)
        return 1
    # dry-run: the exact command, or the patch from the node as read; nothing is changed
    actor = Actor(args.format, "dry-run", None, sys.stdout, api, notes=sys.stderr,
                  prog="gpufleet plan")
    failed = 0
    for event in events:
        record = actor.handle(event)
        if record["outcome"] == "failed":
            failed += 1
            print(f"gpufleet: {record['id']}: {one_line(record['error'])}", file=sys.stderr)
    sys.stdout.writelines(line + "\n" for line in weights)
    return 1 if failed else 0


def _preemption(args: argparse.Namespace) -> int:
    """The advice's preemption section rendered (exporter/preemption/advice.py); nothing, said
    on stderr, when the advice has none or names no victim."""
    from exporter.preemption.advice import AdviceFormatError, evictions, slurm_lines

    try:
        body = _read(args)
        try:
            data = bounds.parse_json(body)
        except bounds.Invalid:
            raise PlanError(f"{args.source}: not JSON") from None
        if not isinstance(data, dict) or "evaluated_at" not in data:
            raise PlanError(f"{args.source}: expected /v1/advice's answer")
        section = data.get("preemption")
        if args.format == "slurm":
            out = slurm_lines(section, args.preempt_mode)
        else:
            out = [json.dumps(e, sort_keys=True) for e in evictions(section)]
    except AdviceFormatError as exc:
        print(f"gpufleet: {args.source}: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except PlanError as exc:
        print(f"gpufleet: {one_line(str(exc))}", file=sys.stderr)
        return 1
    if not out:
        print("gpufleet: no preemption: the advice names no victim (no high-priority job is "
              "blocked, or none can be helped)", file=sys.stderr)
    sys.stdout.writelines(line + "\n" for line in out)
    return 0


def steering_lines(body: bytes, source: str) -> list[str]:
    """The weight updates of a ``/v1/advice`` answer's steering: a comment line, then one
    command for each node off Slurm's default weight, the highest weight first (then by
    name); none without a steering section."""
    from exporter.advisor.steer import WEIGHT_BEST
    from exporter.advisor.steer_slurm import command_text
    from exporter.advisor.wire import steering_weights

    data = bounds.parse_json(body)  # _remediation_events read it already: it is JSON
    steering = data.get("steering") if isinstance(data, dict) else None
    if steering is None:
        return []
    try:
        weights = steering_weights(steering)
    except ValueError as exc:
        raise PlanError(f"{source}: {exc}") from None
    changed = sorted(((w, node) for node, w in weights.items() if w != WEIGHT_BEST),
                     key=lambda c: (-c[0], c[1]))
    at = steering.get("computed_at")
    when = f" computed at {at:.0f}" if isinstance(at, int | float) and not isinstance(at, bool) else ""
    head = (f"# steering{when}: {len(changed)} of {len(weights)} nodes off the default weight "
            f"{WEIGHT_BEST} (lowest allocated first)")
    return [head, *(command_text(node, w) for w, node in changed)]


def _remediation_events(body: bytes, source: str) -> list[Event]:
    """The events of a ``/v1/advice`` answer worth rendering now (:func:`current`); none,
    said on stderr, when the advice has no health or gpufleet decided nothing lately."""
    from exporter.health.remediation import decode_event

    try:
        data = bounds.parse_json(body)
    except bounds.Invalid as exc:
        reason = str(exc).removeprefix("body is not valid JSON: ").removeprefix("body: ")
        raise PlanError(f"{source}: not JSON: {reason}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{source}: expected a JSON object (/v1/advice's answer)")
    if "plan_id" in data:
        raise PlanError(f"{source}: a plan, not /v1/advice's answer: remediation is in the "
                        "advice's health")
    if isinstance(data.get("error"), str):
        raise PlanError(f"{source}: an error answer, not an advice: {data['error'][:300]}")
    health = data.get("health")
    if health is None:
        print("gpufleet: no remediation: the advice has no health (the advisor has evaluated "
              "no snapshot yet)", file=sys.stderr)
        return []
    recent = health.get("recent_remediation") if isinstance(health, dict) else None
    if not isinstance(recent, list):
        raise PlanError(f"{source}: health.recent_remediation: expected a list")
    if len(recent) > MAX_EVENTS:
        raise PlanError(f"{source}: health.recent_remediation: {len(recent)} events, over the "
                        f"limit of {MAX_EVENTS}")
    events: list[Event] = []
    for i, item in enumerate(reversed(recent)):  # the advice lists the newest first
        try:
            events.append(decode_event(json.dumps(item)))
        except ValueError as exc:
            where = f"health.recent_remediation[{len(recent) - 1 - i}]"
            raise PlanError(f"{source}: {where}: {exc}") from None
    chosen = current(events)
    if not chosen:
        print("gpufleet: no remediation: gpufleet decided no drain, resume or other action lately",
              file=sys.stderr)
    return chosen


def current(events: list[Event]) -> list[Event]:
    """Of ``events`` (oldest first), each node's latest drain or resume, and the advice
    (resets, replacements, pages) decided since it, in their order. An older drain that a
    resume undid is left out: printed again, and run, it would take a repaired node out of
    service; an older resume too, so a node drained again is not resumed by mistake."""
    from exporter.health.remediation import Drain, Page, Resume

    latest: dict[str, Drain | Resume] = {}
    for event in events:
        if isinstance(event, Drain | Resume):
            latest[event.node] = event
    chosen: list[Event] = []
    for event in events:
        if isinstance(event, Page):
            chosen.append(event)
        elif isinstance(event, Drain | Resume):
            if latest[event.node] is event:
                chosen.append(event)
        elif event.node not in latest or event.at >= latest[event.node].at:
            chosen.append(event)
    return chosen


# --- reading ----------------------------------------------------------------------------


def _is_url(source: str) -> bool:
    return urlsplit(source).scheme in ("http", "https")


def _read(args: argparse.Namespace) -> bytes:
    if _is_url(args.source):
        return asyncio.run(_fetch(args))
    return _read_file(args.source, args.max_bytes)


def _read_file(path: str, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of a file or stdin (``-``)."""
    return read_bounded(path, max_bytes, USAGE, dash_is_stdin=True, setting="--max-bytes")


def _advice_url(source: str) -> str:
    parts = urlsplit(source)
    if parts.path in ("", "/"):
        return parts._replace(path="/v1/advice").geturl()
    return source


def _token(path: str | None) -> str | None:
    if path is None:
        return None
    body = _read_file(path, MAX_TOKEN_BYTES)
    try:
        token = body.decode("ascii").strip()
    except UnicodeDecodeError:
        raise UsageError(f"--token-file {path}: not an ASCII token") from None
    if not token or any(c.isspace() for c in token):
        raise UsageError(f"--token-file {path}: must hold one token, without spaces")
    return token


async def _fetch(args: argparse.Namespace) -> bytes:
    import ssl

    import aiohttp

    from exporter import http_client

    url = _advice_url(args.source)
    headers = {"Accept": "application/json"}
    if (token := _token(args.token_file)) is not None:
        headers["Authorization"] = f"Bearer {token}"
    ssl_context: ssl.SSLContext | bool = True
    if args.ca_file:
        try:
            ssl_context = ssl.create_default_context(cafile=args.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--ca-file {args.ca_file}: {exc}") from None
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    try:
        async with http_client.client_session(timeout=timeout) as session, \
                http_client.request(session, "GET", url, headers=headers, ssl=ssl_context) as response:
            if response.status in http_client.REDIRECTS:  # the token goes to this host only
                raise PlanError(f"{url}: {http_client.redirect_refused(response.status)}")
            if response.status != 200:
                text = (await response.content.read(300)).decode("utf-8", "replace").strip()
                raise PlanError(f"{url}: HTTP {response.status}" + (f": {text[:200]}" if text else ""))
            try:
                return await http_client.read_capped(response, args.max_bytes)
            except http_client.AnswerTooLarge as exc:
                size = "" if exc.declared is None else f" {exc.declared} bytes,"
                raise PlanError(f"{url}:{size} over the {args.max_bytes}-byte limit "
                                "(--max-bytes)") from None
    except TimeoutError:
        raise PlanError(f"{url}: no complete answer within {args.timeout:g} s (--timeout)") from None
    except aiohttp.ClientError as exc:
        raise PlanError(f"{url}: {type(exc).__name__}: {exc}") from None


# --- checking ---------------------------------------------------------------------------


def _plan_json(body: bytes, source: str) -> dict[str, Any] | None:
    """The plan in a plan or ``/v1/advice`` JSON body, checked; None when the advice has no
    plan (said on stderr: nothing to apply is not an error)."""
    try:
        data = bounds.parse_json(body)
    except bounds.Invalid as exc:  # bounds speaks of a request "body"; here it is the file
        reason = str(exc).removeprefix("body is not valid JSON: ").removeprefix("body: ")
        raise PlanError(f"{source}: not JSON: {reason}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{source}: expected a JSON object (a plan, or /v1/advice's answer)")
    if "plan_id" not in data and isinstance(data.get("error"), str):  # a saved error answer
        raise PlanError(f"{source}: an error answer, not a plan: {data['error'][:300]}")
    if "plan_id" not in data and "plan" in data:  # an advice
        if data["plan"] is None:
            reasons = data.get("reasons")
            why = "; ".join(map(str, reasons))[:300] if isinstance(reasons, list) else ""
            print(f"gpufleet: no plan: the advice's decision is {str(data.get('decision'))[:40]!r}"
                  + (f" ({why})" if why else ""), file=sys.stderr)
            return None
        if data.get("decision") != "compact":  # a plan an earlier evaluation proposed
            _say_carried(data)
        data = data["plan"]
        if not isinstance(data, dict):
            raise PlanError(f"{source}: plan: expected an object")
    migrations = data.get("migrations")
    if isinstance(migrations, list) and len(migrations) > MAX_MIGRATIONS:
        raise PlanError(f"{source}: {len(migrations)} migrations, over the limit of {MAX_MIGRATIONS}")
    _check_schema(data, source)
    return data


def _say_carried(advice: dict[str, Any]) -> None:
    """On stderr: the advice carries a plan that an earlier evaluation proposed (the advisor
    keeps it in /v1/advice until it expires, through the cooldown): still in force, not new."""
    proposed = advice.get("plan_proposed_at")
    when = ""
    if isinstance(proposed, int | float) and not isinstance(proposed, bool):
        try:  # the advice is the sender's text: a year 10,000 must not raise
            when = " at " + datetime.fromtimestamp(proposed, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        except (OverflowError, ValueError, OSError):
            when = ""
    print(f"gpufleet: the advice's decision is {str(advice.get('decision'))[:40]!r}; its plan was "
          f"proposed by an earlier evaluation{when} and is still in force", file=sys.stderr)


def _check_schema(data: dict[str, Any], source: str) -> None:
    import jsonschema

    from exporter.advisor.openapi import plan_schema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(plan_schema()).iter_errors(data))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        message = error.message if len(error.message) <= 200 else error.message[:200] + "..."
        raise PlanError(f"{source}: not a valid plan: {where.lstrip('.') or '(top)'}: {message}")


__all__ = ["FORMATS", "REMEDIATION_FORMATS", "PlanError", "add_arguments", "current", "render", "run"]
