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
id the log already records as done is skipped, so replaying the outbox or restarting
``gpufleet act`` does not act twice. Pages, resets and replacements are logged (and
printed) only: they are for a human.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from exporter import http_client
from exporter.health.remediation import Action, Event, Page, decode_event, encode_event, event_id
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
        self.done = self._done_ids()

    def _done_ids(self) -> set[str]:
        done: set[str] = set()
        if self.audit_path is None or not self.audit_path.exists():
            return done
        for line in self.audit_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            if isinstance(record, dict) and record.get("outcome") == "done" and record.get("mode") == "act":
                done.add(str(record.get("id")))
        return done

    def _audit(self, event: Event, outcome: str, **detail: Any) -> dict[str, Any]:
        record = {"time": self.clock(), "id": event_id(event), "type": type(event).__struct_config__.tag,
                  "backend": self.backend, "mode": self.mode, "outcome": outcome, **detail,
                  "event": json.loads(_encode(event))}
        if self.audit_path is not None:
            with self.audit_path.open("a") as log:
                log.write(json.dumps(record, separators=(",", ":")) + "\n")
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
        try:
            record = self._slurm(event) if self.backend == "slurm" else self._kubernetes(event)
        except (ActError, RenderError) as exc:
            return self._audit(event, "failed", error=str(exc))
        if record.get("outcome") == "done":
            self.done.add(ident)
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
        # an operator's drain is theirs: gpufleet neither overwrites its reason nor resumes it
        shown = self._run([self.scontrol, "show", "node", "-o", event.node])
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

    def _run(self, argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                                  env=self.env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ActError(f"{argv[0]}: {exc}") from None
        if done.returncode != 0:
            command = " ".join([Path(argv[0]).name, *argv[1:3]])
            raise ActError(f"{command}: exit {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[:300]}")
        return done.stdout

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


def read_events(lines: Iterable[str]) -> Iterator[Event]:
    """Events from JSON lines; a bad line is a ValueError naming its line and key."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(line) > MAX_EVENT_BYTES:
            raise ValueError(f"line {number}: longer than {MAX_EVENT_BYTES} bytes")
        try:
            yield decode_event(line)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None


__all__ = ["BACKENDS", "MODES", "ActError", "Actor", "Conflict", "KubernetesApi", "read_events"]
