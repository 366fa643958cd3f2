"""The tier rule (exporter/placement/tiers.py), one case per rule, on two fleets.

The reference fleet has A100, H100, H200 and B200; the second has no B200, as the
reference cluster's Kubernetes rules assume ("more than 80 GB goes to H200").
"""

from __future__ import annotations

import pytest

from exporter.gpu_catalogue import GB
from exporter.placement.tiers import TierFit, tier_fit, tier_models

REFERENCE = ("A100-80GB", "H100", "H200", "B200")
NO_B200 = ("A100-80GB", "H100", "H200")


@pytest.mark.parametrize(("need_gb", "models"), [
    (10, ("A100-80GB", "H100")),  # under 40 GB: A100 or H100
    (39.9, ("A100-80GB", "H100")),
    (40, ("H100",)),  # 40-80 GB: H100
    (80, ("H100",)),
    (80.1, ("H200",)),  # 80-120 GB: H200
    (120, ("H200",)),
    (130, ("B200",)),  # over 120 GB: B200
    (192, ("B200",)),
])
def test_reference_fleet(need_gb, models):
    assert tier_fit(need_gb * GB, REFERENCE) == TierFit(models, False)


@pytest.mark.parametrize(("need_gb", "fit"), [
    (30, TierFit(("A100-80GB", "H100"), False)),
    (100, TierFit(("H200",), False)),
    # no B200: 130 GB goes to H200 (141 GB holds it), flagged, not "nowhere"
    (130, TierFit(("H200",), True)),
    (141, TierFit(("H200",), True)),
    # more than any GPU of this fleet holds: nowhere, and no tier pretends otherwise
    (150, TierFit((), False)),
])
def test_fleet_without_b200(need_gb, fit):
    assert tier_fit(need_gb * GB, NO_B200) == fit


def test_a_missing_tier_moves_up_before_it_moves_down():
    # no H200: a 100 GB job goes up to B200, not down to H100 (80 GB would not hold it)
    assert tier_fit(100 * GB, ("H100", "B200")) == TierFit(("B200",), False)
    # no H100 either way up: a 60 GB job goes to H200
    assert tier_models(60 * GB, ("A100-80GB", "H200")) == ("H200",)


def test_the_jobs_allowed_models_narrow_the_tier():
    assert tier_models(30 * GB, REFERENCE, ("H100",)) == ("H100",)
    assert tier_models(100 * GB, REFERENCE, ("H100",)) == ()
    assert tier_fit(130 * GB, NO_B200, ("H200",)) == TierFit(("H200",), True)
