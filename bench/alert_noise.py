"""Alert noise: pages and notifications the simulated fleet causes, per scenario (issue 15).

Replays the simulator at ``--speed`` (60: a simulated hour per wall minute) under a
real Prometheus and Alertmanager running the rules ``gpufleet rules --time-scale 1/speed``
writes (every ``for``, range window and offset scaled together) and the committed routing
with Alertmanager's timers scaled by the same factor, and prints per run:

- pages (incidents at the pager) and which alerts paged, each with its latency from
  the scenario's start against the bound "the alert's `for` + 2 evaluation intervals";
- human notifications (pager and tickets POSTs, resolved and repeats included), ticket
  groups, and the most alerts one notification carried;
- the alerts firing at the end, by name.

Runs: the default fleet for ``--hours`` (budget: 0 pages, at most 10 notifications);
each page-worthy scenario alone (exactly one page, in time); every scenario together
(one page per page-worthy fault; tickets grouped per pool or account). Figures go in
docs/performance.md ("Alert noise (issue 15)").

Usage: ``.venv/bin/python bench/alert_noise.py [--speed 60] [--hours 2] [--alone-hours 0.75]
[--interval 1] [--no-health] [--default-only]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.noise import NoiseRun, known_faults, page_deadline, replay  # noqa: E402

START_AFTER = 600.0  # simulated seconds before the scenarios start


def _report(run: NoiseRun, interval: float) -> bool:
    ok = True
    print(f"\n## {run.label}: {run.sim_seconds / 3600:g} simulated h at speed {run.speed:g}")
    print(f"pages (incidents): {run.pages}   pager POSTs: {run.notifications['pager']}   "
          f"ticket POSTs: {run.notifications['tickets']}   human notifications: "
          f"{run.human_notifications}   ticket groups: {len(run.ticket_groups)} "
          f"(grouped by {dict(run.ticket_grouping)})   advisor POSTs: "
          f"{run.notifications['gpufleet-advisor']}   most alerts in one notification: "
          f"{run.largest_notification}   failed scrapes: {run.failed_scrapes} of {run.scrapes}")
    for name, at in sorted(run.paged.items(), key=lambda item: item[1]):
        if name in run.pending_rules:
            bound = page_deadline(run, name, START_AFTER, interval)
            latency = at - START_AFTER
            within = at <= bound
            ok &= within
            print(f"  paged {name} ({run.page_alerts[name]} alert(s)) {latency:.0f} s after the "
                  f"scenario started; bound {bound - START_AFTER:.0f} s "
                  f"({'within' if within else 'LATE'})")
        else:
            print(f"  paged {name} at {at:.0f} s (not a paging rule!)")
            ok = False
    print(f"firing at the end: {dict(sorted(run.firing_at_end.items()))}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--speed", type=float, default=60.0)
    parser.add_argument("--hours", type=float, default=2.0, help="simulated hours per long run")
    parser.add_argument("--alone-hours", type=float, default=0.75,
                        help="simulated hours per single-scenario run")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="scrape, evaluation and collection interval, wall seconds")
    parser.add_argument("--no-health", action="store_true",
                        help="without the simulator's health and performance values (a third "
                        "of the series), for a machine that cannot scrape them every interval")
    parser.add_argument("--default-only", action="store_true",
                        help="only the default fleet's run (the budget), not the scenarios")
    args = parser.parse_args()
    faults = () if args.default_only else known_faults()
    verdicts: list[tuple[str, bool]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpufleet-noise-") as tmp:
        base = Path(tmp)
        run = replay(base / "default", "default fleet", (), args.speed, args.hours,
                     START_AFTER, args.interval, health=not args.no_health)
        _report(run, args.interval)
        verdicts.append(("default fleet: 0 pages, <= 10 notifications",
                         run.pages == 0 and run.human_notifications <= 10))
        for fault in faults:
            if fault.pages is None:
                continue
            run = replay(base / fault.name, f"{fault.name} alone", (fault,), args.speed,
                         args.alone_hours, START_AFTER, args.interval, health=not args.no_health)
            in_time = _report(run, args.interval)
            verdicts.append((f"{fault.name} alone: exactly one page ({fault.pages}), in time",
                             run.pages == 1 and set(run.paged) == {fault.pages}
                             and run.page_alerts[fault.pages] == 1 and in_time))
        if args.default_only:
            return _verdicts(verdicts, started)
        run = replay(base / "all", "every scenario together", faults, args.speed, args.hours,
                     START_AFTER, args.interval, health=not args.no_health)
        _report(run, args.interval)  # latencies shown; the bound is the single-fault runs'
        expected = {f.pages for f in faults if f.pages}
        verdicts.append((f"together: one page per page-worthy fault ({len(expected)})",
                         run.pages == len(expected) and set(run.paged) == expected
                         and all(run.page_alerts[name] == 1 for name in expected)))
        verdicts.append(("together: every ticket grouped per pool or account",
                         run.ticket_grouping["other"] == 0))
    return _verdicts(verdicts, started)


def _verdicts(verdicts: list[tuple[str, bool]], started: float) -> int:
    print(f"\n## verdicts ({time.monotonic() - started:.0f} s wall)")
    for what, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
