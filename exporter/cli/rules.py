"""``gpufleet rules``: generate Prometheus rules from the threshold table.

The table is validated whole and every file is rendered in memory before
anything is written, so a bad table leaves the output folder untouched. Files
are replaced atomically (write beside, then rename): a reader never sees half
a rule file. ``--check`` writes nothing and exits 1 naming the files that
differ, for CI and the drift test.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
from pathlib import Path

from exporter.alerting.rules import FORMATS, generate
from exporter.errors import UsageError
from exporter.generated import check_or_write
from exporter.thresholds import CHECKOUT_TABLE, DEPLOYMENTS, ThresholdError, command_table
from exporter.validate import flag_number

DESCRIPTION = (
    "Generate Prometheus alerting and recording rules (or a Kubernetes PrometheusRule) "
    "from the threshold table."
)
EPILOG = (
    "files written:\n"
    "  --format prometheus      gpufleet-alerts.yaml, gpufleet-recording.yaml\n"
    "  --format prometheusrule  gpufleet-prometheusrule.yaml\n"
    "exit codes: 0 done (or up to date), 1 --check found differences, 2 bad table or flags"
)


MAX_SCALE = 1000.0  # a scaled `for` or window stays a duration Prometheus takes


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


# Kubernetes label syntax: an optional DNS-subdomain prefix and "/", then a name of at most
# 63 characters (alphanumerics, "-", "_", "." inside); a value is empty or such a name.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"({_LABEL_NAME})?")


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE, got {text!r}")
    if not _LABEL_KEY.fullmatch(key):
        raise argparse.ArgumentTypeError(f"{key!r} is not a Kubernetes label key")
    if not _LABEL_VALUE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Kubernetes label value")
    return key, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--thresholds", metavar="FILE",
                        help=f"the threshold table (default {CHECKOUT_TABLE} if the current "
                             "folder has one, else the table installed with gpufleet)")
    parser.add_argument("--out", metavar="DIR",
                        help="folder to write into (default: the threshold table's folder; "
                             "required with the installed table)")
    parser.add_argument("--format", choices=FORMATS, default="prometheus",
                        help="plain Prometheus rule files, or one Kubernetes PrometheusRule "
                             "(default prometheus)")
    parser.add_argument("--deployment", choices=DEPLOYMENTS,
                        help="rules for a deployment that runs this mode alone: they watch only "
                             "its scrape job (the table's exporter_jobs by mode), so the job of "
                             "the mode you do not run never pages as GpufleetJobDown (default: "
                             "every job of the table)")
    parser.add_argument("--for-scale", type=_scale, default=1.0, metavar="FACTOR",
                        help="multiply every `for` by FACTOR (e.g. 0.01), for end-to-end tests; "
                             "the header of each file says so")
    parser.add_argument("--time-scale", type=_scale, default=1.0, metavar="FACTOR",
                        help="multiply every `for`, range window ([5m]) and offset by FACTOR, "
                             "for rules run in simulated time (a replay at speed 20: 0.05); "
                             "scale Alertmanager's group_wait, group_interval and "
                             "repeat_interval by the same FACTOR")
    parser.add_argument("--label", type=_label, action="append", default=[], metavar="KEY=VALUE",
                        help="a label on the PrometheusRule object, repeatable; e.g. "
                             "release=kube-prometheus-stack, which that chart's default "
                             "ruleSelector needs (docs/deploy.md)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the files in --out that differ from "
                             "what the table generates")


def run(args: argparse.Namespace) -> int:
    for flag, scale in (("--for-scale", args.for_scale), ("--time-scale", args.time_scale)):
        # 1e308 scaled a duration past a float: OverflowError, exit 1
        flag_number(scale, flag, 0, MAX_SCALE, above=True)
    thresholds, folder = command_table(args.thresholds)  # ThresholdError: one line, exit 2
    if args.deployment is not None:
        try:
            thresholds = thresholds.for_deployment(args.deployment)
        except ThresholdError as exc:
            raise UsageError(f"--deployment {args.deployment}: {exc}") from None
    out = Path(args.out) if args.out else folder
    if out is None:
        raise UsageError(f"--out DIR is required here: there is no {CHECKOUT_TABLE} in the "
                         "current folder, so the table installed with gpufleet is used")
    if args.label and args.format != "prometheusrule":
        raise UsageError("--label: only with --format prometheusrule (it labels the "
                         "PrometheusRule object; plain rule files have no object labels)")
    files = generate(thresholds, args.format, args.for_scale, dict(args.label),
                     time_scale=args.time_scale)
    return check_or_write({f.name: f.text for f in files}, out, check=args.check,
                          what="rule files", command=fix_command(args))


def fix_command(args: argparse.Namespace) -> str:
    """The command that rewrites what ``--check`` found stale: this one, with the same
    table, folder, format, scales and labels, without ``--check`` (issue 29: "run `gpufleet
    rules`" alone would write the plain rule files, not the PrometheusRule that drifted).

    >>> fix_command(argparse.Namespace(thresholds=None, out="rules", format="prometheusrule",
    ...     deployment=None, for_scale=1.0, time_scale=1.0, label=[("release", "kps")],
    ...     check=True))
    'gpufleet rules --out rules --format prometheusrule --label release=kps'
    """
    words = ["gpufleet", "rules"]
    if args.thresholds is not None:
        words += ["--thresholds", args.thresholds]
    if args.out:
        words += ["--out", args.out]
    if args.format != "prometheus":
        words += ["--format", args.format]
    if args.deployment is not None:
        words += ["--deployment", args.deployment]
    if args.for_scale != 1.0:
        words += ["--for-scale", f"{args.for_scale:g}"]
    if args.time_scale != 1.0:
        words += ["--time-scale", f"{args.time_scale:g}"]
    for key, value in args.label:
        words += ["--label", f"{key}={value}"]
    return shlex.join(words)
