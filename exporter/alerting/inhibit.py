"""Alertmanager inhibit rules that follow from the threshold table.

deploy/alertmanager.yml holds the routing and the inhibit rules; those that a table row
implies are made here, from the row, so that the example configuration and the table cannot
disagree (tests/test_alerting_deploy.py compares them):

- a row with ``mutes_pages: true`` (GpuNodeDrained): while it fires on a node, every paging
  alert of the same node is muted. A drained node hurts no job; its fault paged once, and
  its ticket now tracks it, so GpuLost and GpuXidError stop re-paging every repeat interval.
"""

from __future__ import annotations

from typing import Any

from exporter.thresholds import Thresholds

# the labels that say "the same node": `cluster` keeps two clusters' gpu-001 apart; a label
# absent on both sides counts as equal, so an install without `cluster:` matches on the node
SAME_NODE = ("cluster", "node")


def inhibit_rules(thresholds: Thresholds) -> list[dict[str, Any]]:
    """The inhibit rules the table's rows imply, in the table's order."""
    return [{"source_matchers": [f'alertname="{row.alert}"'],
             "target_matchers": ['page="true"'],
             "equal": list(SAME_NODE)}
            for row in thresholds.alerts if row.mutes_pages]


__all__ = ["SAME_NODE", "inhibit_rules"]
