"""``gpufleet simulate``: the event loop, the queue's order, gangs, move costs, the strategies.

Tiny fleets and hours, not days: every test runs in well under a second but the
advisor's (a few seconds).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools

import numpy as np
import pytest

from exporter.analysis.workload import Shape
from exporter.outcome_sim.cluster import Cluster, MoveCost
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.outcomes import COLUMNS, Outcome, write_csv
from exporter.outcome_sim.run import RunSettings, Sim, simulate, target_workload
from exporter.outcome_sim.scheduler import Scheduler, reserve
from exporter.outcome_sim.strategies import Consolidate, unblock
from exporter.outcome_sim.timeline import HourlyArrivals, Job, TimelineSettings, build
from exporter.snapshot import Gpu, Node


def tiny_fleet(nodes: int = 4, gpus: int = 8, models: tuple[str, ...] = ("H100",)) -> SimFleet:
    listed = tuple(Node(f"n{i}", models[i % len(models)], 64.0, f"pool-{models[i % len(models)]}",
                        "hopper", gpus) for i in range(nodes))
    shapes = (Shape(4, 1.0, 1), Shape(4, 1.0, 1), Shape(2, 0.5, 1), Shape(16, 1.0, 4), Shape(32, 1.0, 8),
              Shape(1, 0.0, 0))
    return SimFleet("tiny", listed, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                          for n in listed for i in range(n.gpu_count)), shapes)


SERIES = HourlyArrivals(np.array([3600.0 * 20, 3600.0 * 60, 3600.0 * 10, 3600.0 * 40] * 30),
                        np.array([20.0, 30.0, 10.0, 20.0] * 30))
SHORT = RunSettings(timeline=TimelineSettings(days=0.25, warmup_days=0.1, load=1.2, gang_share=0.5))


def job(id_: int, gpus: int, work: float, submit: float = 0.0, parts: int = 1, share: float = 1.0,
        high: bool = False, cpus: float = 1.0) -> Job:
    return Job(id_, submit, work, cpus, gpus, share, parts, (), high)


DEFAULT_COST = MoveCost()


def sim_of(fleet: SimFleet, mode: str = "fifo", cost: MoveCost = DEFAULT_COST) -> Sim:
    state = fleet.empty_state()
    workload = target_workload(fleet, state.model_names)
    cluster = Cluster(state, "bestfit", workload, cost)
    return Sim(fleet, cluster, Scheduler(cluster, mode), RunSettings(), workload)


# -- determinism and the timeline ---------------------------------------------------


def test_a_seed_gives_the_same_outcome_and_another_seed_another():
    fleet = tiny_fleet()
    first = simulate(fleet, SERIES, "none", 3, SHORT).row()
    again = simulate(fleet, SERIES, "none", 3, SHORT).row()
    other = simulate(fleet, SERIES, "none", 4, SHORT).row()
    for row in (first, again, other):
        row.pop("wall_seconds")
    assert first == again
    assert first != other
    assert first["jobs"] > 10 and first["jobs_started"] > 0


def test_the_load_sets_the_offered_gpu_hours():
    fleet = tiny_fleet()
    settings = TimelineSettings(days=2, warmup_days=0, load=0.8)
    jobs = build(list(fleet.shapes), SERIES, fleet.capacity, settings, 1)
    offered = sum(j.demand * j.work for j in jobs)
    capacity = fleet.capacity * settings.horizon
    # the last job of each hour overshoots its hour's share a little, never by a job's worth in all
    assert offered / capacity == pytest.approx(0.8, rel=0.05)
    assert all(a.submit <= b.submit for a, b in itertools.pairwise(jobs))
    # every gang comes from an 8-GPU shape, in 2 or 4 parts
    assert {j.parts for j in jobs if j.gpus == 8} <= {1, 2, 4}
    assert all(j.parts == 1 for j in jobs if j.gpus < 8)


# -- gangs --------------------------------------------------------------------------


def test_a_gang_starts_whole_or_not_at_all():
    sim = sim_of(tiny_fleet(nodes=3))
    cluster = sim.cluster
    blocker = job(0, 1, 1000)
    cluster.start(blocker, cluster.find(blocker), 0.0)  # one GPU taken on the first node
    before = cluster.placer.gpu_free.copy()
    gang = job(1, 8, 1000, parts=3)
    assert cluster.find(gang) is None  # two free nodes for three parts
    np.testing.assert_array_equal(cluster.placer.gpu_free, before)  # nothing left held
    pair = job(2, 8, 1000, parts=2)
    parts = cluster.find(pair)
    assert parts is not None and len(parts) == 2
    assert len({p.node for p in parts}) == 2 and 0 not in {p.node for p in parts}


def test_no_gang_ever_runs_in_part_during_a_run():
    fleet = tiny_fleet(nodes=6, models=("H100", "H200"))
    settings = dataclasses.replace(SHORT, timeline=dataclasses.replace(SHORT.timeline, load=1.5))
    jobs = build(list(fleet.shapes), SERIES, fleet.capacity, settings.timeline, 5)
    assert any(j.parts > 1 for j in jobs)
    simulate(fleet, SERIES, "consolidate", 5, settings, jobs=jobs)
    for j in jobs:
        assert len(j.placements) in (0, j.parts)
        if len(j.placements) > 1:
            models = {fleet.nodes[p.node].model for p in j.placements}
            assert len(models) == 1 and len({p.node for p in j.placements}) == j.parts


# -- the queue: FIFO with backfill, per-pod retry, priorities ------------------------


def scenario(mode: str) -> tuple[Sim, dict[str, Job]]:
    """One 8-GPU node, 4 GPUs busy until t=100; queued: an 8-GPU head, then a short and a
    long 2-GPU job behind it."""
    sim = sim_of(tiny_fleet(nodes=1), mode)
    running = job(0, 4, 100)
    sim.cluster.start(running, sim.cluster.find(running), 0.0)
    jobs = {"head": job(1, 8, 1000, submit=1), "short": job(2, 2, 50, submit=2),
            "long": job(3, 2, 500, submit=3)}
    for j in jobs.values():
        sim.scheduler.submit(j)
    return sim, jobs


def test_fifo_backfills_only_what_ends_before_the_heads_reservation():
    sim, jobs = scenario("fifo")
    started = sim.scheduler.run_pass(10.0)
    assert started == [jobs["short"]]  # ends at 60, before the head's shadow time 100
    reservation = sim.scheduler.reservation
    assert reservation is not None and (reservation.shadow, reservation.nodes) == (100.0, (0,))
    assert sim.scheduler.blocked is jobs["head"]
    # at 100 both running jobs are gone: the head starts, and the long one still waits behind it
    for j in sim.cluster.due(100.0):
        sim.cluster.stop(j)
    assert sim.scheduler.run_pass(100.0) == [jobs["head"]]
    assert jobs["long"].start is None


def test_per_pod_retry_lets_any_pod_that_fits_start_and_the_head_waits():
    sim, jobs = scenario("kube")
    started = sim.scheduler.run_pass(10.0)
    assert started == [jobs["short"], jobs["long"]]
    for j in sim.cluster.due(100.0):
        sim.cluster.stop(j)
    assert sim.scheduler.run_pass(100.0) == []  # the long one holds 2 GPUs until 510
    assert jobs["head"].start is None


def test_high_priority_jobs_go_first_whatever_their_submit_time():
    sim = sim_of(tiny_fleet(nodes=1))
    spot, high = job(1, 8, 100, submit=1), job(2, 8, 100, submit=5, high=True)
    sim.scheduler.submit(spot)
    sim.scheduler.submit(high)
    assert sim.scheduler.queue.jobs() == [high, spot]
    assert sim.scheduler.run_pass(6.0) == [high]


def test_a_job_that_fits_no_node_is_refused_at_submit():
    sim = sim_of(tiny_fleet(nodes=2))
    too_big = job(1, 8, 100, parts=3)
    sim.scheduler.submit(too_big)
    assert sim.scheduler.rejected == [too_big] and sim.scheduler.queue.size == 0


def test_reservation_of_a_gang_is_its_parts_latest_node():
    sim = sim_of(tiny_fleet(nodes=3))
    for i, end in enumerate((50.0, 300.0, 120.0)):
        j = job(10 + i, 1, end)
        sim.cluster.start(j, sim.cluster.find(j, exclude=[n for n in range(3) if n != i]), 0.0)
    found = reserve(sim.cluster, job(1, 8, 100, parts=2), 10.0)
    assert found.shadow == 120.0 and set(found.nodes) == {0, 2}


# -- what a move costs --------------------------------------------------------------


def test_a_move_loses_the_work_since_the_last_checkpoint_plus_the_restore():
    sim = sim_of(tiny_fleet(nodes=2), cost=MoveCost(checkpoint=900.0, restore=120.0))
    cluster = sim.cluster
    moving = job(1, 2, 10_000.0, share=0.5)
    cluster.start(moving, cluster.find(moving), 0.0)
    destination = cluster.find(moving, exclude=[moving.placements[0].node])
    cluster.move(moving, destination, 1000.0)
    demand = 2 * 0.5
    assert cluster.lost_gpu_seconds == pytest.approx((100 + 120) * demand)
    assert moving.done == 900.0 and moving.migrations == 1
    assert moving.end() == pytest.approx(1000 + 120 + 9100)
    assert moving.placements[0].node != 0 or destination[0].node == moving.placements[0].node
    # the overhead share of a run is the lost GPU-seconds over those delivered
    row = Outcome("x", 1, 1.0, gpu_hours_delivered=10.0, migration_overhead_pct=2.2).row()
    assert set(row) == set(COLUMNS)


def test_outcomes_csv_has_the_issues_columns(tmp_path):
    write_csv([Outcome("none", 1, 0.9)], tmp_path / "o.csv")
    header = (tmp_path / "o.csv").read_text().splitlines()[0].split(",")
    for column in ("strategy", "seed", "load", "jobs", "jobs_started", "gpu_hours_delivered",
                   "gpu_hours_waited", "wait_p50_s", "wait_p95_s", "wait_p95_s_whole_node",
                   "gpu_hours_waited_whole_node", "migrations", "migration_overhead_pct",
                   "mean_allocation_pct", "mean_fragmentation_index"):
        assert column in header, column


# -- consolidation ------------------------------------------------------------------


def test_consolidation_finds_the_fewest_verified_moves_and_leaves_the_fleet_as_it_was():
    """Two nodes each with one 1-GPU job: an 8-GPU job needs one of them moved, one move."""
    sim = sim_of(tiny_fleet(nodes=2))
    cluster = sim.cluster
    for i in range(2):
        j = job(10 + i, 1, 10_000)
        cluster.start(j, cluster.find(j, exclude=[1 - i]), 0.0)
    head = job(1, 8, 100)
    assert cluster.find(head) is None
    before = cluster.placer.gpu_free.copy()
    moves = unblock(sim, head, 10, 16)
    np.testing.assert_array_equal(cluster.placer.gpu_free, before)
    assert moves is not None and len(moves) == 1
    mover, destination = moves[0]
    assert destination[0].node != mover.placements[0].node
    sim.scheduler.submit(head)
    sim.scheduler.run_pass(1.0)
    Consolidate().tick(sim, 2.0)
    assert cluster.migrations == 1
    assert sim.scheduler.run_pass(2.0) == [head]


def test_consolidation_moves_nothing_when_the_fleet_is_simply_full():
    sim = sim_of(tiny_fleet(nodes=1))
    full = job(10, 8, 10_000)
    sim.cluster.start(full, sim.cluster.find(full), 0.0)
    head = job(1, 1, 100)
    assert unblock(sim, head, 10, 16) is None


# -- the advisor in the loop ---------------------------------------------------------


def test_the_advisor_runs_in_the_loop_and_is_deterministic():
    fleet = tiny_fleet(nodes=4)
    settings = dataclasses.replace(SHORT, advisor_interval=600.0)
    rows = [simulate(fleet, SERIES, name, 2, settings).row()
            for name in ("advisor", "advisor", "advisor-current")]
    for row in rows:
        row.pop("wall_seconds")
    assert rows[0] == rows[1]
    assert rows[0]["jobs"] == rows[2]["jobs"]


def test_bad_input_is_one_line_naming_the_flag(tmp_path, capsys):
    from exporter.cli import main

    assert main(["simulate", "--strategies", "none,bogus", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "gpufleet: --strategies: unknown bogus; choose from none, descheduler, consolidate, advisor, "
        "advisor-current, oracle, oracle-heads, consolidate-heads, consolidate-unrestricted, "
        "descheduler-unrestricted, steer, steer+advisor, "
        "steer-pod, steer-pod-flat, steer-pod-fresh, steer-pod+advisor, steer-pod+advisor-freedoms, "
        "steer-pod+lookahead, "
        "steer-pod+lookahead+advisor, steer-pod+reserve")
    assert main(["simulate", "--load", "0", "--out", str(tmp_path)]) == 2
    assert "--load: each must be in (0, 10]" in capsys.readouterr().err


def test_the_cli_lists_the_strategies_the_package_has():
    from exporter.cli.simulate import STRATEGY_NAMES
    from exporter.outcome_sim.strategies import STRATEGIES

    assert STRATEGY_NAMES == STRATEGIES


def test_the_advisors_snapshot_lists_every_running_job_as_it_runs_and_the_queue():
    from exporter.outcome_sim.advisor_loop import snapshot_of

    sim = sim_of(tiny_fleet(nodes=3))
    cluster = sim.cluster
    small, gang = job(1, 1, 5000, share=0.5, high=True), job(2, 8, 5000, parts=1)
    for j in (small, gang):
        cluster.start(j, cluster.find(j), 0.0)
    waiting = job(3, 8, 100, submit=5)
    sim.scheduler.submit(waiting)
    cache: dict = {}
    snap = snapshot_of(sim, 1000.0, cache)
    by_job = {a.job: a for a in snap.allocations}
    assert set(by_job) == {"1", "2"}
    assert by_job["1"].priority == 1000 and by_job["1"].placements[0].gpu_share == 0.5
    assert by_job["1"].last_checkpoint_time == 900.0  # 15-min checkpoints since it started at 0
    assert [p.job for p in snap.pending] == ["3"]
    # a job that moved is listed where it is now, not where the cache saw it
    cluster.move(small, cluster.find(small, exclude=[small.placements[0].node]), 1000.0)
    moved = {a.job: a for a in snapshot_of(sim, 1100.0, cache).allocations}["1"]
    assert moved.placements[0].node == small.placements[0].node_name
    assert moved.last_checkpoint_time == 1120.0  # its run restarted after the restore


def test_moving_for_the_blocked_head_cuts_whole_node_waiting_in_the_loop():
    """Load 0.9 on four nodes, no gangs: consolidation and the revised advisor move a few jobs
    so 8-GPU jobs start sooner; the moves' lost work is counted, and small."""
    fleet = tiny_fleet(nodes=4)
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.1, load=0.9, gang_share=0.0),
                           advisor_interval=600.0)
    rows = {name: simulate(fleet, SERIES, name, 1, settings) for name in ("none", "consolidate", "advisor")}
    assert rows["none"].migrations == 0 and rows["none"].migration_overhead_pct == 0.0
    for name in ("consolidate", "advisor"):
        moved = rows[name]
        assert moved.migrations > 0 and moved.plans > 0, name
        assert moved.gpu_hours_waited_whole_node < 0.7 * rows["none"].gpu_hours_waited_whole_node, name
        assert 0.0 < moved.migration_overhead_pct <= 5.0, name


def test_the_command_writes_outcomes_and_the_timeline(tmp_path, capsys):
    from exporter.cli import main

    argv = ["simulate", "--days", "0.1", "--warmup-days", "0", "--load", "0.9", "--seeds", "1",
            "--strategies", "none,descheduler", "--out", str(tmp_path)]
    assert main(argv) == 0
    lines = (tmp_path / "outcomes.csv").read_text().splitlines()
    assert lines[0].split(",")[:3] == ["strategy", "seed", "load"]
    assert [line.split(",")[:3] for line in lines[1:]] == [["none", "1", "0.9000"],
                                                           ["descheduler", "1", "0.9000"]]
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    assert "2 runs in" in capsys.readouterr().out


def test_the_advisor_strategies_are_the_engines_two_rules_and_the_knob_reaches_the_snapshot():
    from exporter.outcome_sim.advisor_loop import PENDING_LISTED, snapshot_of
    from exporter.outcome_sim.run import make_strategy

    revised = make_strategy("advisor", RunSettings())
    current = make_strategy("advisor-current", RunSettings())
    by_model = make_strategy("advisor", RunSettings(advisor_one_partition=False))
    for strategy in (revised, current, by_model):
        strategy._setup()  # type: ignore[attr-defined]
    assert revised._advisor.settings.require_pending is True  # type: ignore[attr-defined]
    assert current._advisor.settings.require_pending is False  # type: ignore[attr-defined]
    assert (revised.one_partition, by_model.one_partition) == (True, False)  # type: ignore[attr-defined]
    sim = sim_of(tiny_fleet(nodes=2, models=("H100", "A100")))
    j = job(1, 1, 5000)
    sim.cluster.start(j, sim.cluster.find(j), 0.0)
    one, pools = snapshot_of(sim, 100.0), snapshot_of(sim, 100.0, one_partition=False)
    # the scheduler places any job on any model: the snapshot says so, one partition of both
    assert {n.pool for n in one.nodes} == {g.pool for g in one.gpus} == {"simulated"}
    assert {n.pool for n in pools.nodes} == {"pool-H100", "pool-A100"}
    assert one.allocations[0].gpu_memory_need_bytes is None  # openb states none
    # a queued job that may use one model waits in that model's partition (the scheduler's
    # heads), listed as its pool where the snapshot lists a pool per model; one that may use
    # either is in no one pool
    pinned = dataclasses.replace(job(2, 8, 5000), models=("A100",))
    either = job(3, 8, 5000)
    for queued in (pinned, either):
        sim.scheduler.submit(queued)
    listed = {r.job: r.pool for r in snapshot_of(sim, 100.0, one_partition=False).pending}
    assert listed == {"2": "pool-A100", "3": ""}
    assert {r.pool for r in snapshot_of(sim, 100.0).pending} == {""}
    # past the listed window, each pool's first queued job is listed too: its partition's head
    for n in range(PENDING_LISTED):
        sim.scheduler.submit(dataclasses.replace(job(100 + n, 8, 5000), models=("A100",)))
    h100 = dataclasses.replace(job(999, 8, 5000), models=("H100",))
    sim.scheduler.submit(h100)
    pools = snapshot_of(sim, 100.0, one_partition=False).pending
    assert len(pools) == PENDING_LISTED + 1 and pools[-1].job == "999"
    assert pools[-1].pool == "pool-H100"
    assert len(snapshot_of(sim, 100.0).pending) == PENDING_LISTED  # one partition: the window
    assert [s.source for s in one.sources] == ["simulate"]  # the queue is listed: empty means none
    assert make_strategy("advisor", RunSettings(advisor_interval=600.0)).interval == 60.0  # the tick
    with pytest.raises(ValueError, match="unknown strategy 'bogus'"):
        make_strategy("bogus", RunSettings())


@pytest.mark.parametrize("one_partition", [True, False])
def test_the_advisors_analysis_from_the_placer_is_the_serves_from_the_snapshot(one_partition: bool):
    from exporter.analysis.analyzer import LiveAnalyzer
    from exporter.analysis.state import from_snapshot
    from exporter.config import load
    from exporter.cycle import Frame
    from exporter.outcome_sim.advisor_loop import AdvisorStrategy, snapshot_of

    sim = sim_of(tiny_fleet(nodes=3, models=("H100", "A100")))
    cluster = sim.cluster
    for j in (job(1, 1, 5000, share=0.5), job(2, 4, 5000), job(3, 0, 5000, cpus=3), job(4, 2, 100, cpus=5)):
        cluster.start(j, cluster.find(j), 0.0)
    strategy = AdvisorStrategy(one_partition=one_partition)
    strategy._setup()
    snapshot = snapshot_of(sim, 100.0, one_partition=one_partition, parts=strategy._parts)
    strategy._sim = sim
    analysis = strategy._stages[0]  # the analysis stage the loop runs, with the placer's view
    assert analysis.name == "analysis" and analysis.fleet_view is not None
    ours = analysis.step(Frame(snapshot)).report
    serves = LiveAnalyzer.from_config(load(None).analysis).analyze(snapshot)
    rebuilt = from_snapshot(snapshot)
    for name in ("names", "model_names", "pool_names"):
        assert getattr(ours.state, name) == getattr(rebuilt, name)
    for name in ("model", "pool", "cpu_total", "cpu_free", "gpu_free", "gpu_count"):
        assert np.array_equal(getattr(ours.state, name), getattr(rebuilt, name)), name
    assert ours.cluster == serves.cluster and ours.pools == serves.pools


def test_the_shapes_kept_per_job_are_the_snapshots_shapes_in_the_same_order():
    """The loop counts the live window's shapes from part keys kept with each job's allocation;
    they must be snapshot_shapes' counts, in its order (typical() breaks ties by it), through
    checkpoints, moves, ends and starts."""
    from exporter.analysis.workload import snapshot_shapes
    from exporter.outcome_sim.advisor_loop import PartCounts, snapshot_of

    sim = sim_of(tiny_fleet(nodes=3, models=("H100", "A100")))
    cluster = sim.cluster
    jobs = [job(1, 1, 5000, share=0.5), job(2, 4, 5000), job(3, 0, 5000, cpus=3), job(4, 2, 100, cpus=5),
            job(5, 1, 5000, share=0.25)]
    for j in jobs:
        cluster.start(j, cluster.find(j), 0.0)
    cache: dict = {}
    parts = PartCounts()

    def both(now: float) -> tuple[list, list]:
        snapshot = snapshot_of(sim, now, cache, parts=parts)
        return list(parts.shapes().items()), list(snapshot_shapes(snapshot).items())

    kept, fresh = both(100.0)
    assert kept == fresh and len(fresh) >= 4
    assert both(1000.0)[0] == both(1000.0)[1]  # a checkpoint since: allocations rebuilt, keys kept
    cluster.move(jobs[0], cluster.find(jobs[0], exclude=[jobs[0].placements[0].node]), 1000.0)
    cluster.stop(jobs[1])  # it ended
    late = job(6, 2, 5000)
    cluster.start(late, cluster.find(late), 1300.0)
    kept, fresh = both(1400.0)
    assert kept == fresh


def test_the_command_runs_the_openb_fleet_with_the_advisor(tmp_path, capsys):
    """The issue's `--fleet openb`: the trace's 1,213 nodes, the advisor in the loop, 43 minutes."""
    from exporter.cli import main

    argv = ["simulate", "--fleet", "openb", "--days", "0.03", "--warmup-days", "0", "--load", "1.1",
            "--seeds", "1", "--strategies", "none,advisor", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "outcomes.csv").open()))
    assert [(r["strategy"], r["seed"], r["load"]) for r in rows] == [("none", "1", "1.1000"),
                                                                     ("advisor", "1", "1.1000")]
    for row in rows:
        assert int(row["jobs"]) > 100 and int(row["jobs_started"]) > 0, row
        assert 0.0 < float(row["mean_allocation_pct"]) <= 100.0, row
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    assert "2 runs in" in capsys.readouterr().out


def test_min_runtime_counts_from_a_jobs_last_start_or_move():
    """The advisor's snapshot states when a job's current placement began: a job moved at
    t = 5,000 is younger than min_runtime at 5,600, though it first started at 0."""
    from exporter.outcome_sim.advisor_loop import snapshot_of

    sim = sim_of(tiny_fleet(nodes=2))
    cluster = sim.cluster
    moved, stayed = job(1, 4, 50_000), job(2, 2, 50_000)
    for j in (moved, stayed):
        cluster.start(j, cluster.find(j), 0.0)
    before = {a.job: a.start_time for a in snapshot_of(sim, 4_000.0).allocations}
    assert before == {"1": 0.0, "2": 0.0}
    destination = cluster.find(moved)  # free GPUs elsewhere, found while it holds its own
    cluster.move(moved, destination, 5_000.0)
    after = {a.job: a.start_time for a in snapshot_of(sim, 5_600.0).allocations}
    assert after == {"1": 5_000.0, "2": 0.0}
    assert moved.start == 0.0  # its first start is still kept, for the outcomes
