"""``gpufleet act --preemption``: the advice's victims taken to Slurm, under remediation's modes
and an hourly budget, every one in the audit log.

Modes as remediation's (:mod:`exporter.health.act`): ``observe`` logs what it would do and
touches nothing; ``dry-run`` prints the exact command; ``act`` runs ``scontrol requeue JOB``
(or ``suspend``, the site's ``PreemptMode``). A victim whose record (the advice's head, the
job, the advice's time) the audit log already holds as done is skipped, so replaying an
advice does not preempt twice; at most ``per_hour`` preemptions are done in any hour (the
rest wait for the next run); an advice computed more than ``max_age`` seconds ago is
refused: the fleet it judged has moved on.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from exporter import slurm_command
from exporter.preemption.advice import MODES, victims_from_json

AUDIT_TYPE = "preempt"
DEFAULT_PER_HOUR = 20
MAX_PER_HOUR = 10_000
MAX_AGE = 300.0  # seconds: the advisor evaluates every cycle; an older advice is a stuck one
MAX_AUDIT_LINE_BYTES = 64 * 1024
HOUR = 3600.0


class PreemptError(Exception):
    pass


@dataclass
class PreemptActor:
    mode: str  # observe | dry-run | act
    audit_path: Path | None
    out: TextIO
    scontrol: str = "scontrol"
    preempt_mode: str = "requeue"
    per_hour: int = DEFAULT_PER_HOUR
    env: dict[str, str] | None = None
    clock: Callable[[], float] = time.time
    notes: TextIO = field(default_factory=lambda: sys.stderr)
    done: set[str] = field(default_factory=set)  # ids done (act)
    done_at: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.preempt_mode not in MODES:
            raise PreemptError(f"PreemptMode {self.preempt_mode!r}: one of {', '.join(MODES)}")
        if self.audit_path is not None:
            for record in slurm_command.audit_records(self.audit_path, MAX_AUDIT_LINE_BYTES, PreemptError):
                if record.get("type") == AUDIT_TYPE and record.get("mode") == "act" \
                        and record.get("outcome") == "done":
                    at, ident = record.get("time"), record.get("id")
                    if isinstance(ident, str) and isinstance(at, int | float):
                        self.done.add(ident)
                        self.done_at.append(float(at))

    def _audit(self, ident: str, job: str, outcome: str, **detail: Any) -> dict[str, Any]:
        record = {"time": self.clock(), "id": ident, "type": AUDIT_TYPE, "backend": "slurm",
                  "mode": self.mode, "outcome": outcome, "job": job, "command": self.preempt_mode,
                  **detail}
        if self.audit_path is not None:
            slurm_command.append(self.audit_path, (json.dumps(record, separators=(",", ":")) + "\n").encode(),
                                 PreemptError)
        return record

    def apply(self, section: Any) -> list[dict[str, Any]]:
        """Each victim of the advice's ``preemption`` section preempted (or observed, printed);
        the audit records. Raises :class:`PreemptError` for a section that is not one."""
        try:
            victims = victims_from_json(section)
        except ValueError as exc:
            raise PreemptError(str(exc)) from None
        if not victims:
            return []
        computed_at = section.get("computed_at")
        if not isinstance(computed_at, int | float) or isinstance(computed_at, bool):
            raise PreemptError("preemption.computed_at: expected a number")
        now = self.clock()
        if now - computed_at > MAX_AGE:
            raise PreemptError(f"the advice's preemption was computed {now - computed_at:.0f} s ago, "
                               f"over {MAX_AGE:.0f} s: not acted on")
        odd = [v["job"] for v in victims if not slurm_command.is_job_id(v["job"])]
        if odd:  # the victims come from what nodes said of their jobs: act on Slurm's ids only
            raise PreemptError(f"preemption.preempt.victims: {odd[0][:60]!r} is not a Slurm job id; "
                               "not acted on")
        head = str(section["preempt"].get("head", ""))
        recent = sum(1 for at in self.done_at if now - HOUR < at <= now)
        budget = max(0, self.per_hour - recent) if self.mode == "act" else len(victims)
        records = []
        for victim in victims:
            job = victim["job"]
            ident = f"{AUDIT_TYPE}:{head}:{job}:{round(computed_at * 1000)}"
            argv = [self.scontrol, self.preempt_mode, job]
            if ident in self.done:
                records.append(self._audit(ident, job, "skipped", detail="done already"))
                continue
            if budget <= 0:
                records.append(self._audit(ident, job, "skipped", detail="over the hourly budget"))
                print(f"gpufleet act: {job}: over the budget of {self.per_hour} preemptions an hour: "
                      "left for the next run", file=self.notes)
                continue
            if self.mode == "observe":
                records.append(self._audit(ident, job, "observed"))
                print(f"{ident}: would scontrol {self.preempt_mode} {job} (for {head})", file=self.out)
            elif self.mode == "dry-run":
                records.append(self._audit(ident, job, "printed"))
                print(" ".join(["scontrol", self.preempt_mode, job]), file=self.out)
            else:
                try:
                    slurm_command.run(argv, self.env, PreemptError)
                except PreemptError as exc:
                    records.append(self._audit(ident, job, "failed", error=str(exc)))
                    continue
                budget -= 1
                self.done.add(ident)
                self.done_at.append(now)
                records.append(self._audit(ident, job, "done"))
        return records


__all__ = ["AUDIT_TYPE", "DEFAULT_PER_HOUR", "MAX_AGE", "MAX_PER_HOUR", "PreemptActor", "PreemptError"]
