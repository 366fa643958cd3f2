"""The ``scaling:`` section of rules/thresholds.yaml (exporter/thresholds/scaling.py), read
through the table's loader."""

from __future__ import annotations

import pytest
import yaml

from exporter.thresholds import ScalingSettings, ThresholdError, load_thresholds, parse_thresholds
from tests.helpers import REPO

TABLE = (REPO / "rules" / "thresholds.yaml").read_text()


def with_scaling(section) -> str:
    raw = yaml.safe_load(TABLE)
    raw["scaling"] = section
    return yaml.safe_dump(raw)


def test_the_shipped_section_is_the_reference_profile():
    table = load_thresholds().scaling
    assert table is not None
    assert table.default == ScalingSettings(up=0.8, down=0.3, target=0.8, min_nodes=4, max_nodes=32,
                                            node_gpus=8, hysteresis=2, cooldown_up_s=3600.0,
                                            cooldown_down_s=10800.0, startup_s=3600.0,
                                            min_samples=30, dwell_s=300.0)


def test_pool_overrides_and_the_fleets_node_size():
    table = parse_thresholds(with_scaling({"up": 0.9, "pools": {"H800": {"max_nodes": 876},
                                                                "a10": {"node_gpus": 1}}})).scaling
    assert table is not None
    assert (table.default.up, table.default.target, table.default.max_nodes) == (0.9, 0.9, 32)
    h800 = table.for_pool("H800", node_gpus=4)
    assert (h800.up, h800.max_nodes, h800.node_gpus) == (0.9, 876, 4)
    assert table.for_pool("a10", node_gpus=8).node_gpus == 1  # the table's word wins
    assert table.for_pool("other").node_gpus == 8
    # issue 30: the bounds are the named pools' only; "other" is not autoscaled by the table
    assert (table.for_pool("other").min_nodes, table.for_pool("other").max_nodes) == (0, None)
    assert (table.for_pool("a10").min_nodes, table.for_pool("a10").max_nodes) == (4, 32)


def test_the_shipped_table_bounds_no_pool_of_the_default_fleet():
    table = load_thresholds().scaling
    assert table is not None and table.pools == ()
    h100 = table.for_pool("gpu-h100", node_gpus=8)
    assert (h100.min_nodes, h100.max_nodes, h100.idle_utilization, h100.memory_pressure) == \
        (0, None, 0.3, 0.85)


@pytest.mark.parametrize("section, key, message", [
    ({"up": 1.5}, "scaling.up", "must be a ratio in (0, 1]"),
    ({"down": 0.9}, "scaling", "need 0 < down < up"),
    ({"min_nodes": 40}, "scaling", "min_nodes <= max_nodes"),
    ({"cooldown_up": "soon"}, "scaling.cooldown_up", "must be a duration"),
    ({"startup": "30d"}, "scaling.startup", "at most 7d"),
    ({"hysteresis": True}, "scaling.hysteresis", "whole number"),
    ({"pools": {"H800": {"colour": 1}}}, "scaling.pools.H800.colour", "unknown key"),
    ({"pools": {"H800": {"max_nodes": 2}}}, "scaling.pools.H800", "min_nodes <= max_nodes"),
    ({"pools": []}, "scaling.pools", "must be a mapping"),
    ([], "scaling", "must be a mapping"),
    ({"mode": "psychic"}, "scaling.mode", "must be one of reactive, predictive"),
])
def test_bad_values_name_the_key(section, key, message):
    with pytest.raises(ThresholdError) as caught:
        parse_thresholds(with_scaling(section))
    text = str(caught.value)
    assert key in text and message in text and "\n" not in text


def test_mode():
    assert load_thresholds().scaling.mode == "reactive"
    assert parse_thresholds(with_scaling({"mode": "predictive"})).scaling.mode == "predictive"
