"""The advice's placement preferences taken to Slurm: ``scontrol update NodeName=X Weight=N``
(Slurm allocates the lowest weight first among the nodes that satisfy a job), staged like
the remediation (``gpufleet act``, :mod:`exporter.health.act`) and bounded.

Modes: ``observe`` prints what it would run, reading nothing from Slurm (the weights it
would change are those that differ from what gpufleet last set, by the audit log, or from
Slurm's default); ``dry-run`` reads every node's weight (``scontrol show node -o``) and
prints the exact commands; ``act`` runs them.

An operator's weight is theirs: a node is changed only while its current ``Weight`` is the
one gpufleet last set there (the audit log's last ``done`` weight for it) or Slurm's default
(1); any other is left as it is, and said. A lost audit log errs that way too: every weight
gpufleet set before looks like an operator's until it is back at the default.

Budget: at most ``per_minute`` updates in any 60 s, counted over the audit log's ``done``
weight records, so running ``gpufleet act`` every minute applies the biggest changes first
and the rest on the next runs; those left over are said on stderr, not queued.

Before each update, ``scontrol show node -o X`` must answer exactly the node X (a NodeSet,
or a name Slurm expands, is refused), and its weight is read again there.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from exporter import slurm_command
from exporter.advisor.steer import WEIGHT_BEST
from exporter.node_names import node_name_problem, shown

AUDIT_TYPE = "weight"
WINDOW_SECONDS = 60.0
DEFAULT_PER_MINUTE = 60
MAX_PER_MINUTE = 10_000
MAX_AUDIT_LINE_BYTES = 256 * 1024
MAX_SAID = 20  # nodes left alone, named one a line on stderr; the rest are counted
_WEIGHT = re.compile(r"(?:^| )Weight=(\d+)(?: |$)")


class WeightError(Exception):
    """Slurm refused or answered something else: one line for the audit log."""


def command_text(node: str, weight: int) -> str:
    return f"scontrol update NodeName={node} Weight={weight}"


def weight_in(line: str) -> int | None:
    """The ``Weight=`` of one ``scontrol show node -o`` line; None where it has none."""
    match = _WEIGHT.search(line)
    return int(match.group(1)) if match else None


@dataclass
class WeightActor:
    mode: str  # observe | dry-run | act
    audit_path: Path | None  # None: no audit log (``gpufleet plan`` only prints)
    out: TextIO  # dry-run's commands
    scontrol: str = "scontrol"
    per_minute: int = DEFAULT_PER_MINUTE
    env: dict[str, str] | None = None  # scontrol's environment (SLURM_CONF); None: inherited
    clock: Callable[[], float] = time.time
    notes: TextIO = field(default_factory=lambda: sys.stderr)  # read when built, not imported
    prog: str = "gpufleet act"
    ours: dict[str, int] = field(default_factory=dict)  # node -> the weight gpufleet last set
    done_at: list[float] = field(default_factory=list)  # when each update was done (act)

    def __post_init__(self) -> None:
        if self.audit_path is not None:
            self._read_audit(self.audit_path)

    def _read_audit(self, path: Path) -> None:
        for record in slurm_command.audit_records(path, MAX_AUDIT_LINE_BYTES, WeightError):
            if record.get("type") == AUDIT_TYPE and record.get("mode") == "act" \
                    and record.get("outcome") == "done":
                node, weight, at = record.get("node"), record.get("weight"), record.get("time")
                if isinstance(node, str) and isinstance(weight, int) and isinstance(at, int | float):
                    self.ours[node] = weight
                    self.done_at.append(float(at))

    def budget_left(self, now: float) -> int:
        recent = sum(1 for at in self.done_at if now - WINDOW_SECONDS < at <= now)
        return max(0, self.per_minute - recent)

    def _audit(self, node: str, weight: int, outcome: str, **detail: Any) -> dict[str, Any]:
        now = self.clock()
        # an id like the events' (type:node:ms), so a reader of the log can name each record
        record = {"time": now, "id": f"{AUDIT_TYPE}:{node}:{weight}:{round(now * 1000)}",
                  "type": AUDIT_TYPE, "backend": "slurm", "mode": self.mode,
                  "outcome": outcome, "node": node, "weight": weight, **detail}
        if self.audit_path is not None:
            _append(self.audit_path, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        return record

    def apply(self, wanted: Mapping[str, int], computed_at: float | None = None) -> list[dict[str, Any]]:
        """Take each node to its ``wanted`` weight, the biggest changes first, within the
        budget; the audit records of what was observed, printed, done, skipped or failed."""
        for node in wanted:
            if problem := node_name_problem(node):  # it goes into a command line
                raise WeightError(f"node: {shown(node)} {problem}")
        current = dict(self.ours) if self.mode == "observe" else self._all_weights()
        left_alone = []
        changes = []
        unknown = []
        for node, weight in wanted.items():
            now_weight = current.get(node, WEIGHT_BEST if self.mode == "observe" else None)
            if now_weight is None:
                unknown.append(node)
                continue
            if now_weight == weight:
                continue
            if not self._ours(node, now_weight):
                left_alone.append((node, now_weight))
                continue
            changes.append((node, weight, now_weight))
        changes.sort(key=lambda c: (-abs(c[1] - c[2]), c[0]))
        records = [self._audit(node, now_weight, "skipped", wanted=weight,
                               detail="weight not set by gpufleet: the operator's, left as it is")
                   for node, now_weight in left_alone
                   for weight in (wanted[node],)]
        self._say_left_alone(left_alone)
        if unknown:  # a Kubernetes node, or a name Slurm spells otherwise (an FQDN)
            print(f"{self.prog}: {len(unknown)} nodes of the advice are not Slurm's, left out: "
                  f"{', '.join(unknown[:MAX_SAID])}{' ...' if len(unknown) > MAX_SAID else ''}",
                  file=self.notes)
        budget = self.budget_left(self.clock()) if self.mode == "act" else self.per_minute
        for node, weight, previous in changes[:budget]:
            records.append(self._one(node, weight, previous, computed_at))
        if len(changes) > budget:
            print(f"{self.prog}: {len(changes) - budget} weight updates over the budget of "
                  f"{self.per_minute} a minute: left for the next run", file=self.notes)
        return records

    def _ours(self, node: str, weight: int) -> bool:
        return weight == WEIGHT_BEST or self.ours.get(node) == weight

    def _say_left_alone(self, left: list[tuple[str, int]]) -> None:
        for node, weight in left[:MAX_SAID]:
            last = self.ours.get(node)
            print(f"{self.prog}: {node}: Weight={weight} left as it is: not set by gpufleet "
                  f"(its last: {'none' if last is None else last})", file=self.notes)
        if len(left) > MAX_SAID:
            print(f"{self.prog}: {len(left) - MAX_SAID} more nodes' weights left as they are",
                  file=self.notes)

    def _one(self, node: str, weight: int, previous: int, computed_at: float | None) -> dict[str, Any]:
        text = command_text(node, weight)
        extra = {"previous": previous, "command": text, "computed_at": computed_at}
        if self.mode == "observe":
            print(f"weight {node}: would run: {text}", file=self.out, flush=True)
            return self._audit(node, weight, "observed", **extra)
        try:
            line = self._one_node(node)
            now_weight = weight_in(line)
            if now_weight is None:
                raise WeightError(f"scontrol show node {node}: no Weight= in its answer")
            if now_weight != previous and not self._ours(node, now_weight):
                return self._audit(node, weight, "skipped", **{**extra, "previous": now_weight},
                                   detail="weight changed by someone else meanwhile: left as it is")
            if self.mode == "dry-run":
                print(text, file=self.out, flush=True)
                return self._audit(node, weight, "printed", **extra)
            self._run([self.scontrol, "update", f"NodeName={node}", f"Weight={weight}"])
        except WeightError as exc:
            print(f"{self.prog}: {node}: {exc}", file=self.notes)
            return self._audit(node, weight, "failed", **extra, error=str(exc))
        self.ours[node] = weight
        record = self._audit(node, weight, "done", **extra)
        self.done_at.append(float(record["time"]))
        return record

    def _all_weights(self) -> dict[str, int]:
        weights = {}
        for line in self._run([self.scontrol, "show", "node", "-o"]).splitlines():
            name = line.split(" ", 1)[0].removeprefix("NodeName=") if line.startswith("NodeName=") else ""
            weight = weight_in(line)
            if name and weight is not None:
                weights[name] = weight
        return weights

    def _one_node(self, name: str) -> str:
        return slurm_command.one_node(self.scontrol, name, self.env, WeightError)

    def _run(self, argv: list[str]) -> str:
        return slurm_command.run(argv, self.env, WeightError)


def _append(path: Path, data: bytes) -> None:
    slurm_command.append(path, data, WeightError)


__all__ = ["DEFAULT_PER_MINUTE", "MAX_PER_MINUTE", "WeightActor", "WeightError", "command_text",
           "weight_in"]
