"""``gpufleet dashboards``: generate the Grafana dashboards into ``dashboards/``.

Every dashboard is rendered in memory before anything is written, so a bad
threshold table leaves the folder untouched; each file is replaced
atomically (written beside, then renamed). ``--check`` writes nothing and
exits 1 naming the files that are missing or differ, for CI and reviewers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from exporter.dashboards import render
from exporter.dashboards.levels import load_levels

DEFAULT_OUT = "dashboards"
DEFAULT_THRESHOLDS = "rules/thresholds.yaml"

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
    parser.add_argument("--thresholds", metavar="FILE", default=DEFAULT_THRESHOLDS,
                        help=f"the threshold table the levels come from (default {DEFAULT_THRESHOLDS})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the files that are missing or differ")


def _differs(path: Path, text: str) -> bool:
    try:
        return path.read_bytes() != text.encode()
    except OSError:
        return True


def _write_atomically(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> int:
    files = render(load_levels(args.thresholds))
    out = Path(args.out)
    if args.check:
        stale = [name for name, text in files.items() if _differs(out / name, text)]
        if stale:
            print(f"gpufleet: out of date in {out}: {', '.join(stale)} "
                  f"(run `gpufleet dashboards --out {out}` and commit)", file=sys.stderr)
            return 1
        print(f"{len(files)} dashboards in {out} are up to date")
        return 0
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            _write_atomically(out / name, text)
    except OSError as exc:
        print(f"gpufleet: cannot write dashboards to {out}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {len(files)} dashboards to {out}: {', '.join(files)}")
    return 0
