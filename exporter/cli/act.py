"""``gpufleet act``: take remediation events (drain, resume, reset, replace, page) to Slurm or
Kubernetes, staged and bounded.

Events are JSON lines (--events FILE, or - for stdin, the default), as the advisor writes
them, or what a running gpufleet advised (--from URL: its /v1/advice, the events of
health.recent_remediation, oldest first). --mode observe (the default) prints what each
would do and changes nothing; dry-run prints the exact scontrol command or node patch (a
Kubernetes node is read for it) and changes nothing; act runs it. Slurm runs scontrol
(SLURM_CONF finds the cluster); Kubernetes GETs the node and PATCHes it guarded by its
resourceVersion, retrying on 409 Conflict. Every event is appended to the audit log
(--audit-log, JSON lines); in act mode an event the log records as done is skipped, so a
replay or a restart does not act twice, and an event decided before the newest drain or
resume already taken for its node is refused as stale (said on stderr). Slurm is acted on
only when scontrol shows exactly the node named. Budgets (how many nodes at once, the
rate, never a pool's last healthy node) are the advisor's: it decides the events
(docs/health.md).

With --slurm --from URL --weights, the advice's placement preferences (its steering
section) are taken to Slurm too, after the events: each node's Weight (the lowest is
allocated first), by scontrol update NodeName=X Weight=N, the biggest changes first, at
most --weights-per-minute updates in any minute (counted over the audit log, so the rest go
on the next run); a node is changed only while its Weight is the one gpufleet last set or
Slurm's default 1, never an operator's (docs/advisor.md, Steering); weights computed
more than 30 minutes ago are not applied.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.bounded_file import Wording, read_bounded
from exporter.errors import UsageError
from exporter.validate import flag_number

if TYPE_CHECKING:
    from exporter.health.act import Actor

DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else ""
EPILOG = """examples:
  gpufleet act --slurm --from http://127.0.0.1:9874
  gpufleet act --slurm --mode dry-run --events events.jsonl
  gpufleet act --kubernetes --mode act --api-server https://10.0.0.1:6443 \\
      --token-file /var/run/secrets/kubernetes.io/serviceaccount/token \\
      --ca-file /var/run/secrets/kubernetes.io/serviceaccount/ca.crt < events.jsonl"""
MAX_TOKEN_BYTES = 64 * 1024  # a service account token is ~1 KB
MAX_ADVICE_BYTES = 64 * 2 ** 20  # /v1/advice lists at most 100 of each thing: ~1 MB at most
ADVICE_PATH = "/v1/advice"
DEFAULT_WEIGHTS_PER_MINUTE = 60  # a 13,600-node fleet's weights settle in under 4 hours
MAX_WEIGHTS_PER_MINUTE = 10_000  # each update is a slurmctld RPC
MAX_STEERING_AGE = 1800.0  # seconds: six of the advisor's 300-s intervals
# a secret is a file at rest: a FIFO (which could hang the start) or a device is refused
_TOKEN_FILE = Wording(UsageError, cannot_read="--token-file {path}: cannot read: {reason}",
                      over_limit="--token-file {path}: {size} bytes, over the {limit}-byte limit",
                      grew_over_limit="--token-file {path}: over the {limit}-byte limit",
                      not_regular="--token-file {path}: not a regular file")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    backend = parser.add_mutually_exclusive_group(required=True)
    backend.add_argument("--slurm", dest="backend", action="store_const", const="slurm",
                         help="drain and resume nodes with scontrol")
    backend.add_argument("--kubernetes", dest="backend", action="store_const", const="kubernetes",
                         help="cordon and taint nodes through the apiserver")
    parser.add_argument("--mode", choices=("observe", "dry-run", "act"), default="observe",
                        help="observe: log only (default); dry-run: print the exact command or "
                             "patch; act: run it")
    events = parser.add_mutually_exclusive_group()
    events.add_argument("--events", default="-", metavar="FILE",
                        help="remediation events, one JSON object a line (- : stdin, default)")
    events.add_argument("--from", dest="from_url", metavar="URL",
                        help="a running gpufleet (http://HOST:PORT, or its /v1/advice URL): act "
                             "on the events its /v1/advice lists in health.recent_remediation")
    parser.add_argument("--from-token-file", metavar="FILE",
                        help="bearer token for --from, where api.require_token_for_reads is on")
    parser.add_argument("--audit-log", default="gpufleet-act.jsonl", metavar="FILE",
                        help="where every event and its outcome is appended (default "
                             "gpufleet-act.jsonl)")
    parser.add_argument("--scontrol", default="scontrol", help="the scontrol binary (Slurm)")
    parser.add_argument("--api-server", metavar="URL", help="the apiserver (Kubernetes)")
    parser.add_argument("--token-file", metavar="FILE", help="bearer token for the apiserver")
    parser.add_argument("--ca-file", metavar="FILE", help="CA bundle for an https apiserver")
    parser.add_argument("--max-conflict-retries", type=int, default=5,
                        help="re-reads of a node that changed under a patch (409), default 5")
    parser.add_argument("--weights", action="store_true",
                        help="also set the nodes' Slurm Weight to the advice's steering "
                             "(--slurm --from)")
    parser.add_argument("--preemption", action="store_true",
                        help="also preempt the advice's victims for its blocked high-priority head "
                             "(--slurm --from; docs/advisor.md, Preemption)")
    parser.add_argument("--preempt-mode", choices=("requeue", "suspend"), default="requeue",
                        help="--preemption: scontrol requeue or suspend, as the site's PreemptMode "
                             "(default requeue)")
    parser.add_argument("--preemptions-per-hour", type=int, default=20, metavar="N",
                        help="--preemption: preemptions at most in any hour (default 20)")
    parser.add_argument("--weights-per-minute", type=int, default=DEFAULT_WEIGHTS_PER_MINUTE,
                        metavar="N", help="Weight updates at most in any minute (default "
                        f"{DEFAULT_WEIGHTS_PER_MINUTE})")


def _token(path: str | None) -> str | None:
    """The bearer token in ``path`` (None: no file); UsageError (one line, exit 2) for a file
    that is not a regular file of at most MAX_TOKEN_BYTES holding one ASCII token."""
    if path is None:
        return None
    try:
        token = read_bounded(path, MAX_TOKEN_BYTES, _TOKEN_FILE).decode("ascii").strip()
    except UnicodeDecodeError:
        raise UsageError(f"--token-file {path}: not an ASCII token") from None
    if not token or not token.isprintable() or any(c.isspace() for c in token):
        raise UsageError(f"--token-file {path}: must hold one token, without spaces")
    return token


def advice_url(url: str) -> str:
    """``url`` as the /v1/advice URL to read; UsageError for one that is not http(s)."""
    if not url.startswith(("http://", "https://")) or not url.isprintable():
        raise UsageError(f"--from: must be an http(s) URL, got {url!r}")
    base = url.rstrip("/")
    return base if base.endswith(ADVICE_PATH) else base + ADVICE_PATH


def advised_events(url: str, token: str | None) -> list[str]:
    """The remediation events /v1/advice at ``url`` lists (health.recent_remediation, oldest
    first), one JSON line each; UsageError (one line) for an answer that holds none."""
    return events_of(advice_at(url, token), url)


def advice_at(url: str, token: str | None) -> object:
    """/v1/advice's answer at ``url``, as JSON; UsageError (one line) for one that is not."""
    import json

    from exporter.http_client import AnswerTooLarge, fetch

    headers = {"Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        answer = fetch("GET", url, headers=headers, max_bytes=MAX_ADVICE_BYTES)
    except AnswerTooLarge:
        raise UsageError(f"--from {url}: answer over {MAX_ADVICE_BYTES} bytes") from None
    except (OSError, ValueError) as exc:  # refused, unreachable, timed out, a URL urllib refuses
        raise UsageError(f"--from {url}: cannot read: {exc}") from None
    if answer.status != 200:
        raise UsageError(f"--from {url}: HTTP {answer.status} {answer.reason}".rstrip())
    try:
        return json.loads(answer.body)
    except (ValueError, RecursionError):
        raise UsageError(f"--from {url}: the answer is not JSON") from None


def events_of(advice: object, url: str) -> list[str]:
    """The remediation events of a /v1/advice answer, oldest first, one JSON line each."""
    import json

    health = advice.get("health") if isinstance(advice, dict) else None
    recent = health.get("recent_remediation") if isinstance(health, dict) else None
    if not isinstance(recent, list):
        raise UsageError(f"--from {url}: the answer has no health.recent_remediation "
                         "(is it gpufleet's /v1/advice?)")
    # newest first there; taken oldest first, as they were decided. "id" is the advice's
    # name of the event, which the event itself does not carry
    return [json.dumps({k: v for k, v in event.items() if k != "id"})
            for event in reversed(recent) if isinstance(event, dict)]


def _observed(record: dict[str, object]) -> str:
    """What observe mode prints for an event it would act on."""
    command = record.get("command")
    if command:
        return f"{record['id']}: would run: {command}"
    event = record.get("event")
    node = event.get("node", "") if isinstance(event, dict) else ""
    return (f"{record['id']}: would {record['type']} node {node} (the patch is built from the "
            "node as it is then: --mode dry-run shows it)")


def run(args: argparse.Namespace) -> int:
    from exporter.health.act import ActError, Actor, KubernetesApi, bounded_lines

    if not 0 <= args.max_conflict_retries <= 100:
        raise UsageError(f"--max-conflict-retries: must be 0..100, got {args.max_conflict_retries}")
    if args.api_server and not args.api_server.startswith(("http://", "https://")):
        raise UsageError(f"--api-server: must be an http(s) URL, got {args.api_server!r}")
    if args.backend == "kubernetes" and args.mode != "observe" and not args.api_server:
        raise UsageError(f"--api-server: needed with --kubernetes --mode {args.mode} "
                         "(the node is read to build the patch)")
    api = KubernetesApi(args.api_server, _token(args.token_file), args.ca_file) \
        if args.api_server else None
    try:
        actor = Actor(args.backend, args.mode, Path(args.audit_log), sys.stdout, api, args.scontrol,
                      args.max_conflict_retries, notes=sys.stderr)
    except ActError as exc:
        raise UsageError(f"--audit-log {exc}") from None
    flag_number(args.weights_per_minute, "--weights-per-minute", 1, MAX_WEIGHTS_PER_MINUTE)
    if args.weights and (args.backend != "slurm" or not args.from_url):
        raise UsageError("--weights: only with --slurm --from URL (the advice's steering section)")
    flag_number(args.preemptions_per_hour, "--preemptions-per-hour", 1, 10_000)
    if args.preemption and (args.backend != "slurm" or not args.from_url):
        raise UsageError("--preemption: only with --slurm --from URL (the advice's preemption section)")
    if args.from_url:
        url = advice_url(args.from_url)
        advice = advice_at(url, _token(args.from_token_file))
        # with --weights, an advice without health (health off) still carries the steering
        events = [] if (args.weights or args.preemption) and isinstance(advice, dict) \
            and advice.get("health") is None else events_of(advice, url)
        failed = _handle(actor, events, f"--from {url}")
        if args.weights:
            failed |= _weights(args, advice, url)
        if args.preemption:
            failed |= _preempt(args, advice)
        return failed
    try:
        # binary: each line is bounded while it is read (bounded_lines), never read whole first
        source = sys.stdin.buffer if args.events == "-" else open(args.events, "rb")  # noqa: SIM115
    except OSError as exc:
        raise UsageError(f"--events {args.events}: cannot read: {exc.strerror}") from None
    with source:
        return _handle(actor, bounded_lines(source), f"--events {args.events}")


def _handle(actor: Actor, lines: Iterable[str], what: str) -> int:
    """Every event of ``lines`` through ``actor``: 1 if one failed, else 0."""
    from exporter.health.act import ActError, read_events

    failed = 0
    try:
        for event in read_events(lines):
            record = actor.handle(event)
            if record["outcome"] == "observed":
                print(_observed(record), flush=True)
            if record["outcome"] == "failed":
                failed += 1
                print(f"gpufleet act: {record['id']}: {record['error']}", file=sys.stderr)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None
    except OSError as exc:  # a read error mid-stream (EIO)
        raise UsageError(f"{what}: cannot read: {exc.strerror}") from None
    except ActError as exc:  # the audit log cannot take a record: act no further
        raise UsageError(f"--audit-log {exc}") from None
    return 1 if failed else 0


def _preempt(args: argparse.Namespace, advice: object) -> int:
    """The advice's preemption taken to Slurm (exporter/preemption/act.py): 1 if one failed."""
    from exporter.preemption.act import PreemptActor, PreemptError

    section = advice.get("preemption") if isinstance(advice, dict) else None
    if section is None:
        print("gpufleet act: no preemption: the advice has no preemption section", file=sys.stderr)
        return 0
    try:
        actor = PreemptActor(args.mode, Path(args.audit_log), sys.stdout, args.scontrol,
                             args.preempt_mode, args.preemptions_per_hour, notes=sys.stderr)
        records = actor.apply(section)
    except PreemptError as exc:
        print(f"gpufleet act: preemption: {exc}", file=sys.stderr)
        return 1
    for record in records:
        if record["outcome"] == "failed":
            print(f"gpufleet act: {record['id']}: {record['error']}", file=sys.stderr)
    return 1 if any(r["outcome"] == "failed" for r in records) else 0


def _weights(args: argparse.Namespace, advice: object, url: str) -> int:
    """The advice's steering taken to Slurm's node weights: 1 if an update failed, else 0."""
    from exporter.advisor.steer_slurm import WeightActor, WeightError
    from exporter.advisor.wire import steering_weights

    steering = advice.get("steering") if isinstance(advice, dict) else None
    if steering is None:
        print("gpufleet act: no weights: the advice has no steering section (steering is off, "
              "or nothing evaluated yet)", file=sys.stderr)
        return 0
    try:
        wanted = steering_weights(steering)
    except ValueError as exc:
        raise UsageError(f"--from {url}: {exc}") from None
    computed_at = steering.get("computed_at")
    if not isinstance(computed_at, int | float) or isinstance(computed_at, bool):
        raise UsageError(f"--from {url}: steering.computed_at: expected a number")
    age = time.time() - computed_at
    if age > MAX_STEERING_AGE:
        # a serve that stopped steering (blind, stuck) still answers its last weights
        print(f"gpufleet act: weights not applied: the advice's steering was computed "
              f"{age:.0f} s ago, over {MAX_STEERING_AGE:.0f} s", file=sys.stderr)
        return 1
    try:
        actor = WeightActor(args.mode, Path(args.audit_log), sys.stdout, args.scontrol,
                            args.weights_per_minute, notes=sys.stderr)
        records = actor.apply(wanted, computed_at)
    except WeightError as exc:
        raise UsageError(f"weights: {exc}") from None
    return 1 if any(r["outcome"] == "failed" for r in records) else 0
