"""The simulated Slurm scheduler keeps a head per partition (one per GPU model), as Slurm's main
scheduler does: a job that cannot start stops only the partitions it was tried in. A backfill
candidate is judged against each head it waits behind, and its run time at the speed of the
reserved nodes' GPU model."""

from __future__ import annotations

from exporter.analysis.workload import Shape
from exporter.outcome_sim.cluster import Cluster
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.scheduler import Scheduler, reserve
from exporter.outcome_sim.timeline import Job
from exporter.snapshot import Gpu, Node

A100 = "A100-80GB"  # throughput 0.5 in the GPU catalogue: work runs at half the H100's speed


def cluster_of(models: list[str], gpus: int = 8) -> Cluster:
    nodes = tuple(Node(f"n{i}", m, 64.0, m, "x", gpus) for i, m in enumerate(models))
    fleet = SimFleet("t", nodes, tuple(Gpu(n.name, g, f"u{n.name}{g}", n.model, n.pool)
                                       for n in nodes for g in range(n.gpu_count)), (Shape(1, 1.0, 1),))
    return Cluster(fleet.empty_state(), "bestfit")


def job(id_: int, gpus: int, work: float, models: tuple[str, ...] = (), submit: float | None = None,
        high: bool = False, parts: int = 1) -> Job:
    return Job(id_, float(id_) if submit is None else submit, work, 1.0, gpus, 1.0, parts, models, high)


def run_on(cluster: Cluster, j: Job, node: int, now: float = 0.0) -> None:
    found = cluster.find(j, exclude=[n for n in range(len(cluster.placer.names)) if n != node])
    assert found is not None
    cluster.start(j, found, now)


def a100_head_and_an_h100_job(mode: str) -> tuple[Scheduler, Job, Job]:
    """Two A100 nodes, busy; one free H100. Queued: an 8-GPU A100 head, three long A100 jobs behind
    it (more than the backfill depth of 2), then an 8-GPU H100 job."""
    cluster = cluster_of([A100, A100, "H100"])
    for node in (0, 1):
        run_on(cluster, job(90 + node, 8, 1000.0), node)
    scheduler = Scheduler(cluster, mode, backfill_depth=2)
    head = job(1, 8, 100.0, (A100,))
    h100 = job(9, 8, 100.0, ("H100",))
    for j in (head, job(2, 8, 5000.0, (A100,)), job(3, 4, 5000.0, (A100,)), job(4, 2, 5000.0, (A100,)), h100):
        scheduler.submit(j)
    return scheduler, head, h100


def test_an_h100_job_starts_while_the_head_of_the_a100_partition_is_blocked():
    scheduler, head, h100 = a100_head_and_an_h100_job("fifo")
    assert scheduler.run_pass(10.0) == [h100]
    assert scheduler.heads == (head,) and scheduler.blocked is head
    assert h100.placements[0].node == 2


def test_with_one_head_for_the_fleet_the_h100_job_waits_behind_the_a100_head():
    """The scheduler before: the candidates behind the one head use up the backfill depth, and the
    H100 job, which nothing holds back, is never tried (what happened on the GFS fleet)."""
    scheduler, head, h100 = a100_head_and_an_h100_job("fifo-one-head")
    assert scheduler.run_pass(10.0) == []
    assert scheduler.heads == (head,) and h100.start is None


def test_a_job_of_several_models_blocks_only_the_partitions_it_was_tried_in():
    """A high-priority H100 job heads the H100 partition; an 8-GPU job of any model is then tried
    on the A100s alone, does not fit, and heads that partition; a later A100 job that fits only off
    its reservation's node and ends late waits, and a 1-GPU H100 job that ends before the H100
    head's shadow time backfills."""
    cluster = cluster_of(["H100", A100, A100])
    run_on(cluster, job(90, 4, 200.0), 0)  # H100 n0: 4 free until 200
    run_on(cluster, job(91, 4, 50.0), 1)  # A100 n1: 4 free until 100 (50 s of work at 0.5)
    run_on(cluster, job(92, 6, 5000.0), 2)  # A100 n2: 2 free, long
    scheduler = Scheduler(cluster, "fifo")
    h100_head = job(1, 8, 100.0, ("H100",), high=True)
    anywhere = job(2, 8, 100.0)
    late = job(3, 4, 1000.0, (A100,))
    quick = job(4, 1, 100.0, ("H100",))
    for j in (h100_head, anywhere, late, quick):
        scheduler.submit(j)
    assert scheduler.run_pass(10.0) == [quick]
    assert scheduler.heads == (h100_head, anywhere)
    assert scheduler.reservations[h100_head.id].nodes == (0,)
    assert scheduler.reservations[h100_head.id].shadow == 200.0
    assert scheduler.reservations[anywhere.id].nodes == (1,)  # its reservation: on the A100s only
    assert scheduler.reservations[anywhere.id].shadow == 100.0
    assert late.start is None


def test_a_reservation_on_an_a100_ends_at_the_a100s_speed():
    cluster = cluster_of([A100])
    run_on(cluster, job(90, 4, 100.0), 0)  # 100 s of work at 0.5: it ends at 200
    assert reserve(cluster, job(1, 8, 100.0), 10.0).shadow == 200.0


def a100_backfill(work: float) -> tuple[Scheduler, Job]:
    """One A100 node, 4 GPUs free until 200 (shadow of the 8-GPU head); a 4-GPU job of ``work``
    seconds (at the H100's speed) waits behind the head."""
    cluster = cluster_of([A100])
    run_on(cluster, job(90, 4, 100.0), 0)
    scheduler = Scheduler(cluster, "fifo")
    candidate = job(2, 4, work)
    for j in (job(1, 8, 100.0), candidate):
        scheduler.submit(j)
    scheduler.run_pass(10.0)
    assert scheduler.reservation is not None and scheduler.reservation.shadow == 200.0
    return scheduler, candidate


def test_a_backfill_candidate_on_an_a100_runs_at_half_speed_and_must_end_by_the_shadow():
    # 150 s of work: 160 at the H100's speed, before the shadow; at the A100's, 310, after it
    _, slow = a100_backfill(150.0)
    assert slow.start is None
    # 90 s: 190 on the A100, before the shadow: it backfills on the reserved node
    _, quick = a100_backfill(90.0)
    assert quick.start == 10.0


def test_a_backfill_candidate_on_an_h200_ends_sooner_and_may_take_the_reserved_node():
    cluster = cluster_of(["H200"])
    run_on(cluster, job(90, 4, 294.0), 0)  # 294 s at 1.47: ends at 200
    scheduler = Scheduler(cluster, "fifo")
    candidate = job(2, 4, 250.0)  # 250 s: 260 at the H100's speed; at the H200's, 10 + 170
    for j in (job(1, 8, 100.0), candidate):
        scheduler.submit(j)
    assert scheduler.run_pass(10.0) == [candidate]
    assert scheduler.reservation is not None and scheduler.reservation.shadow == 200.0


def test_a_restore_counts_in_the_candidates_run_time():
    cluster = cluster_of(["H100"])
    run_on(cluster, job(90, 4, 200.0), 0)
    scheduler = Scheduler(cluster, "fifo")
    evicted = job(2, 4, 100.0)  # 10 + 100 ends by 200, but a restore of 120 s first does not
    evicted.restore_due = True
    for j in (job(1, 8, 100.0), evicted):
        scheduler.submit(j)
    assert scheduler.run_pass(10.0) == []
    assert evicted.start is None


def test_a_gang_heads_the_partition_of_every_model_it_fits():
    """A gang of two 8-GPU parts fits only a model with two nodes: it is in that partition alone,
    and a job of the other model starts beside it."""
    cluster = cluster_of(["H100", "H100", A100])
    run_on(cluster, job(90, 4, 1000.0), 0)
    scheduler = Scheduler(cluster, "fifo")
    gang = job(1, 8, 100.0, parts=2)
    other = job(2, 8, 100.0, (A100,))
    assert scheduler.partitions(gang) == (scheduler.cluster.placer.model_names.index("H100"),)
    for j in (gang, other):
        scheduler.submit(j)
    assert scheduler.run_pass(10.0) == [other]
    assert scheduler.heads == (gang,)
