"""The ``gpufleet`` command. Each subcommand lives in its own module with
``add_arguments(parser)`` and ``run(args) -> int``; this file only wires them.

Errors a user can fix (bad config, missing library, port in use) are printed
on one line with exit code 2 (config/usage) or 1 (runtime); no traceback
reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from exporter import __version__
from exporter.errors import ConfigError, UsageError
from exporter.extras import check_command, not_installed

log = logging.getLogger("gpufleet")

# name -> (module, one-line help). Modules are imported when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("exporter.cli.serve", "Serve /metrics for the fleet (simulated by default)."),
    "analyze": ("exporter.cli.analyze", "Measure fragmentation of a snapshot or the openb trace."),
    "rules": ("exporter.cli.rules", "Generate Prometheus rules from rules/thresholds.yaml."),
    "dashboards": ("exporter.cli.dashboards", "Generate the Grafana dashboards into dashboards/."),
    "replay": ("exporter.cli.replay", "Replay a pod trace by each placement policy: CSV and PNG."),
    "load": ("exporter.cli.load", "Replay hourly pool demand by each scaling policy: CSV and PNG."),
    "plan": ("exporter.cli.plan", "The advisor's plan as JSON, PodMigrationJobs or Evictions."),
    "act": ("exporter.cli.act", "Drain, resume or taint nodes from remediation events (Slurm, Kubernetes)."),
    "simulate": ("exporter.cli.simulate", "Replay the fleet over days per strategy: outcomes.csv and PNG."),
}


def _parser(command: str | None) -> argparse.ArgumentParser:
    """The parser, with only ``command``'s module imported (for its arguments).

    The other commands get a bare subparser that names them in ``--help``: their
    modules pull in numpy, aiohttp, grafanalib or matplotlib (0.5 s and more), which
    ``gpufleet --version`` and ``--help`` must not wait for.
    """
    parser = argparse.ArgumentParser(
        prog="gpufleet",
        description="Prometheus exporter, fragmentation analyzer and rebalancing advisor "
        "for heterogeneous GPU fleets.",
    )
    parser.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        if name != command:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        module = importlib.import_module(module_name)
        subparser = sub.add_parser(
            name, help=help_text, description=getattr(module, "DESCRIPTION", help_text),
            epilog=getattr(module, "EPILOG", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(subparser)
        subparser.set_defaults(_module=module, _parser=subparser)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand argv names: the first word not an option (the top level takes no values)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        # building the parser imports the command's module, which may read package data
        # (serve's --help lists defaults from the threshold table): its errors are one line too
        parser = _parser(_command(argv))
        # parse_args would report a subcommand's unknown flags with the top-level usage;
        # the subcommand's own parser reports them instead, with its usage
        args, extra = parser.parse_known_args(argv)
        if extra:
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command is None:
            parser.print_help()
            return 2
        check_command(args.command)  # a missing extra: one line now, not after the work
        return int(args._module.run(args) or 0)
    except (ConfigError, UsageError) as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # last line of defence: one line, never a traceback
        if (line := not_installed(exc, _command(argv))) is not None:  # numpy, imported where used
            print(f"gpufleet: {line}", file=sys.stderr)
            return 2
        log.debug("unhandled error", exc_info=True)
        print(f"gpufleet: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


__all__ = ["COMMANDS", "main"]
