"""``gpufleet act``'s work: take remediation events to Slurm or Kubernetes, staged and logged.

Modes, from the safest:

- ``observe``: log each event and what it would do; nothing is read from or sent to the
  scheduler;
- ``dry-run``: print the exact command (Slurm) or patch (Kubernetes; the node is read, not
  written) and change nothing;
- ``act``: run it. Slurm: ``scontrol`` (a resume only for a node whose drain reason is
  gpufleet's). Kubernetes: GET the node, PATCH it guarded by its resourceVersion, and on
  409 Conflict read it again and retry, at most ``max_conflict_retries`` times.

Every event goes to the audit log, one JSON object a line. In ``act`` mode an event whose
id the log already records as done is skipped, so replaying the store or restarting
``gpufleet act`` does not act twice. Pages, resets and replacements are logged (and
printed) only: they are for a human.

Order: per node, an event decided before the newest drain or resume already taken for that
node (its ``at``; taken: in ``act`` mode, as the audit log records, or earlier in this run)
is refused, said in the audit record and on stderr: a drain that arrives after the resume
that undid it would take a repaired node out of service again.

Slurm: before acting, ``scontrol show node -o NAME`` must answer exactly one node, named
NAME; a NodeSet or any name Slurm expands to several nodes is refused.

Files: the events are read a line at a time, each line bounded while it is read
(:func:`bounded_lines`), so ``/dev/zero`` or an endless line is a one-line error; the audit
log must be a regular file (a FIFO is refused, never waited on).
"""

from __future__ import annotations

import json
import math
import ssl
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from exporter import http_client, slurm_command
from exporter.health.remediation import (
    Action,
    Drain,
    Event,
    Page,
    Resume,
    decode_event,
    encode_event,
    event_id,
)
from exporter.health.render import (
    MERGE_PATCH,
    REASON_PREFIX,
    RenderError,
    kubernetes_patch,
    node_name,
    slurm_argv,
    slurm_command_text,
)

MODES = ("observe", "dry-run", "act")
BACKENDS = ("slurm", "kubernetes")
MAX_EVENT_BYTES = 64 * 1024  # one event is ~200 bytes; a longer line is not one
MAX_AUDIT_LINE_BYTES = 4 * MAX_EVENT_BYTES  # a record is its event and a few words more
MAX_RESPONSE_BYTES = 4 * 1024 * 1024  # a Node with every image listed is ~100 KB


class ActError(Exception):
    """The scheduler refused or could not be reached: one line for the audit log."""


class Conflict(ActError):
    """409: the node changed since it was read."""


@dataclass(frozen=True, slots=True)
class KubernetesApi:
    """The few calls ``act`` makes: GET a node, PATCH it with a merge patch."""

    server: str  # https://host:6443
    token: str | None = None
    ca_file: str | None = None
    timeout: float = 10.0

    def _call(self, method: str, path: str, body: bytes | None = None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            headers["Content-Type"] = MERGE_PATCH
        where = f"{method} {path}"
        try:
            context = ssl.create_default_context(cafile=self.ca_file) \
                if self.server.startswith("https") else None
            # never redirected: the token goes to this apiserver only, and the patch is built
            # from its answer, not from whatever host a 3xx names
            answer = http_client.fetch(method, self.server.rstrip("/") + path, body=body,
                                       headers=headers, timeout=self.timeout, context=context,
                                       max_bytes=MAX_RESPONSE_BYTES)
        except http_client.AnswerTooLarge as exc:
            raise ActError(f"{where}: {exc}") from None
        except (OSError, ValueError) as exc:  # URLError, ssl.SSLError, TimeoutError: OSErrors
            raise ActError(f"{where}: {exc}") from None
        if answer.status in http_client.REDIRECTS:
            raise ActError(f"{where}: {http_client.redirect_refused(answer.status)}")
        if not 200 <= answer.status < 300:
            message = _status_message(answer.body) or _one_line(answer.reason)
            if answer.status == 409:
                raise Conflict(f"409 Conflict: {message}")
            raise ActError(f"{where}: HTTP {answer.status}: {message}")
        try:
            node = json.loads(answer.body)
        except ValueError as exc:
            raise ActError(f"{where}: not JSON: {exc}") from None
        if not isinstance(node, dict):
            raise ActError(f"{where}: not a JSON object")
        return node

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/nodes/{name}")

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", f"/api/v1/nodes/{name}", json.dumps(patch).encode())


def _status_message(body: bytes) -> str:
    """A Status answer's message, as one line of at most 300 characters (the apiserver's
    text goes into the audit log and onto stderr)."""
    try:
        message = json.loads(body).get("message", "")
    except (ValueError, AttributeError, RecursionError):
        return ""
    return _one_line(message if isinstance(message, str) else str(message))


def _one_line(text: str) -> str:
    flat = " ".join("".join(c if c.isprintable() else " " for c in text[:1000]).split())
    return flat if len(flat) <= 300 else flat[:297] + "..."


@dataclass
class Actor:
    backend: str  # slurm | kubernetes
    mode: str  # observe | dry-run | act
    audit_path: Path | None  # None: no audit log (``gpufleet plan`` only prints)
    out: TextIO  # where dry-run prints the command or patch, and nothing else
    api: KubernetesApi | None = None
    scontrol: str = "scontrol"
    max_conflict_retries: int = 5
    clock: Callable[[], float] = time.time
    env: dict[str, str] | None = None  # scontrol's environment (SLURM_CONF); None: inherited
    notes: TextIO = sys.stderr  # pages and advice without a command, for the operator
    prog: str = "gpufleet act"  # names the command in the notes

    def __post_init__(self) -> None:
        self.done: set[str] = set()  # ids the audit log records as done in act mode
        # per node, the newest drain or resume taken: (its at in ms, its id)
        self.newest: dict[str, tuple[int, str]] = {}
        if self.audit_path is not None:
            self._read_audit(self.audit_path)

    def _read_audit(self, path: Path) -> None:
        """What the audit log says was done and taken in act mode; ActError (one line) for a
        log that is not a regular file."""
        for record in slurm_command.audit_records(path, MAX_AUDIT_LINE_BYTES, ActError):
            if record.get("mode") == "act":
                self._recorded(record)

    def _recorded(self, record: dict[str, Any]) -> None:
        if record.get("outcome") == "done":
            self.done.add(str(record.get("id")))
        event = record.get("event")
        if record.get("type") in ("drain", "resume") and record.get("outcome") != "refused" \
                and isinstance(event, dict) and isinstance(event.get("node"), str) \
                and isinstance(event.get("at"), int | float) and not isinstance(event["at"], bool):
            self._taken(event["node"], event["at"], str(record.get("id")))

    def _taken(self, node: str, at: float, ident: str) -> None:
        if not math.isfinite(at):  # not an order: an event decoded from JSON has a finite at
            return
        at_ms = round(at * 1000)
        if node not in self.newest or at_ms > self.newest[node][0]:
            self.newest[node] = (at_ms, ident)

    def _stale(self, event: Action) -> str | None:
        """The id of the newer drain or resume already taken for the event's node, if any."""
        newest = self.newest.get(event.node)
        if newest is None or not math.isfinite(event.at):
            return None
        return newest[1] if round(event.at * 1000) < newest[0] else None

    def _audit(self, event: Event, outcome: str, **detail: Any) -> dict[str, Any]:
        record = {"time": self.clock(), "id": event_id(event), "type": type(event).__struct_config__.tag,
                  "backend": self.backend, "mode": self.mode, "outcome": outcome, **detail,
                  "event": json.loads(_encode(event))}
        if self.audit_path is not None:
            _append(self.audit_path, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        return record

    def handle(self, event: Event) -> dict[str, Any]:
        """Do what the mode says with one event; the audit record written."""
        ident = event_id(event)
        if self.mode == "act" and ident in self.done:
            return self._audit(event, "skipped", detail="already done (audit log)")
        if isinstance(event, Page):
            print(f"{self.prog}: page for pool {event.pool}: {event.reason} "
                  f"({', '.join(event.nodes)})", file=self.notes)
            return self._audit(event, "advice", detail="a page: not acting on the pool")
        newer = self._stale(event)
        if newer is not None:
            detail = f"stale: decided before {newer}, already taken for this node"
            print(f"{self.prog}: {ident}: refused, {detail}", file=self.notes)
            return self._audit(event, "refused", detail=detail)
        try:
            record = self._slurm(event) if self.backend == "slurm" else self._kubernetes(event)
        except (ActError, RenderError) as exc:
            record = self._audit(event, "failed", error=str(exc))
        if record.get("outcome") == "done":
            self.done.add(ident)
        if isinstance(event, Drain | Resume):  # taken, even failed: a later one supersedes it
            self._taken(event.node, event.at, ident)
        return record

    def _slurm(self, event: Action) -> dict[str, Any]:
        argv = slurm_argv(event)
        if argv is None:
            print(f"{self.prog}: advice, no command: {_encode(event)}", file=self.notes)
            return self._audit(event, "advice")
        text = slurm_command_text(argv)
        if self.mode == "observe":
            return self._audit(event, "observed", command=text)
        if self.mode == "dry-run":
            print(text, file=self.out)
            return self._audit(event, "printed", command=text)
        shown = self._one_node(event.node)
        # an operator's drain is theirs: gpufleet neither overwrites its reason nor resumes it
        state = shown.partition(" State=")[2].partition(" ")[0]
        ours = f" Reason={REASON_PREFIX}" in shown
        if "State=RESUME" in argv and not ours:
            return self._audit(event, "skipped", command=text,
                               detail="not drained by gpufleet: left as it is")
        if "State=DRAIN" in argv and "DRAIN" in state and not ours:
            return self._audit(event, "skipped", command=text,
                               detail="already drained by someone else: their reason kept")
        self._run([self.scontrol, *argv[1:]])
        return self._audit(event, "done", command=text)

    def _one_node(self, name: str) -> str:
        return slurm_command.one_node(self.scontrol, name, self.env, ActError)

    def _run(self, argv: list[str]) -> str:
        return slurm_command.run(argv, self.env, ActError)

    def _kubernetes(self, event: Action) -> dict[str, Any]:
        if self.mode == "observe":
            return self._audit(event, "observed")
        api = self.api
        if api is None:
            raise ActError("--api-server is needed to read the node")
        node_name(event.node)  # before it goes into a URL
        for attempt in range(self.max_conflict_retries + 1):
            node = api.get_node(event.node)
            patch = kubernetes_patch(event, node)
            if patch is None:
                print(f"{self.prog}: advice, no patch: {_encode(event)}", file=self.notes)
                return self._audit(event, "advice")
            if self.mode == "dry-run":
                print(json.dumps(patch, sort_keys=True), file=self.out)
                return self._audit(event, "printed", patch=patch)
            try:
                api.patch_node(event.node, patch)
            except Conflict:
                continue
            return self._audit(event, "done", patch=patch, conflicts=attempt)
        raise ActError(f"409 Conflict {self.max_conflict_retries + 1} times: the node keeps "
                       "changing; try again later")


def _encode(event: Event) -> str:
    return encode_event(event).decode()


def _append(path: Path, data: bytes) -> None:
    slurm_command.append(path, data, ActError)


def bounded_lines(stream: BinaryIO, limit: int = MAX_EVENT_BYTES) -> Iterator[str]:
    """The lines of ``stream`` as text, each checked while it is read: ValueError naming the
    line for one longer than ``limit`` bytes (at most ``limit`` + 1 bytes are read for it) or
    not UTF-8."""
    number = 0
    while chunk := stream.readline(limit + 1):
        number += 1
        if len(chunk) > limit and not chunk.endswith(b"\n"):
            raise ValueError(f"line {number}: longer than {limit} bytes")
        try:
            line = chunk.decode()
        except UnicodeDecodeError:
            raise ValueError(f"line {number}: not UTF-8") from None
        yield line


def read_events(lines: Iterable[str]) -> Iterator[Event]:
    """Events from JSON lines (from a file: :func:`bounded_lines`); a bad line is a
    ValueError naming its line and key."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(line.rstrip("\r\n")) > MAX_EVENT_BYTES:
            raise ValueError(f"line {number}: longer than {MAX_EVENT_BYTES} bytes")
        try:
            yield decode_event(line)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None


__all__ = ["BACKENDS", "MODES", "ActError", "Actor", "Conflict", "KubernetesApi", "bounded_lines",
           "read_events"]
