"""Remediation from verdicts (issue 31): drains within budgets, one page for a storm, resumes
after the clean window and the minimum drain time, resets once idle, replacements, and a
state that survives a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.health.remediation import (
    Drain,
    Event,
    Page,
    RemediationSettings,
    RemediationState,
    Remediator,
    Replace,
    ResetGpu,
    Resume,
    decode_event,
    encode_event,
    event_id,
    load_state,
    save_state,
)
from exporter.health.stragglers import StragglerSettings
from exporter.health.verdict import HealthSettings, HealthTracker
from exporter.snapshot import Allocation, Gpu
from tests.helpers.health import T0, gpu, job, snap, xid_gpu

VERDICTS = HealthSettings(critical_xids=(64, 79))


class Fleet:
    """A tracker and a remediator fed the same snapshots; ``nodes`` GPU 0 of each node."""

    def __init__(self, pools: dict[str, int], settings: RemediationSettings | None = None,
                 state: RemediationState | None = None) -> None:
        self.tracker = HealthTracker(VERDICTS)
        self.remediator = Remediator(settings or RemediationSettings(), state)
        self.gpus = {f"{pool}-{n}": gpu(f"{pool}-{n}", 0, pool)
                     for pool, count in pools.items() for n in range(count)}

    def tick(self, at: float, allocations: tuple[Allocation, ...] = (), **changes: Gpu) -> list[Event]:
        self.gpus.update(changes)
        snapshot = snap(T0 + at, *self.gpus.values(), allocations=allocations)
        return self.remediator.decide(self.tracker.observe(snapshot), snapshot)

    def xid(self, at: float, *nodes: str, code: int = 79) -> list[Event]:
        return self.tick(at, **{n: xid_gpu(n, 0, T0 + at, code, pool=self.gpus[n].pool) for n in nodes})


def drains(events: list[Event]) -> list[str]:
    return [e.node for e in events if isinstance(e, Drain)]


def pages(events: list[Event]) -> list[Page]:
    return [e for e in events if isinstance(e, Page)]


def test_one_xid_drains_its_node_with_the_reason():
    fleet = Fleet({"a": 8})
    assert fleet.tick(0) == []
    events = fleet.xid(30, "a-3")
    assert [e for e in events if isinstance(e, Drain)] == [Drain("a-3", "a", "XID 79 on GPU 0", T0 + 30)]
    assert fleet.tick(60) == [] and fleet.tick(90) == []  # drained once


def test_xid_on_every_node_of_a_pool_drains_none_and_pages_once():
    fleet = Fleet({"a": 4, "b": 4})
    fleet.tick(0)
    events = fleet.xid(30, "a-0", "a-1", "a-2", "a-3")
    assert drains(events) == []
    [page] = pages(events)
    assert (page.pool, page.nodes) == ("a", ("a-0", "a-1", "a-2", "a-3"))
    assert "leave fewer than 1 healthy" in page.reason
    later = [e for at in range(60, 1200, 30) for e in fleet.tick(at)]
    assert drains(later) == [] and pages(later) == []


def test_a_storm_arriving_node_by_node_drains_at_most_the_budget_and_pages_once():
    fleet = Fleet({"a": 8})  # 25 % of 8: two nodes at once
    fleet.tick(0)
    events = fleet.xid(30, "a-0") + fleet.xid(60, "a-1")
    assert drains(events) == ["a-0", "a-1"]
    storm = fleet.xid(90, "a-2", "a-3", "a-4")
    assert drains(storm) == [] and len(pages(storm)) == 1
    assert pages(storm)[0].nodes == ("a-2", "a-3", "a-4")
    more = fleet.xid(120, "a-5") + [e for at in range(150, 900, 30) for e in fleet.tick(at)]
    assert drains(more) == [] and pages(more) == []
    assert sorted(fleet.remediator.state.drained) == ["a-0", "a-1"]


def test_an_xid_reaching_every_node_of_a_pool_drains_at_most_the_budget_pages_once_and_keeps_a_healthy_node():
    """Must show (Budgets): XIDs arriving on every node of a pool, one node a tick, as a
    driver bug or a rack power event spreads. At every tick gpufleet has drained at most the
    pool's budget (25 % of 8) and left a healthy node in service; it pages once, for the
    storm, and never again while it lasts."""
    fleet = Fleet({"a": 8, "b": 8})
    fleet.tick(0)
    budget = 2
    events: list[Event] = []
    for n in range(8):
        at = 30.0 * (n + 1)
        events += fleet.xid(at, f"a-{n}")
        drained = [node for node in fleet.remediator.state.drained if node.startswith("a-")]
        healthy = [g.node for g in fleet.gpus.values()
                   if g.pool == "a" and g.health.xid_counts == () and g.node not in drained]
        assert len(drained) <= budget, (at, drained)
        assert healthy or not [e for e in events if isinstance(e, Drain) and e.at == T0 + at], at
    events += [e for at in range(270, 1800, 30) for e in fleet.tick(at)]
    assert drains(events) == ["a-0", "a-1"]
    [page] = pages(events)
    assert (page.pool, page.nodes) == ("a", ("a-2",))  # the first node over the budget
    assert sorted(fleet.remediator.state.drained) == ["a-0", "a-1"]
    # pool b is untouched, and a's storm did not spend b's budget
    assert drains(fleet.xid(1800, "b-0")) == ["b-0"]


def test_never_drains_a_pool_out_of_healthy_nodes():
    # two nodes, a budget of both: draining the failing one leaves the healthy one in service
    fleet = Fleet({"a": 2}, RemediationSettings(max_drained_pool_ratio=1.0))
    fleet.tick(0)
    assert drains(fleet.xid(30, "a-0")) == ["a-0"]
    # the other fails too: within the budget, but it would leave none healthy
    events = fleet.xid(60, "a-1")
    assert drains(events) == [] and len(pages(events)) == 1
    assert "leave fewer than 1 healthy" in pages(events)[0].reason
    # a pool of one node is never drained by gpufleet
    single = Fleet({"solo": 1})
    single.tick(0)
    events = single.xid(30, "solo-0")
    assert drains(events) == [] and pages(events)[0].pool == "solo"


def test_fleet_budget_and_rate_limit_span_pools():
    settings = RemediationSettings(max_drained_nodes=2, max_drains_per_window=10)
    fleet = Fleet({"a": 4, "b": 4, "c": 4}, settings)
    fleet.tick(0)
    events = fleet.xid(30, "a-0", "b-0", "c-0")
    assert drains(events) == ["a-0", "b-0"] and [p.pool for p in pages(events)] == ["c"]
    limited = Fleet({"a": 4, "b": 4, "c": 4}, RemediationSettings(max_drains_per_window=1))
    limited.tick(0)
    assert drains(limited.xid(30, "a-0")) == ["a-0"]
    events = limited.xid(60, "b-0")
    assert drains(events) == [] and [p.pool for p in pages(events)] == ["b"]
    # an hour after the first drain the window has room again
    assert drains(limited.tick(3630)) == ["b-0"]


def test_resume_after_the_clean_window_and_the_minimum_drain_time():
    fleet = Fleet({"a": 4})
    fleet.tick(0)
    assert drains(fleet.xid(30, "a-1")) == ["a-1"]
    clean = xid_gpu("a-1", 0, T0 + 30, pool="a")  # the same count: no new XID
    resumed: list[tuple[int, Event]] = []
    for at in range(60, 7200, 30):
        resumed += [(at, e) for e in fleet.tick(at, **{"a-1": clean}) if isinstance(e, Resume)]
    # healthy again at 60 + 900 s, but drained for at least an hour: resumed at 30 + 3600 s
    assert resumed == [(3630, Resume("a-1", "a", T0 + 30, T0 + 3630))]
    assert fleet.remediator.state.drained == {}


def test_a_flapping_gpu_is_not_resumed_while_it_keeps_failing():
    fleet = Fleet({"a": 4})
    fleet.tick(0)
    fleet.xid(30, "a-1")
    events: list[Event] = []
    for n, at in enumerate(range(600, 7200, 600)):  # a new XID every 10 min
        events += fleet.tick(at, **{"a-1": xid_gpu("a-1", 0, T0 + at, count=n + 2, pool="a")})
    assert [e for e in events if isinstance(e, Resume | Drain)] == []


def test_reset_once_the_gpu_is_idle_and_never_for_a_fault_that_needs_service():
    fleet = Fleet({"a": 4})
    fleet.tick(0)
    holding = (job("train", "a-1", 0),)
    events = fleet.tick(30, holding, **{"a-1": xid_gpu("a-1", 0, T0 + 30, pool="a")})
    assert drains(events) == ["a-1"] and not [e for e in events if isinstance(e, ResetGpu)]
    events = fleet.tick(60)  # the job is gone
    assert [e for e in events if isinstance(e, ResetGpu)] == [
        ResetGpu("a-1", "a", 0, "XID 79 on GPU 0", T0 + 60)]
    assert not [e for e in fleet.tick(90) if isinstance(e, ResetGpu)]
    service = Fleet({"a": 4})
    service.tick(0)
    events = service.xid(30, "a-2", code=64)
    assert drains(events) == ["a-2"] and not [e for e in events if isinstance(e, ResetGpu)]


def test_replace_a_node_with_three_faults_in_seven_days():
    settings = RemediationSettings(min_drain_seconds=0)
    fleet = Fleet({"a": 4}, settings)
    fleet.tick(0)
    replaced: list[Event] = []
    for day in range(3):
        start = day * 86400
        replaced += fleet.tick(start + 30, **{"a-1": xid_gpu("a-1", 0, T0 + start + 30,
                                                           count=day + 1, pool="a")})
        for at in range(start + 60, start + 2000, 300):
            replaced += fleet.tick(at)
    assert [e for e in replaced if isinstance(e, Replace)] == [
        Replace("a-1", "a", 3, 7 * 86400.0, T0 + 2 * 86400 + 30)]
    assert len([e for e in replaced if isinstance(e, Drain)]) == 3


def test_state_survives_a_restart_without_repeating_an_action(tmp_path: Path):
    path = tmp_path / "remediation.json"
    fleet = Fleet({"a": 4, "b": 2})
    fleet.tick(0)
    assert drains(fleet.xid(30, "a-0")) == ["a-0"]
    assert len(pages(fleet.xid(30, "b-0", "b-1"))) == 1
    save_state(fleet.remediator.state, path)
    restarted = Fleet({"a": 4, "b": 2}, state=load_state(path))
    restarted.gpus = fleet.gpus
    events = restarted.tick(60) + restarted.tick(90)
    assert events == []  # neither the drain nor the page again, no second fault counted
    assert restarted.remediator.state.faults == {"a-0": [T0 + 30], "b-0": [T0 + 30],
                                                 "b-1": [T0 + 30]}
    assert load_state(tmp_path / "missing.json") == RemediationState()


def test_a_bad_state_file_names_the_key(tmp_path: Path):
    path = tmp_path / "remediation.json"
    path.write_text('{"drained": {"n1": {"pool": "a", "reason": "x", "at": "yesterday"}}}')
    with pytest.raises(ValueError, match=r"Expected `float`, got `str` - at `\$.drained\[...\].at`"):
        load_state(path)


def test_events_round_trip_as_json_and_a_bad_one_names_the_key():
    events: list[Event] = [Drain("n1", "a", "XID 79 on GPU 3", T0), ResetGpu("n1", "a", 3, "x", T0),
                           Resume("n1", "a", T0, T0 + 3600), Replace("n1", "a", 3, 604800.0, T0),
                           Page("a", ("n1", "n2"), "storm", T0)]
    for event in events:
        assert decode_event(encode_event(event)) == event
    assert encode_event(events[0]) == \
        b'{"type":"drain","node":"n1","pool":"a","reason":"XID 79 on GPU 3","at":1764547200.0}'
    assert [event_id(e) for e in events[:2]] == ["drain:n1:1764547200000", "reset_gpu:n1/3:1764547200000"]
    with pytest.raises(ValueError, match=r"Object missing required field `reason`"):
        decode_event('{"type": "drain", "node": "n1", "pool": "a", "at": 1}')
    with pytest.raises(ValueError, match="Invalid value 'format_disk'"):
        decode_event('{"type": "format_disk"}')


def test_a_restarted_tracker_watches_a_drained_node_for_a_clean_window_before_resuming(tmp_path):
    path = tmp_path / "remediation.json"
    fleet = Fleet({"a": 4})
    fleet.tick(0)
    assert drains(fleet.xid(30, "a-1")) == ["a-1"]
    save_state(fleet.remediator.state, path)
    # hours later the advisor restarts: its new tracker sees no recent XID, so a-1 reads
    # healthy at once; it has seen nothing yet, so the node stays drained for a clean window
    restarted = Fleet({"a": 4}, state=load_state(path))
    restarted.gpus = fleet.gpus
    resumed = [(at, e) for at in range(7200, 9000, 30) for e in restarted.tick(at)
               if isinstance(e, Resume)]
    assert resumed == [(8100, Resume("a-1", "a", T0 + 30, T0 + 8100))]


def test_settings_out_of_bounds_name_their_key():
    with pytest.raises(ValueError, match=r"^health.clean_window_seconds: must be at least 0, got -1$"):
        HealthSettings(critical_xids=(79,), clean_window_seconds=-1)
    with pytest.raises(ValueError, match=r"^health.lost_for_seconds: must be at least 0, got nan$"):
        HealthSettings(critical_xids=(79,), lost_for_seconds=float("nan"))
    with pytest.raises(ValueError,
                       match=r"^remediation.max_drained_pool_ratio: must be from 0 to 1, got 1.5$"):
        RemediationSettings(max_drained_pool_ratio=1.5)
    with pytest.raises(ValueError, match=r"^remediation.replace_after_faults: must be at least 1, got 0$"):
        RemediationSettings(replace_after_faults=0)
    with pytest.raises(ValueError, match=r"^stragglers.min_job_gpus: must be at least 3, got 2$"):
        StragglerSettings(min_job_gpus=2)
