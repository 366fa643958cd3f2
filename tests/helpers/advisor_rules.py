"""The planner ``gpufleet simulate --advisor-rule RULE`` gives the advisor: the rule read by
the command's own parser, the strategy built as a run builds it (the advisor's freedoms on)."""

from __future__ import annotations

import argparse

from exporter.advisor.advise import Planner
from exporter.cli import simulate as cli
from exporter.outcome_sim.run import make_strategy
from exporter.outcome_sim.sim import RunSettings


def simulated_planner(rule: str, advisor_interval: float | None = None) -> Planner:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert parser.parse_args(["--out", "x", "--advisor-rule", rule]).advisor_rule == rule
    settings = RunSettings(advisor_rule=rule) if advisor_interval is None else RunSettings(
        advisor_rule=rule, advisor_interval=advisor_interval)
    advisor = make_strategy("steer-pod+advisor-freedoms", settings).advisor  # type: ignore[attr-defined]
    advisor._setup()
    planner = advisor._stages[1].planner
    assert isinstance(planner, Planner)
    return planner
