"""The default simulated fleet's /metrics, byte for byte, against tests/golden/metrics.txt.

A difference is either a bug or an intended change: then run ``make generate`` and
commit the new golden file, whose diff shows the change in review.
"""

from __future__ import annotations

import difflib
import subprocess

from tests.helpers import require_binary
from tests.helpers.golden_metrics import GOLDEN, render_golden


def test_exposition_matches_the_golden_file():
    rendered, golden = render_golden(), GOLDEN.read_bytes()
    if rendered != golden:
        diff = difflib.unified_diff(golden.decode().splitlines(), rendered.decode().splitlines(),
                                    "tests/golden/metrics.txt", "rendered now", lineterm="", n=1)
        shown = "\n".join(line for _, line in zip(range(80), diff, strict=False))
        raise AssertionError(f"/metrics differs from the golden file (make generate updates it):\n{shown}")


def test_golden_exposition_passes_promtool_check_metrics():
    """Prometheus naming conventions (units, _total, _info), with no allowlist."""
    done = subprocess.run([require_binary("promtool"), "check", "metrics"], input=GOLDEN.read_bytes(),
                          capture_output=True, timeout=60)
    assert done.returncode == 0 and not done.stdout and not done.stderr, done.stdout + done.stderr


def test_golden_covers_every_kind_of_series():
    text = GOLDEN.read_text()
    for family in ("gpufleet_gpu_utilization_ratio", "gpufleet_gpu_mig_instance_info",
                   "gpufleet_pool_fragmentation_index", "gpufleet_advisor_decision_info",
                   "gpufleet_source_up", "gpufleet_build_info"):
        assert f"\n# TYPE {family} " in text
    assert text.count("\ngpufleet_gpu_up{") == 1088  # the reference fleet: 136 nodes x 8 GPUs
