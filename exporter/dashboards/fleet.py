"""``gpufleet-fleet.json``: the fleet the way its operators think of it, by pool and model.

Unlike NVIDIA's per-GPU DCGM dashboard (grafana.com 12239), this one starts
from the cluster: how many GPUs are allocated, idle or lost; how busy, full,
hot and power-hungry each pool is against the levels that page; which GPUs
to look at first; and which gpufleet alerts fire.
"""

from __future__ import annotations

from grafanalib import core

from exporter.dashboards import panels as p
from exporter.dashboards import promql as q
from exporter.dashboards.levels import DashboardLevels

UID = "gpufleet-fleet"
FILE = "gpufleet-fleet.json"
TITLE = "gpufleet / Fleet overview"

# Panels whose queries return series only while a gpufleet alert fires; empty is their normal.
DATA_ONLY_WHEN_FIRING = ("Firing gpufleet alerts", "Firing alerts over time")


def build(levels: DashboardLevels) -> core.Dashboard:
    s = q.selector(q.FLEET)
    pending = q.selector(q.POOL)
    layout = p.Layout()

    layout.row("Fleet now")
    layout.add(p.stat("GPUs", p.targets((f"count(gpufleet_gpu_info{s})", "")), "none",
                      description="GPUs in the selected pools and models."), 4, 4)
    for state, description in (
        ("allocated", "Answering GPUs that jobs hold, in part or in whole."),
        ("idle", "Answering GPUs that no job holds."),
    ):
        layout.add(p.stat(f"{state.capitalize()} GPUs",
                          p.targets((q.gpus_in_state(state, s), "")), "none",
                          description=description), 4, 4)
    layout.add(p.stat("Lost GPUs", p.targets((q.gpus_in_state("lost", s), "")), "none",
                      steps=levels.lost, color_mode="background",
                      description="GPUs that stopped answering (gpufleet_gpu_up 0)."), 4, 4)
    layout.add(p.stat("Stale GPUs", p.targets((f"sum(gpufleet_gpu_stale{s})", "")), "none",
                      steps=levels.stale, color_mode="background",
                      description="GPUs served from the last good reading because their source "
                                  "fails."), 4, 4)
    layout.add(p.stat("Pending GPUs",
                      p.targets((f"sum(gpufleet_pending_gpus{pending}) or vector(0)", "")), "none",
                      description="GPUs asked for by jobs waiting to start."), 4, 4)

    layout.row("GPUs by model and state")
    states = ("allocated", "idle", "lost")
    layout.add(p.table(
        "GPUs by model and state",
        p.targets(*((q.gpus_in_state(state, s, by="model"), state) for state in states),
                  instant=True),
        "none", hide=(),
        rename={f"Value #{chr(ord('A') + i)}": state for i, state in enumerate(states)},
        order=("model", *states), sort_by="model", descending=False,
        description="A lost GPU counts as lost whether or not a job still holds it.",
    ), 8, 8)
    layout.add(p.timeseries(
        "GPUs by model and state over time",
        p.targets(*((q.gpus_in_state(state, s, by="model"), f"{{{{model}}}} {state}")
                    for state in states)),
        "none", stack=True, fill=40, minimum=0,
    ), 16, 8)

    layout.row("Utilization and memory")
    layout.add(p.timeseries(
        "Utilization per pool",
        p.targets((f"pool:gpufleet_gpu_utilization:avg{s}", "{{pool}} {{model}}")),
        "percentunit", minimum=0, maximum=1,
        description="Mean fraction of time a kernel ran, over every GPU of the pool.",
    ), 12, 8)
    layout.add(p.timeseries(
        "Memory used",
        p.targets(
            (f"pool:gpufleet_gpu_memory_used:ratio{s}", "{{pool}} {{model}}"),
            (f"max by (pool, model) ({q.memory_used_ratio(s)})", "{{pool}} {{model}} fullest GPU"),
        ),
        "percentunit", steps=levels.memory, minimum=0, maximum=1,
        description=f"The pool's memory in use, and its fullest GPU. Lines: the GPU memory "
                    f"alert's levels from {levels.source}.",
    ), 12, 8)

    layout.row("Power and temperature")
    layout.add(p.timeseries(
        "Power against limit",
        p.targets(
            (f"sum by (pool, model) (gpufleet_gpu_power_watts{s}) "
             f"/ sum by (pool, model) (gpufleet_gpu_power_limit_watts{s})", "{{pool}} {{model}}"),
            (f"max by (pool, model) (gpufleet_gpu_power_watts{s} "
             f"/ gpufleet_gpu_power_limit_watts{s})", "{{pool}} {{model}} highest GPU"),
        ),
        "percentunit", minimum=0, maximum=1,
        description="Power draw as a share of the enforced limit (the cap), for the pool "
                    "and for its highest-drawing GPU.",
    ), 12, 8)
    layout.add(p.bar_gauge(
        "Highest power draw by model",
        p.targets((f"max by (model) (gpufleet_gpu_power_watts{s})", "{{model}}")),
        "watt",
        overrides=[p.by_name_thresholds(model, steps) for model, steps in levels.power],
        description=f"The highest-drawing GPU of each model, coloured by the power alert's "
                    f"levels for that model from {levels.source}.",
    ), 12, 8)
    layout.add(p.timeseries(
        "Temperature",
        p.targets(
            (f"max by (pool, model) (gpufleet_gpu_temperature_celsius{s})",
             "{{pool}} {{model}} hottest"),
            (f"avg by (pool, model) (gpufleet_gpu_temperature_celsius{s})",
             "{{pool}} {{model}} mean"),
        ),
        "celsius", steps=levels.temperature,
        description=f"Lines: the temperature alert's levels from {levels.source}.",
    ), 18, 8)
    layout.add(p.gauge("Hottest GPU",
                       p.targets((f"max(gpufleet_gpu_temperature_celsius{s})", "")),
                       "celsius", steps=levels.temperature, maximum=100), 6, 8)

    layout.row("GPUs to look at")
    layout.add(p.table(
        "Top 10 hottest GPUs",
        p.targets((f"topk(10, gpufleet_gpu_temperature_celsius{s})", ""), instant=True),
        "celsius", steps=levels.temperature, hide=("uuid", "job"),
        rename={"Value": "temperature"}, order=("node", "gpu", "model", "pool", "Value"),
        sort_by="Value", color_column="Value",
    ), 12, 10)
    layout.add(p.table(
        "Top 10 most under-used allocated GPUs",
        p.targets((f"bottomk(10, gpufleet_gpu_utilization_ratio{s} * on (cluster, node, gpu) group_right() "
                   f"{q.allocations(s)})", ""), instant=True),
        "percentunit", steps=levels.utilization_low,
        hide=("uuid", "job", "exported_job", "priority"),
        rename={"Value": "utilization", "job_name": "job", "job_gpus": "job GPUs"},
        order=("node", "gpu", "model", "pool", "job_name", "namespace", "pod", "job_gpus", "Value"),
        sort_by="Value", descending=False, color_column="Value",
        description="GPUs held by a job, least busy first; a GPU shared by several jobs "
                    "appears once per job.",
    ), 12, 10)

    layout.row("NVLink")
    multi = q.selector(q.FLEET, 'job_gpus!="1"')
    layout.add(p.timeseries(
        "NVLink utilization of multi-GPU jobs per pool",
        p.targets((f"avg by (pool, model) ({q.nvlink_utilization(s)} and on (cluster, node, gpu) "
                   f"gpufleet_gpu_allocation_info{multi})", "{{pool}} {{model}}")),
        "percentunit", steps=levels.nvlink_low, minimum=0, maximum=1,
        description="Mean NVLink bandwidth in use on GPUs held by jobs with more than one GPU.",
    ), 12, 10)
    layout.add(p.table(
        "Multi-GPU jobs with the least NVLink traffic",
        p.targets((f"bottomk(10, avg by (job_name, namespace, job_gpus) ("
                   f"{q.nvlink_utilization(s)} * on (cluster, node, gpu) group_right() "
                   f"{q.allocations(multi)}))", ""), instant=True),
        "percentunit", steps=levels.nvlink_low,
        rename={"Value": "NVLink utilization", "job_name": "job", "job_gpus": "job GPUs"},
        order=("job_name", "namespace", "job_gpus", "Value"),
        sort_by="Value", descending=False, color_column="Value",
    ), 12, 10)

    layout.row("Alerts")
    firing = q.firing_alerts(levels.alert_names)
    layout.add(p.table(
        "Firing gpufleet alerts",
        p.targets((firing, ""), instant=True), "none",
        hide=("Value", "alertstate", "uuid", "job"),
        order=("alertname", "severity", "pool", "model", "node", "gpu"),
        sort_by="severity",
        description="Empty while no gpufleet alert fires.",
    ), 14, 8)
    layout.add(p.timeseries(
        "Firing alerts over time",
        p.targets((f"count by (alertname, severity) ({firing})", "{{alertname}} {{severity}}")),
        "none", stack=True, step_after=True, fill=40, minimum=0,
        description="Empty while no gpufleet alert fires.",
    ), 10, 8)

    return p.dashboard(
        uid=UID, title=TITLE, tags=("gpufleet",), layout=layout,
        description="GPU fleet by pool and model: states, utilization, memory, power, "
                    "temperature, NVLink and alerts.",
        variables=p.pool_and_model_variables(),
        links=[p.dashboard_link("Node drill-down", "gpufleet-node"),
               p.dashboard_link("Fragmentation", "gpufleet-fragmentation")],
    )
