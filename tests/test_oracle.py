"""The oracle: free, instant, memory-safe moves of any single-node job, head by head, the most
compaction could save on a window; each strategy's saving as a share of it. And what a repack
can really produce, the advisor engine's "fragments, not capacity" test."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from exporter.advisor.engine import repack_could_fit
from exporter.analysis.workload import Shape
from exporter.outcome_sim.advisor_loop import snapshot_of
from exporter.outcome_sim.cluster import Cluster, MoveCost
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.matrix import jittered
from exporter.outcome_sim.oracle import Oracle, any_single_node
from exporter.outcome_sim.outcomes import ORACLE, Outcome, oracle_shares, write_csv
from exporter.outcome_sim.run import RunSettings, Sim, seed_jobs, simulate, target_workload
from exporter.outcome_sim.scheduler import Scheduler
from exporter.outcome_sim.strategies import Consolidate, HeadUnblocker
from exporter.outcome_sim.timeline import HourlyArrivals, Job, TimelineSettings
from exporter.snapshot import Gpu, JobRequest, Node

SERIES = HourlyArrivals(np.array([3600.0 * 20, 3600.0 * 60, 3600.0 * 10, 3600.0 * 40] * 30),
                        np.array([20.0, 30.0, 10.0, 20.0] * 30))
LONG = 1e7


def fleet_of(*nodes: tuple[str, int], pools: tuple[str, ...] = ()) -> SimFleet:
    listed = tuple(Node(f"n{i}", model, 64.0, pools[i] if pools else "one", "any", gpus)
                   for i, (model, gpus) in enumerate(nodes))
    shapes = (Shape(4, 1.0, 1), Shape(4, 1.0, 1), Shape(2, 0.5, 1), Shape(16, 1.0, 4), Shape(32, 1.0, 8),
              Shape(8, 1.0, 2))
    return SimFleet("tiny", listed, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                          for n in listed for i in range(n.gpu_count)), shapes)


def sim_of(fleet: SimFleet) -> Sim:
    state = fleet.empty_state()
    workload = target_workload(fleet, state.model_names)
    cluster = Cluster(state, "bestfit", workload, MoveCost(900.0, 120.0))
    return Sim(fleet, cluster, Scheduler(cluster), RunSettings(), workload)


def job(id_: int, gpus: int, work: float, high: bool = False, models: tuple[str, ...] = (),
        share: float = 1.0) -> Job:
    return Job(id_, 0.0, work, 1.0, gpus, share, 1, models, high)


def run_on(sim: Sim, node: int, j: Job) -> Job:
    others = [n for n in range(len(sim.cluster.placer.names)) if n != node]
    sim.cluster.start(j, sim.cluster.find(j, exclude=others), 0.0)
    return j


def blocked_head(sim: Sim, head: Job) -> None:
    sim.scheduler.submit(head)
    assert sim.scheduler.run_pass(1.0) == []
    assert sim.scheduler.blocked is head


# -- the oracle -------------------------------------------------------------------


def test_the_oracle_moves_a_high_priority_job_for_free_where_consolidation_may_not():
    """Two nodes each hold a 1-GPU high-priority job: an 8-GPU head needs one moved."""
    for strategy, moves in ((Consolidate(), 0), (Oracle(), 1)):
        sim = sim_of(fleet_of(("H100", 8), ("H100", 8)))
        held = [run_on(sim, n, job(10 + n, 1, 10_000.0, high=True)) for n in range(2)]
        ends = [j.end() for j in held]
        head = job(1, 8, 100.0)
        blocked_head(sim, head)
        strategy.tick(sim, 600.0)
        assert sim.cluster.migrations == moves
        assert sim.cluster.lost_gpu_seconds == 0.0  # free: no work lost, no restore
        assert [j.end() for j in held] == ends  # instant, and on the same model: the same end
        assert sim.scheduler.run_pass(600.0) == ([head] if moves else [])


def test_the_oracle_never_moves_a_job_to_a_gpu_of_less_memory():
    """The head may use the H200 only; its one job may go to the H100 in all but memory."""
    sim = sim_of(fleet_of(("H200", 8), ("H100", 8)))
    run_on(sim, 0, job(10, 1, LONG))
    head = job(1, 8, 100.0, models=("H200",))
    blocked_head(sim, head)
    Oracle().tick(sim, 600.0)
    assert sim.cluster.migrations == 0
    # and with a B200 beside it (more memory), the move is made
    sim = sim_of(fleet_of(("H200", 8), ("H100", 8), ("B200", 8)))
    run_on(sim, 0, job(10, 1, LONG))
    run_on(sim, 2, job(11, 4, LONG))
    head = job(1, 8, 100.0, models=("H200",))
    blocked_head(sim, head)
    Oracle().tick(sim, 600.0)
    assert sim.cluster.migrations == 1 and sim.scheduler.run_pass(600.0) == [head]


def test_the_oracle_unblocks_head_after_head_in_one_tick():
    """Four nodes, each with a 1-GPU job; two 8-GPU jobs wait: one tick starts both."""
    fleet = fleet_of(*[("H100", 8)] * 4)
    small = [Job(30 + n, 0.0, LONG, 1.0, 1, 1.0, 1, (), True) for n in range(4)]
    heads = [Job(1, 1.0, LONG, 1.0, 8, 1.0, 1, (), False), Job(2, 2.0, LONG, 1.0, 8, 1.0, 1, (), False)]
    settings = RunSettings(timeline=TimelineSettings(days=1000 / 86400, warmup_days=0.0),
                           consolidate_interval=60.0)
    # bestfit packs the four small jobs on one node; spread them with one 7-GPU filler per node,
    # placed first (the queue's order: submit, then id), that ends before the heads arrive
    fillers = [Job(20 + n, 0.0, 0.5, 1.0, 7, 1.0, 1, (), True) for n in range(4)]
    jobs = [*fillers, *small, *heads]
    out = simulate(fleet, SERIES, "oracle", 1, settings, jobs=jobs)
    starts = {j.id: j.start for j in heads}
    # the four small jobs were spread one a node; two moved, so the heads have two nodes
    assert len({j.placements[0].node for j in small}) == 2
    assert {j.placements[0].node for j in heads}.isdisjoint({j.placements[0].node for j in small})
    assert starts[1] == starts[2] == 60.0  # both at the first tick
    assert out.migrations == 2 and out.migration_overhead_pct == 0.0 and out.plans == 2


def test_the_oracles_whole_node_waiting_is_never_above_nones_beyond_the_noise_band():
    """Six seeds on 16 nodes of four models. The band, as the matrix takes it: ``none`` again on
    each seed's jobs with submit times jittered a few seconds, its largest rise over ``none``.
    The oracle may lose a seed to a trajectory's luck, never by more than that; it saves on the
    median seed, and it moves for nothing (no overhead)."""
    models = ("H100", "H200", "H100", "A100-80GB", "H100", "B200", "H100", "H200")
    fleet = fleet_of(*[(m, 8) for m in models * 2])
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.1, load=1.1, gang_share=0.2))
    rises, noise = [], []
    for seed in range(1, 7):
        none = simulate(fleet, SERIES, "none", seed, settings)
        again = simulate(fleet, SERIES, "none", seed, settings,
                         jobs=jittered(seed_jobs(fleet, SERIES, settings, seed), seed))
        oracle = simulate(fleet, SERIES, ORACLE, seed, settings)  # the matrix's, every head searched
        base = none.gpu_hours_waited_whole_node
        assert base > 0 and oracle.jobs == none.jobs
        rises.append(oracle.gpu_hours_waited_whole_node / base - 1)
        noise.append(again.gpu_hours_waited_whole_node / base - 1)
        assert oracle.migrations > 0 and oracle.migration_overhead_pct == 0.0
        assert oracle.gpu_hours_waited_fragmentation + oracle.gpu_hours_waited_capacity == pytest.approx(
            oracle.gpu_hours_waited)
    band = max(noise)
    assert max(rises) <= band, (rises, noise)
    assert float(np.median(rises)) < 0, rises


# -- the share of the oracle's saving ---------------------------------------------


def outcome(strategy: str, seed: int, whole: float, load: float = 1.1) -> Outcome:
    return Outcome(strategy, seed, load, gpu_hours_waited_whole_node=whole)


def test_each_rows_saving_is_a_share_of_the_oracles_per_seed_and_load(tmp_path):
    rows = [outcome("none", 1, 100.0), outcome("oracle-heads", 1, 40.0), outcome("consolidate", 1, 70.0),
            outcome("advisor", 1, 110.0),
            outcome("none", 2, 50.0), outcome("oracle-heads", 2, 50.0), outcome("consolidate", 2, 45.0),
            outcome("none", 1, 10.0, load=0.8), outcome("consolidate", 1, 5.0, load=0.8)]
    oracle_shares(rows)
    shares = [o.share_of_oracle_saving for o in rows]
    assert shares[:4] == [0.0, 1.0, pytest.approx(0.5), pytest.approx(-1 / 6)]
    assert shares[4:7] == [None, None, None]  # the oracle saved nothing on seed 2: no share means anything
    assert shares[7:] == [None, None]  # no oracle at that load
    write_csv(rows, tmp_path / "o.csv")
    with open(tmp_path / "o.csv") as f:
        cells = [r["share_of_oracle_saving"] for r in csv.DictReader(f)]
    assert cells[:4] == ["0.0000", "1.0000", "0.5000", "-0.1667"] and cells[4:] == [""] * 5


def test_the_share_is_against_the_oracle_that_searches_every_head(tmp_path):
    """Where the first-head oracle saved nothing (its head of a full model) and the every-head
    one saved 40, each row's share is of the 40; the first-head oracle gets its share (0) like
    any strategy. Without the every-head row, no share: the first-head one is no bound."""
    assert ORACLE == "oracle-heads"
    rows = [outcome("none", 1, 100.0), outcome("oracle", 1, 100.0), outcome("oracle-heads", 1, 60.0),
            outcome("consolidate", 1, 90.0),
            outcome("none", 2, 100.0), outcome("oracle", 2, 80.0), outcome("consolidate", 2, 90.0)]
    oracle_shares(rows)
    shares = [o.share_of_oracle_saving for o in rows]
    assert shares[:4] == [0.0, 0.0, 1.0, pytest.approx(0.25)]
    assert shares[4:] == [None, None, None]
    write_csv(rows, tmp_path / "o.csv")
    with open(tmp_path / "o.csv") as f:
        cells = [(r["strategy"], r["share_of_oracle_saving"]) for r in csv.DictReader(f)]
    assert cells[:4] == [("none", "0.0000"), ("oracle", "0.0000"), ("oracle-heads", "1.0000"),
                         ("consolidate", "0.2500")]


# -- what a repack can produce: the engine's "fragments, not capacity" ---------------


def pending(gpus: int, share: float = 1.0, models: tuple[str, ...] = (), pool: str = "",
            nodes: int = 1) -> JobRequest:
    return JobRequest("head", gpus, share, 1.0, nodes, models, pool)


def fits(sim: Sim, head: JobRequest) -> bool:
    snapshot = snapshot_of(sim, 1.0, one_partition=False)
    return repack_could_fit(snapshot, sim.cluster.placer.state, head)


def test_an_8_gpu_job_beside_8_free_gpus_on_two_nodes_is_fragments_beside_4_capacity():
    sim = sim_of(fleet_of(("H100", 8), ("H100", 8)))
    for n in range(2):
        run_on(sim, n, job(10 + n, 4, LONG))
    assert fits(sim, pending(8))
    run_on(sim, 0, job(12, 4, LONG))
    assert not fits(sim, pending(8))


def test_idle_gpus_a_repack_cannot_reach_are_capacity_not_fragments():
    # the head may use the H200 only; its job may move to an H100 in all but memory
    sim = sim_of(fleet_of(("H200", 8), ("H100", 8)))
    run_on(sim, 0, job(10, 8, LONG))
    assert sim.cluster.placer.state.idle.sum() == 8  # what the old test summed: "fragments"
    assert not fits(sim, pending(8, models=("H200",)))
    assert fits(sim, pending(8))  # on the H100 it fits as it is
    # an A100's job may move to the H100 (as much memory): the H100's idle GPUs count for it
    sim = sim_of(fleet_of(("A100-80GB", 8), ("H100", 8)))
    run_on(sim, 0, job(10, 8, LONG))
    assert fits(sim, pending(8, models=("A100-80GB",)))
    # nodes too small for its part: 8 idle GPUs on two 4-GPU nodes never hold an 8-GPU part
    sim = sim_of(fleet_of(("H100", 4), ("H100", 4), ("H100", 8)))
    run_on(sim, 2, job(10, 8, LONG, high=True))
    assert fits(sim, pending(8))  # the 8-GPU node's job could move to the small ones
    sim = sim_of(fleet_of(("H100", 4), ("H100", 4)))
    assert not fits(sim, pending(8)) and fits(sim, pending(8, nodes=2))
    # another pool's idle GPUs are no room for it
    sim = sim_of(fleet_of(("H100", 8), ("H100", 8), pools=("a", "b")))
    run_on(sim, 0, job(10, 8, LONG))
    assert not fits(sim, pending(8, pool="a")) and fits(sim, pending(8, pool="b"))


def test_fractions_of_gpus_count_for_a_share_but_a_whole_gpu_job_needs_their_floor():
    sim = sim_of(fleet_of(("H100", 2)))
    run_on(sim, 0, job(10, 1, LONG, share=0.5, high=True))
    run_on(sim, 0, job(11, 1, LONG, share=0.75, high=True))
    # 0.5 + 0.25 idle on the two GPUs; a repack gathers 0.75 of a GPU at most
    assert fits(sim, pending(1, share=0.5))
    assert not fits(sim, pending(1))


def test_the_engine_plans_for_a_head_only_when_a_repack_could_make_room_and_says_why_not():
    from exporter.advisor.advise import Planner, advise
    from exporter.advisor.engine import Advisor, DecisionSettings
    from tests.test_advisor_pending import NOW, WHOLE, fragmented, report_of

    def no_plan(*args):  # a job no repack can start is not planned for
        raise AssertionError("planned for a job only capacity lets start")

    # 15 GPUs idle on three 8-GPU nodes: the sum said "fragments" for a 9-GPU single-node job
    nine = JobRequest("nine", 9, 1.0, 36.0, 1, (), "gpu-h100", 0, NOW - 3600)
    snapshot = fragmented((nine,))
    advice = advise(Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW), snapshot,
                    report_of(snapshot), no_plan, plan_pending=no_plan)
    assert advice.decision != "compact"
    assert any(r.startswith("pending job nine (9 GPUs) waits for capacity: 15 GPUs are idle")
               for r in advice.reasons), advice.reasons
    # an 8-GPU job on the same fleet: fragments, and its plan
    snapshot = fragmented((WHOLE,))
    planned = advise(Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW), snapshot,
                     report_of(snapshot), no_plan, plan_pending=Planner().for_pending)
    assert planned.decision == "compact" and planned.plan is not None


def test_every_head_unblocks_a_partitions_head_behind_a_head_no_repack_can_start():
    """Two models, every job pinned to one. The queue's first head wants 8 A100s while all
    are held (capacity-blocked); the next wants 8 H100s, free in total but split 4 and 4 by
    two 4-GPU jobs. The first-head oracle and consolidate look at the A100 head only and
    move nothing; their every-head forms move one 4-GPU job and the H100 head starts."""
    for strategy, moves in ((Oracle(), 0), (Oracle(every_head=True), 1),
                            (Consolidate(), 0), (Consolidate(unblocker=HeadUnblocker(every_head=True)), 1)):
        sim = sim_of(fleet_of(("A100", 8), ("H100", 8), ("H100", 8)))
        run_on(sim, 0, job(10, 8, LONG, models=("A100",)))
        run_on(sim, 1, job(11, 4, LONG, models=("H100",)))
        run_on(sim, 2, job(12, 4, LONG, models=("H100",)))
        first = job(1, 8, 100.0, models=("A100",))
        second = job(2, 8, 100.0, models=("H100",))
        sim.scheduler.submit(first)
        sim.scheduler.submit(second)
        assert sim.scheduler.run_pass(1.0) == []
        assert sim.scheduler.blocked is first and sim.scheduler.heads == (first, second)
        strategy.tick(sim, 600.0)
        assert sim.cluster.migrations == moves
        assert sim.scheduler.run_pass(600.0) == ([second] if moves else [])
        assert not first.placements


# -- what the oracle costs: a search answered again without searching, the same run ------------


def pinned_jobs(seed: int, count: int, models: tuple[tuple[str, ...], ...], seconds: float) -> list[Job]:
    """``count`` jobs over ``seconds``, each allowed one of ``models``: 1-8 GPUs (a few of them
    half a GPU, a few gangs of two 8-GPU parts), half of them high-priority."""
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(count):
        gpus = int(rng.choice([1, 1, 2, 4, 8]))
        share = 0.5 if gpus == 1 and rng.random() < 0.3 else 1.0
        parts = 2 if gpus == 8 and rng.random() < 0.3 else 1
        jobs.append(Job(i, float(rng.uniform(0.0, seconds)), float(rng.exponential(3 * 3600.0)), 4.0, gpus,
                        share, parts, models[int(rng.integers(len(models)))], bool(rng.random() < 0.5)))
    return sorted(jobs, key=lambda j: (j.submit, j.id))


@pytest.mark.parametrize("models", [(("H100",), ("H200",)), (("H100",), ("H200",), ("H100", "H200"))],
                         ids=["pinned", "some-either"])
def test_a_search_whose_reach_did_not_change_is_answered_unsearched_the_run_the_same(monkeypatch, models):
    """Jobs pinned to one of two models: a head's search reads its own model's nodes only, so
    while none of them changed since its search found no way, the answer is that again. Where
    some jobs may use either, an H100 head's search reads the H200s too (its H100s' jobs may
    move there: as much memory, as fast). The run that remembers is the one that searches
    every time, in every column but the wall time (and every sample), and it answered some
    searches so."""
    import dataclasses

    import exporter.outcome_sim.run as run_module

    fleet = fleet_of(*[("H100", 8)] * 5, *[("H200", 8)] * 3)
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.1), consolidate_interval=60.0)
    made: list[Oracle] = []
    rows = []
    for remember in (False, True):
        def make(name: str, settings: RunSettings, remember: bool = remember) -> Oracle:
            made.append(Oracle(name=name, interval=settings.consolidate_interval, every_head=True,
                               remember=remember))
            return made[-1]

        monkeypatch.setattr(run_module, "make_strategy", make)
        jobs = pinned_jobs(8, 150, models, 0.6 * 86400)
        out = simulate(fleet, SERIES, "oracle-heads", 1, settings, jobs=jobs)
        assert out.migrations > 0 and out.plans > 0
        rows.append({k: v for k, v in dataclasses.asdict(out).items() if k != "wall_seconds"})
    assert made[0]._unchanged.answered == 0 and made[1]._unchanged.answered > 0
    assert rows[0] == rows[1]


def test_a_gang_counted_short_of_nodes_is_answered_as_the_whole_search_would(monkeypatch):
    """Random fleets of two models, random jobs started on them, gangs of 2-4 parts as heads.
    Where no model has as many nodes with room for a part as the gang has parts, it fits
    nowhere (what ``Cluster.find`` says, placing part after part); where none has as many that
    moves could clear, no plan exists (what the search says, part after part). Each answer is
    the one the full work gives, and both shortcuts are taken on some of these fleets."""
    import exporter.outcome_sim.strategies as strategies

    rng = np.random.default_rng(3)
    counted = {"fits": 0, "plans": 0}
    for trial in range(40):
        sim = sim_of(fleet_of(*[("H100", 8)] * 4, *[("H200", 8)] * 3))
        for i in range(int(rng.integers(3, 14))):
            j = job(100 + i, int(rng.choice([1, 2, 4, 8])), LONG, high=bool(rng.random() < 0.5),
                    models=(str(rng.choice(["H100", "H200"])),))
            placed = sim.cluster.find(j)
            if placed is not None:
                sim.cluster.start(j, placed, 0.0)
        head = Job(1, 0.0, 100.0, 1.0, int(rng.choice([4, 8])), 1.0, int(rng.integers(2, 5)),
                   (str(rng.choice(["H100", "H200"])),), False)
        fits = strategies._fits_now(sim.cluster, head)
        assert fits == (sim.cluster.find(head) is not None)
        args = (sim, head, 64, 64, any_single_node)
        found = strategies.unblock(*args, rule="no-slower", base=any_single_node)
        enough = strategies._nodes_enough(sim.cluster, head, any_single_node)
        with monkeypatch.context() as m:
            m.setattr(strategies, "_nodes_enough", lambda *args: True)
            whole = strategies.unblock(*args, rule="no-slower", base=any_single_node)
        assert found == whole, trial
        counted["plans"] += not enough
        counted["fits"] += not fits
    assert counted["plans"] > 0 and counted["fits"] > 0, counted
