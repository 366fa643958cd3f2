"""``gpufleet dashboards``: generate the Grafana dashboards into ``dashboards/``.

Every dashboard is rendered in memory before anything is written, so a bad
threshold table leaves the folder untouched; each file is replaced
atomically (written beside, then renamed). ``--check`` writes nothing and
exits 1 naming the files that are missing or differ, for CI and reviewers.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from exporter.extras import require
from exporter.generated import check_or_write
from exporter.thresholds import CHECKOUT_TABLE, command_table

DEFAULT_OUT = "dashboards"

DESCRIPTION = (
    "Generate the Grafana dashboards (fleet overview, node drill-down, fragmentation) with "
    "grafanalib; their levels come from the threshold table."
)
EPILOG = (
    "files written: gpufleet-fleet.json, gpufleet-node.json, gpufleet-fragmentation.json\n"
    "exit codes: 0 done (or up to date), 1 --check found differences, 2 bad table or flags"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", metavar="DIR", default=DEFAULT_OUT,
                        help=f"folder to write into (default {DEFAULT_OUT})")
    parser.add_argument("--thresholds", metavar="FILE",
                        help=f"the threshold table the levels come from (default {CHECKOUT_TABLE} "
                             "if the current folder has one, else the table installed with gpufleet)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the files that are missing or differ")


def run(args: argparse.Namespace) -> int:
    require("grafanalib", "gpufleet dashboards")  # gpufleet[dashboards]
    from exporter.dashboards import render
    from exporter.dashboards.levels import levels_from_table

    files = render(levels_from_table(command_table(args.thresholds)[0]))
    return check_or_write(files, Path(args.out), check=args.check, what="dashboards",
                          command=fix_command(args))


def fix_command(args: argparse.Namespace) -> str:
    """The command that rewrites what ``--check`` found stale: the same table and folder."""
    words = ["gpufleet", "dashboards", "--out", str(args.out)]
    if args.thresholds is not None:
        words += ["--thresholds", args.thresholds]
    return shlex.join(words)
