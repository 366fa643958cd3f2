"""``gpufleet-fragmentation.json``: when GPUs sit idle yet large jobs cannot start.

The fragmentation index per pool and for the cluster against the compaction
level (the fragmentation alert of the threshold table, which routes to the
advisor), idle against fragmented GPUs and what the jobs waiting ask for,
why GPUs count as fragmented, where they are, and tier inversions (a
scarcer tier idle while a lower one is busy).

Also what fragmentation is measured against: the target workload's task
shapes and where they come from, and what the rebalancing advisor makes of it:
its decisions, plan sizes, GPUs and whole nodes a plan frees, and webhook
deliveries to the schedulers.
"""

from __future__ import annotations

from grafanalib import core

from exporter import metrics as m
from exporter.dashboards import panels as p
from exporter.dashboards import promql as q
from exporter.dashboards.levels import DashboardLevels

UID = "gpufleet-fragmentation"
FILE = "gpufleet-fragmentation.json"
TITLE = "gpufleet / Fragmentation"

DATA_ONLY_WHEN_FIRING: tuple[str, ...] = ()

HEAT = "continuous-GrYlRd"  # green to red by value: counts that no alert level applies to

# gpufleet_tier_inversion is a state, 0 or 1: named and coloured, not thresholded
INVERSION_STATES = [{"type": "value", "options": {
    "0": {"index": 0, "text": "no", "color": "green"},
    "1": {"index": 1, "text": "inverted", "color": "orange"},
}}]


def build(levels: DashboardLevels) -> core.Dashboard:
    s = q.selector(q.FLEET)
    pools = q.selector(q.POOL)
    c = q.selector(q.CLUSTER)
    layout = p.Layout()

    layout.row("Fragmentation now")
    layout.add(p.stat("Cluster fragmentation index",
                      p.targets((levels.query("cluster_fragmentation_index", c), "")), "none",
                      steps=levels.steps("cluster_fragmentation_index"), color_mode="background",
                      minimum=0, maximum=100,
                      description=f"0-100, less the tier-inversion penalties no compaction "
                                  f"recovers, as the advisor and the cluster fragmentation "
                                  f"alert judge it; colours: that alert's levels from "
                                  f"{levels.source}."), 6, 5)
    layout.add(p.stat("Fragmented GPUs", p.targets((f"{m.CLUSTER_FRAGMENTED_GPUS.name}{c}", "")),
                      "none", description="Idle GPU capacity no job of the workload can use."),
               4, 5)
    layout.add(p.stat("Idle GPUs", p.targets((f"{m.CLUSTER_IDLE_GPUS.name}{c}", "")), "none",
                      description="Idle GPU capacity in the cluster, in GPUs."), 4, 5)
    layout.add(p.stat("Fragmented share of idle",
                      p.targets((f"{m.CLUSTER_FRAGMENTATION_RATIO.name}{c}", "")), "percentunit",
                      minimum=0, maximum=1), 5, 5)
    layout.add(p.stat("Pending GPUs",
                      p.targets((f"sum({m.PENDING_GPUS.name}{pools}) or vector(0)", "")), "none",
                      description="GPUs asked for by jobs waiting to start."), 5, 5)

    layout.row("Over time")
    layout.add(p.timeseries(
        "Fragmentation index",
        p.targets((levels.query("pool_fragmentation_index", s), "{{pool}} {{model}}")),
        "none", steps=levels.steps("pool_fragmentation_index"), minimum=0, maximum=100,
        description=f"0-100 per pool, less the tier-inversion penalties no compaction recovers, "
                    f"as the advisor and the pool fragmentation alert judge it (the cluster's: "
                    f"the stat above). Line: the compaction level, that alert's level from "
                    f"{levels.source}.",
    ), 24, 9)
    layout.add(p.timeseries(
        "Idle against fragmented GPUs per pool",
        p.targets(
            (f"sum by (pool) ({m.POOL_IDLE_GPUS.name}{s})", "{{pool}} idle"),
            (f"sum by (pool) ({m.POOL_FRAGMENTED_GPUS.name}{s})", "{{pool}} fragmented"),
            (q.zero_filled_by_pool(f"sum by (pool) ({m.PENDING_GPUS.name}{pools})", pools),
             "{{pool}} pending"),
        ),
        "none", minimum=0,
        description="Idle: unallocated GPU capacity, in GPUs. Fragmented: the part of it "
                    "the target workload cannot use. Pending: GPUs waiting jobs ask for.",
    ), 14, 9)
    layout.add(p.timeseries(
        "Fragmented GPUs by reason",
        p.targets((f"{m.CLUSTER_FRAGMENTED_GPUS_BY_REASON.name}{c}", "{{reason}}")),
        "none", stack=True, fill=40, minimum=0,
    ), 10, 9)

    layout.row("Where")
    layout.add(p.stat(
        "Fragmented GPUs per node",
        p.targets((f"{m.NODE_FRAGMENTED_GPUS.name}{c} and on (cluster, node) {m.NODE_INFO.name}{s}",
                   "{{node}}")),
        "none", color_mode="background", graph=False, text_mode="value_and_name",
        continuous=HEAT, minimum=0,
        description="A heat map of nodes: green has no fragmented GPU, red the most.",
    ), 16, 12)
    layout.add(p.table(
        "Tier inversions",
        p.targets((f"{m.TIER_INVERSION.name}{c}", ""), instant=True), "none",
        hide=("job",), rename={"Value": "now"}, order=("upper", "lower", "Value"),
        sort_by="Value", color_column="Value", mappings=INVERSION_STATES,
        description="One row per pair of pools of different tiers: inverted while the "
                    "scarcer tier (upper) sits idle and the lower one is busy, so jobs run on "
                    "the wrong GPUs.",
    ), 8, 12)

    layout.row("Target workload")
    layout.add(p.stat("Task shapes", p.targets((f"{m.FRAGMENTATION_WORKLOAD_SHAPES.name}{c}", "")),
                      "none", graph=False,
                      description="Task shapes (GPUs, share, CPUs, models) that fragmentation "
                                  "is measured against."), 6, 4)
    layout.add(p.stat("Tasks the shapes cover",
                      p.targets((f"{m.FRAGMENTATION_WORKLOAD_COVERAGE_RATIO.name}{c}", "")),
                      "percentunit", graph=False, minimum=0, maximum=1), 6, 4)
    layout.add(p.stat("CPU-only weight",
                      p.targets((f"{m.FRAGMENTATION_WORKLOAD_CPU_ONLY_RATIO.name}{c}", "")),
                      "percentunit", graph=False, minimum=0, maximum=1,
                      description="Weight of CPU-only tasks in the target workload."), 6, 4)
    layout.add(p.table(
        "Workload source",
        p.targets((f"{m.FRAGMENTATION_WORKLOAD_INFO.name}{c}", ""), instant=True), "none",
        hide=("Value", "job"), order=("source", "cpu_only"),
        description="window: live allocations over recent snapshots; trace: an openb pod "
                    "trace; shapes: listed in the config.",
    ), 6, 4)

    layout.row("Rebalancing advisor")
    layout.add(p.table(
        "Advisor decision",
        p.targets((f"{m.ADVISOR_DECISION_INFO.name}{c}", ""), instant=True), "none",
        hide=("Value", "job", "instance"), order=("decision",),
        description="none: nothing due; cooldown: a plan went out recently; hold: due, but no "
                    "plan passes the gain gate; compact: a plan was proposed and sent.",
    ), 5, 8)
    layout.add(p.timeseries(
        "Compaction recommended",
        p.targets((f"{m.ADVISOR_COMPACTION_RECOMMENDED.name}{c}", "{{scope}}")),
        "none", minimum=0, maximum=1,
        description="1 while the scope's index has stayed above the trigger for the dwell "
                    "time and not yet fallen below the clear level.",
    ), 7, 8)
    layout.add(p.timeseries(
        "Last plan",
        p.targets((f"{m.ADVISOR_PLAN_MIGRATIONS.name}{c}", "migrations"),
                  (f"{m.ADVISOR_PLAN_FRAGMENTED_GPUS_RECOVERED.name}{c}", "fragmented GPUs recovered"),
                  (f"sum({m.ADVISOR_PLAN_NODES_FREED.name}{c}) or vector(0)", "whole nodes freed")),
        "none", minimum=0,
        description="The size of the last proposed plan and what it predicts it frees.",
    ), 6, 8)
    layout.add(p.timeseries(
        "Webhook deliveries",
        p.targets(
            (f"sum by (result) (increase({m.ADVISOR_WEBHOOK_DELIVERIES_TOTAL.name}{c}"
             "[$__rate_interval])) or vector(0)", "{{result}}"),
            (f"{m.ADVISOR_OUTBOX_PENDING.name}{c}", "pending in the outbox"),
        ),
        "none", minimum=0,
        description="Plan deliveries to the schedulers by result (delivered, retry, rejected, "
                    "expired) and what waits in the durable outbox.",
    ), 6, 8)

    return p.dashboard(
        uid=UID, title=TITLE, tags=("gpufleet",), layout=layout,
        description="Fragmentation index, idle against fragmented GPUs, reasons, nodes and "
                    "tier inversions.",
        variables=p.pool_and_model_variables(),
        links=[p.dashboard_link("Fleet overview", "gpufleet-fleet"),
               p.dashboard_link("Node drill-down", "gpufleet-node")],
    )
