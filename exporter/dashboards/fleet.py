"""``gpufleet-fleet.json``: the fleet the way its operators think of it, by pool and model.

Unlike NVIDIA's per-GPU DCGM dashboard (grafana.com 12239), this one starts
from the cluster: how many GPUs are allocated, idle or lost; how busy, full,
hot and power-hungry each pool is against the levels that page; which GPUs
to look at first; and which gpufleet alerts fire.
"""

from __future__ import annotations

from grafanalib import core

from exporter import metrics as m
from exporter.alerting.pool_load_rules import statistic_name
from exporter.dashboards import panels as p
from exporter.dashboards import promql as q
from exporter.dashboards.levels import DashboardLevels
from exporter.thresholds import recorded
from exporter.thresholds.sections import range_name

UID = "gpufleet-fleet"
FILE = "gpufleet-fleet.json"
TITLE = "gpufleet / Fleet overview"
HOUR = 3600.0  # the load statistics' windows the panels show: 1h and 24h

# Panels whose queries return series only while a gpufleet alert fires; empty is their normal.
DATA_ONLY_WHEN_FIRING = ("Firing gpufleet alerts", "Firing alerts over time")


def build(levels: DashboardLevels) -> core.Dashboard:
    s = q.selector(q.FLEET)
    pending = q.selector(q.POOL)
    layout = p.Layout()

    layout.row("Fleet now")
    layout.add(p.stat("GPUs", p.targets((f"count({m.GPU_INFO.name}{s})", "")), "none",
                      description="GPUs in the selected pools and models."), 4, 4)
    for state, description in (
        ("allocated", "Answering GPUs that jobs hold, in part or in whole."),
        ("idle", "Answering GPUs that no job holds."),
    ):
        layout.add(p.stat(f"{state.capitalize()} GPUs",
                          p.targets((q.gpus_in_state(state, s), "")), "none",
                          description=description), 4, 4)
    layout.add(p.stat("Lost GPUs", p.targets((q.gpus_in_state("lost", s), "")), "none",
                      steps=levels.any_of("gpu_up"), color_mode="background",
                      description=f"GPUs that stopped answering ({m.GPU_UP.name} 0)."), 4, 4)
    layout.add(p.stat("Stale GPUs", p.targets((f"sum({m.GPU_STALE.name}{s})", "")), "none",
                      steps=levels.any_of("source_up", first=True), color_mode="background",
                      description="GPUs served from the last good reading because their source "
                                  "fails."), 4, 4)
    layout.add(p.stat("Pending GPUs",
                      p.targets((f"sum({m.PENDING_GPUS.name}{pending}) or vector(0)", "")), "none",
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
        p.targets((f"{recorded.POOL_UTILIZATION}{s}", "{{pool}} {{model}}")),
        "percentunit", minimum=0, maximum=1,
        description="Mean fraction of time a kernel ran, over every GPU of the pool.",
    ), 8, 8)
    layout.add(p.timeseries(
        "Memory used per pool",
        p.targets((f"{recorded.POOL_MEMORY_USED}{s}", "{{pool}} {{model}}")),
        "percentunit", minimum=0, maximum=1,
        description="The pool's memory in use, over every GPU of the pool.",
    ), 8, 8)
    layout.add(p.timeseries(
        "Memory used, fullest GPU per pool",
        p.targets((f"max by (pool, model) ({levels.query('gpu_memory_used', s)})",
                   "{{pool}} {{model}}")),
        "percentunit", steps=levels.steps("gpu_memory_used"), minimum=0, maximum=1,
        description=f"Each pool's fullest GPU: the GPU memory alert compares each GPU. Lines: "
                    f"its levels from {levels.source}.",
    ), 8, 8)

    layout.row("Power and temperature")
    layout.add(p.timeseries(
        "Power against limit",
        p.targets(
            (f"sum by (pool, model) ({m.GPU_POWER_WATTS.name}{s}) "
             f"/ sum by (pool, model) ({m.GPU_POWER_LIMIT_WATTS.name}{s})", "{{pool}} {{model}}"),
            (f"max by (pool, model) ({m.GPU_POWER_WATTS.name}{s} "
             f"/ {m.GPU_POWER_LIMIT_WATTS.name}{s})", "{{pool}} {{model}} highest GPU"),
        ),
        "percentunit", minimum=0, maximum=1,
        description="Power draw as a share of the enforced limit (the cap), for the pool "
                    "and for its highest-drawing GPU.",
    ), 12, 8)
    layout.add(p.bar_gauge(
        "Highest power draw by model",
        p.targets((f"max by (model) ({levels.query('gpu_power', s)})", "{{model}}")),
        "watt",
        overrides=[p.by_name_thresholds(model, steps) for model, steps in levels.power()],
        description=f"The highest-drawing GPU of each model, coloured by the power alert's "
                    f"levels for that model from {levels.source}.",
    ), 12, 8)
    temperature = levels.query("gpu_temperature", s)
    layout.add(p.timeseries(
        "Temperature, hottest GPU per pool",
        p.targets((f"max by (pool, model) ({temperature})", "{{pool}} {{model}}")),
        "celsius", steps=levels.steps("gpu_temperature"),
        description=f"Each pool's hottest GPU: the temperature alert compares each GPU. Lines: "
                    f"its levels from {levels.source}.",
    ), 12, 8)
    layout.add(p.timeseries(
        "Mean temperature per pool",
        p.targets((f"avg by (pool, model) ({m.GPU_TEMPERATURE_CELSIUS.name}{s})",
                   "{{pool}} {{model}}")),
        "celsius",
        description="The mean over every GPU of the pool.",
    ), 6, 8)
    layout.add(p.gauge("Hottest GPU", p.targets((f"max({temperature})", "")),
                       "celsius", steps=levels.steps("gpu_temperature"), maximum=100), 6, 8)

    layout.row("GPUs to look at")
    layout.add(p.table(
        "Top 10 hottest GPUs",
        p.targets((f"topk(10, {temperature})", ""), instant=True),
        "celsius", steps=levels.steps("gpu_temperature"), hide=("uuid", "job"),
        rename={"Value": "temperature"}, order=("node", "gpu", "model", "pool", "Value"),
        sort_by="Value", color_column="Value",
    ), 12, 10)
    # the job average carries no pool or model: every job of the chosen clusters
    layout.add(p.table(
        "Top 10 least busy jobs",
        p.targets((f"bottomk(10, {levels.query('job_utilization', q.selector(q.CLUSTER))})", ""),
                  instant=True),
        "percentunit", steps=levels.steps("job_utilization"),
        hide=("cluster",),
        rename={"Value": "utilization", "exported_job": "job", "job_gpus": "job GPUs"},
        order=("exported_job", "account", "job_gpus", "Value"),
        sort_by="Value", descending=False, color_column="Value",
        description="Jobs by the average utilization of the GPUs they hold, least busy first: "
                    "what the job utilization alert compares, coloured at its levels from "
                    f"{levels.source}. Every job of the cluster: the average carries no pool.",
    ), 12, 10)

    layout.row("NVLink")
    multi = q.selector(q.FLEET, 'job_gpus!="1"')
    layout.add(p.timeseries(
        "NVLink utilization of multi-GPU jobs per pool",
        p.targets((f"avg by (pool, model) ({q.nvlink_utilization(s)} and on (cluster, node, gpu) "
                   f"{m.GPU_ALLOCATION_INFO.name}{multi})", "{{pool}} {{model}}")),
        "percentunit", minimum=0, maximum=1,
        description="Mean NVLink bandwidth in use on GPUs held by jobs with more than one GPU "
                    "(the NVLink alert compares each busy GPU of such a job, not the mean).",
    ), 12, 10)
    layout.add(p.table(
        "Multi-GPU jobs with the least NVLink traffic",
        p.targets((f"bottomk(10, avg by (job_name, namespace, job_gpus) ("
                   f"{q.nvlink_utilization(s)} * on (cluster, node, gpu) group_right() "
                   f"{q.allocations(multi)}))", ""), instant=True),
        "percentunit",
        rename={"Value": "NVLink utilization", "job_name": "job", "job_gpus": "job GPUs"},
        order=("job_name", "namespace", "job_gpus", "Value"),
        sort_by="Value", descending=False, color_column="Value",
    ), 12, 10)

    _health_row(layout, levels)
    _verdict_row(layout, levels)
    _reliability_row(layout)
    _load_row(layout, levels)
    _preemption_row(layout, levels)

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

    board = p.dashboard(
        uid=UID, title=TITLE, tags=("gpufleet",), layout=layout,
        description="GPU fleet by pool and model: states, utilization, memory, power, "
                    "temperature, NVLink, health, verdicts and remediation, reliability, load, "
                    "preemption and alerts.",
        variables=p.pool_and_model_variables(),
        links=[p.dashboard_link("Node drill-down", "gpufleet-node"),
               p.dashboard_link("Fragmentation", "gpufleet-fragmentation")],
    )
    board.annotations = core.Annotations(list=[LOAD_CHANGES])
    return board


# Issue 20: a mark on every graph where the analyzer's change-point detector found a pool's
# demand changing regime. The counter, not the timestamp gauge: it says which way, and its
# series exist at 0 from the start, so increase() sees the first change too. 2m at a 1m step
# catches each change once or twice (merged into one mark); $__interval is not set for
# annotation queries.
LOAD_CHANGES = {
    "name": "Load changes",
    "datasource": p.DATASOURCE,
    "enable": True,
    "iconColor": "purple",
    "expr": f"sum by (cluster, pool, direction) (increase({m.POOL_LOAD_CHANGE_TOTAL.name}"
            f"{q.selector(q.POOL)}[2m])) > 0",
    "step": "1m",
    "titleFormat": "Load change {{direction}}",
    "textFormat": "Pool {{pool}}: demand changed regime ({{direction}})",
    "tagKeys": "pool,direction",
    "useValueForTime": False,
}


def _load_row(layout: p.Layout, levels: DashboardLevels) -> None:
    """Issue 20: each pool's load statistics (recorded from the table's load_statistics),
    the scaling hint against the nodes it has, and the node pressure score (node_exporter;
    not filtered by pool: node_exporter's series carry no pool)."""
    s = q.selector(q.FLEET)
    pools = q.selector(q.POOL)
    layout.row("Load")
    layout.add(p.timeseries(
        "Demand ratio by pool",
        p.targets(
            # demand is recorded per pool (waiting jobs name no model): no model matcher
            (f"{recorded.POOL_DEMAND}{pools}", "{{pool}}"),
            (f"{statistic_name(recorded.POOL_DEMAND, 'mean', HOUR)}{pools}", "{{pool}} mean 1h"),
            (f"{statistic_name(recorded.POOL_DEMAND, 'p95', HOUR)}{pools}", "{{pool}} p95 1h"),
        ),
        "percentunit", minimum=0,
        description="(allocated + pending GPUs) / GPUs: above 100% jobs wait. With its 1h "
                    "mean and p95 (recording rules from the table's load_statistics). "
                    "Purple marks: load changes the detector found.",
    ), 12, 8)
    stats = (("utilization", recorded.POOL_UTILIZATION, s),
             ("demand", recorded.POOL_DEMAND, pools))  # per pool: no model label
    columns = [(f"{statistic_name(source, stat, window)}{match}",
                f"{name} {stat} {range_name(window)}")
               for name, source, match in stats for window in (HOUR, 24 * HOUR)
               for stat in ("mean", "stddev", "p95")]
    layout.add(p.table(
        "Load statistics by pool",
        p.targets(*((expr, "") for expr, _ in columns), instant=True),
        "percentunit", hide=("cluster", "job"),
        rename={f"Value #{chr(ord('A') + i)}": title for i, (_, title) in enumerate(columns)},
        order=("pool", "model", *(title for _, title in columns)), sort_by="pool",
        descending=False,
        description="Mean, standard deviation and p95 of GPU utilization and demand ratio "
                    "over the last hour and day. A stddev far above its usual level is a "
                    "load change.",
    ), 12, 8)
    layout.add(p.timeseries(
        "Recommended nodes by pool",
        p.targets(
            (f"{m.POOL_RECOMMENDED_NODES.name}{pools}", "{{pool}} recommended"),
            (f"count by (cluster, pool) ({m.NODE_INFO.name}{s})", "{{pool}} now"),
        ),
        "none", minimum=0, step_after=True,
        description="The scaling hint (the table's scaling section) against the nodes the "
                    "pool has; see docs/load.md to act on it.",
    ), 12, 8)
    layout.add(p.timeseries(
        "Node pressure (top 10)",
        # `|`: node_exporter's series have a cluster label only where the scrape sets one
        p.targets((f'topk(10, {recorded.NODE_PRESSURE_SCORE}{{cluster=~"$cluster|"}})',
                   "{{instance}}")),
        "percentunit", steps=levels.steps("node_pressure_score"), minimum=0, maximum=1,
        description="0.4 min(cpu/0.9, 1) + 0.35 min(mem/0.85, 1) + 0.25 min(io/0.7, 1) from "
                    f"node_exporter, for every node it runs on. Line: NodePressureHigh's "
                    f"level from {levels.source}.",
    ), 12, 8)


def _preemption_row(layout: p.Layout, levels: DashboardLevels) -> None:
    """Issue 43: what the scheduler's preemptions cost each pool (exporter/preemption/): the
    overhead GpuPoolPreemptionOverheadHigh compares with its level, the stops by cause, and
    the stopped jobs waiting to resume. Per pool: the families carry no model."""
    pools = q.selector(q.POOL)
    layout.row("Preemption")
    layout.add(p.timeseries(
        "Preemption overhead by pool",
        p.targets((levels.query("pool_preemption_overhead", pools), "{{pool}}")),
        "percentunit", steps=levels.steps("pool_preemption_overhead"), minimum=0,
        description="GPU-seconds the stopped jobs lost (from each one's last checkpoint to its "
                    "stop) over the GPU-seconds the pool delivered, over the last 6h. Line: "
                    f"GpuPoolPreemptionOverheadHigh's level from {levels.source}.",
    ), 10, 8)
    layout.add(p.timeseries(
        "Stopped jobs by pool and cause (1h)",
        p.targets((f"sum by (cluster, pool, cause) (increase({m.PREEMPTIONS_TOTAL.name}"
                   f"{pools}[1h]))", "{{pool}} {{cause}}")),
        "none", minimum=0,
        description="Jobs the scheduler preempted, requeued, suspended or evicted in the last "
                    "hour (cause: requeue and suspend from Slurm, the DisruptionTarget reasons "
                    "from Kubernetes).",
    ), 7, 8)
    layout.add(p.timeseries(
        "Jobs waiting to resume",
        p.targets((f"sum by (cluster, pool) ({m.PREEMPTED_JOBS_WAITING.name}{pools})",
                   "{{pool}} waiting"),
                  # 0 where none waits: the per-job family has no series then
                  (f"max by (cluster, pool) ({m.JOB_PREEMPTED_WAIT_SECONDS.name}{pools}) / 60\n"
                   f"or sum by (cluster, pool) ({m.PREEMPTED_JOBS_WAITING.name}{pools}) * 0",
                   "{{pool}} longest wait (min)")),
        "none", minimum=0, step_after=True,
        description="Stopped jobs not yet resumed (requeued and pending, or suspended), and "
                    "the longest such wait in minutes (0 while none waits).",
    ), 7, 8)


def _health_row(layout: p.Layout, levels: DashboardLevels) -> None:
    """How many GPUs are in each health condition the node dashboard's health row draws
    (issue 16), coloured at the severity of the alert on it; then the fleet's events."""
    s = q.selector(q.FLEET)
    layout.row("Health")
    dbe = q.selector(q.FLEET, 'type="double_bit"', 'counter="volatile"')
    link = q.selector(q.FLEET, 'type=~"replay|recovery"')
    for title, expr, steps, description in (
        ("GPUs with XID errors",
         f"count(count by (cluster, node, gpu) ({q.xid_events(s, '$__range')}))",
         levels.any_of("gpu_xid_critical"),
         "GPUs that reported any XID in the time range (GpuXidError pages for the table's "
         "critical XIDs only)."),
        ("GPUs with uncorrectable ECC errors",
         f"count({m.GPU_ECC_ERRORS_TOTAL.name}{dbe} > 0)", levels.any_of("gpu_ecc_double_bit"),
         "GPUs with a double-bit ECC error since their driver loaded (volatile count)."),
        ("GPUs with a row remap pending", f"count({m.GPU_REMAPPED_ROWS_PENDING.name}{s} == 1)",
         levels.any_of("gpu_remapped_rows_pending"),
         "GPUs whose remapped rows wait for a GPU reset."),
        ("GPUs with a row remap failed", f"count({m.GPU_REMAPPED_ROWS_FAILURE.name}{s} == 1)",
         levels.any_of("gpu_remapped_rows_failure"),
         "GPUs with no spare memory rows left: to be replaced."),
        ("GPUs throttled now", f"count({q.slowdown(q.FLEET)} == 1)",
         levels.any_of("gpu_clock_slowdown"),
         "GPUs whose clocks a thermal or power-brake slowdown holds down now, busy or not "
         "(GpuClocksThrottled waits for most of 10 min on a busy GPU)."),
        ("GPUs with NVLink errors",
         f"count(max by (cluster, node, gpu) (increase({m.GPU_NVLINK_ERRORS_TOTAL.name}{link}"
         "[$__range])) > 0)",
         levels.any_of("gpu_nvlink_link_errors"),
         "GPUs whose NVLink replayed or recovered in the time range."),
    ):
        layout.add(p.stat(title, p.targets((f"{expr} or vector(0)", "")), "none", steps=steps,
                          color_mode="background", graph=False,
                          description=f"{description} 0 also where no source reports it."),
                   4, 4)
    ecc = q.selector(q.FLEET, 'counter="volatile"')
    layout.add(p.timeseries(
        "Health events",
        p.targets(
            (f"sum({q.xid_events(s, '$__rate_interval')}) or vector(0)", "XID"),
            (f"sum by (type) (increase({m.GPU_ECC_ERRORS_TOTAL.name}{ecc}[$__rate_interval]))",
             "ECC {{type}}"),
            (f"sum by (type) (increase({m.GPU_NVLINK_ERRORS_TOTAL.name}{s}[$__rate_interval]))",
             "NVLink {{type}}"),
        ),
        "none", minimum=0,
        description="Events per interval over the selected GPUs: XIDs (a GPU's first of a "
                    "code included), ECC errors (volatile) and NVLink errors by type.",
    ), 12, 8)
    layout.add(p.timeseries(
        "GPUs held down, by reason",
        p.targets((f"sum by (reason) ({m.GPU_CLOCK_EVENT_ACTIVE.name}{s})", "{{reason}}")),
        "none", minimum=0, step_after=True,
        description="GPUs whose clocks each clock-event reason holds down (a GPU may have "
                    "several). sw_power_cap is normal at the cap; hw_thermal, sw_thermal, "
                    "hw_power_brake and hw_slowdown are slowdowns (GpuClocksThrottled).",
    ), 12, 8)


def _verdict_row(layout: p.Layout, levels: DashboardLevels) -> None:
    """Issue 31, Build 1: the advisor's health verdicts, what remediation did and the jobs
    with a straggler (docs/health.md). The families come from the cluster-mode process's
    advisor; two such exporters serve the same counts, so each is the larger of theirs
    (``max by`` its own labels), as the reliability rules take it, never their sum. The
    per-pool families have a series for every pool from the first collection (0 included),
    the counts of things that may be none are ``or vector(0)``: every panel has a value on
    a healthy fleet."""
    pools = q.selector(q.POOL)
    cluster = q.selector(q.CLUSTER)
    layout.row("GPU health verdicts and remediation")
    layout.add(p.stat(
        "GPUs by verdict",
        p.targets((f"sum by (verdict) (max by (cluster, pool, verdict) "
                   f"({m.HEALTH_GPUS.name}{pools}))", "{{verdict}}")),
        "none", graph=False, text_mode="value_and_name",
        description="GPUs by the advisor's health verdict: healthy (the working GPUs), "
                    "unknown (stale readings, no health counters), degraded (slower or a "
                    "repair pending), failing (a critical XID, an uncorrectable ECC error, a "
                    "failed row remap, lost). Not filtered by model: verdicts are per pool.",
    ), 8, 4)
    for title, family, steps, description in (
        ("Nodes drained by gpufleet", m.REMEDIATION_DRAINED_NODES, None,
         "Nodes gpufleet advised draining and has not yet resumed."),
        ("Budget-blocked nodes", m.REMEDIATION_BUDGET_BLOCKED_NODES, None,
         "Failing nodes a drain budget kept in service: their pool paged instead (an XID "
         "storm, a driver bug, a power event?)."),
    ):
        layout.add(p.stat(title, p.targets((f"sum(max by (cluster, pool) ({family.name}{pools})) "
                                            "or vector(0)", "")),
                          "none", steps=steps, graph=False, description=description), 4, 4)
    # the exporter's `job` label arrives as exported_job (honor_labels: false) or stays job
    layout.add(p.stat(
        "Jobs with a straggler",
        p.targets((f"count(max by (cluster, exported_job, job, namespace, account) "
                   f"({m.JOB_STRAGGLER_GPUS.name}{cluster})) or vector(0)", "")),
        "none", steps=levels.any_of("job_straggler_gpus"), color_mode="background", graph=False,
        description="Multi-GPU jobs with a GPU out of step with its peers for the straggler "
                    "duration (GpuJobStraggler tickets their owner; the GPU is in "
                    "/v1/advice's health.stragglers). Every job of the cluster: jobs carry "
                    "no pool.",
    ), 8, 4)
    verdicts = ("healthy", "unknown", "degraded", "failing")
    nodes = {v: m.HEALTH_NODES.name + q.selector(q.POOL, f'verdict="{v}"') for v in verdicts}
    layout.add(p.table(
        "Nodes by verdict per pool",
        p.targets(*((f"sum by (pool) (max by (cluster, pool) ({nodes[v]}))", v) for v in verdicts),
                  instant=True),
        "none", rename={f"Value #{chr(ord('A') + i)}": v for i, v in enumerate(verdicts)},
        order=("pool", *verdicts), sort_by="pool", descending=False,
        description="A node's verdict is its worst GPU's; a node with no GPU reading is "
                    "unknown.",
    ), 12, 8)
    layout.add(p.stat(
        "Remediation events by action",
        p.targets((f"round(sum by (action) (max by (cluster, action) "
                   f"(increase({m.REMEDIATION_EVENTS_TOTAL.name}{cluster}[$__range]))))",
                   "{{action}}")),
        "none", graph=False, text_mode="value_and_name",
        description="Events the advisor decided in the time range, by action: drain, "
                    "reset_gpu, resume, replace (advice), page (a pool over the drain budget). "
                    "Every action of the cluster: events carry no pool.",
    ), 12, 8)


def _reliability_row(layout: p.Layout) -> None:
    """Issue 31, Build 5: the fleet reliability recording rules (rules/gpufleet-recording.yaml,
    group gpufleet-health-recording; docs/metrics.md, "Fleet reliability").

    The two mean times have no value until gpufleet drained (resumed) a node in 7 days: a mean
    over no event is no number, and 0 would read "remediated at once". They show the
    recorded series as it is, with "none in 7 days" where it has no value, rather than a
    fake 0 or a total standing in for the mean: the simplest honest panel.
    tests/test_dashboards_prometheus.py's fleet drains and resumes a node (its XID, a short
    clean window and minimum drain), so both panels are proven against real data there, no
    exception needed; rules/tests/health_reliability.yaml pins the rules' values."""
    pools = q.selector(q.POOL)
    cluster = q.selector(q.CLUSTER)
    layout.row("Reliability")
    layout.add(p.stat(
        "Repeat offenders",
        p.targets((f"count({recorded.NODE_REPEAT_OFFENDER}{pools}) or vector(0)", "")),
        "none", graph=False,
        description="Nodes with the threshold table's health.remediation.replace_after_faults "
                    "faults or more in its replace_window (3 in 7 days): the advisor advises "
                    "replacing them.",
    ), 8, 4)
    for title, series, none, description in (
        ("Mean time from fault to drain (7 days)", recorded.CLUSTER_FAULT_TO_DRAIN,
         "no drain in 7 days",
         "From a node turning failing to gpufleet advising its drain, over the drains of the "
         "last 7 days; above 0 only when a budget held a drain back."),
        ("Mean time from drain to resume (7 days)", recorded.CLUSTER_DRAIN_TO_RESUME,
         "no resume in 7 days",
         "How long a node gpufleet drained stayed out of service, over the resumes of the last "
         "7 days."),
    ):
        layout.add(p.stat(title, p.targets((f"{series}{cluster}", "{{cluster}}")), "s",
                          graph=False, no_value=none,
                          description=f"{description} Per cluster: the events carry no pool."),
                   8, 4)
    windows = (("7 days", recorded.CLUSTER_FAULTS_7D), ("30 days", recorded.CLUSTER_FAULTS_30D))
    layout.add(p.table(
        "Interruptions by cause",
        p.targets(*((f"round(sum by (cause) ({series}{cluster}))", title)
                    for title, series in windows), instant=True),
        "none", rename={f"Value #{chr(ord('A') + i)}": title for i, (title, _) in enumerate(windows)},
        order=("cause", *(title for title, _ in windows)), sort_by="30 days",
        description="GPUs that turned failing, by cause (xid, ecc, remap_failure, gpu_lost), "
                    "over 7 and 30 days (Prometheus keeps 15 days by default: 30 days is what "
                    "it keeps). Per cluster, not filtered by pool.",
    ), 10, 8)
    layout.add(p.table(
        "Shortest mean time between faults (10 nodes)",
        p.targets((f"bottomk(10, {recorded.NODE_TIME_BETWEEN_FAULTS}{pools})", ""), instant=True),
        "s", rename={"Value": "mean time between faults"}, order=("node", "pool", "Value"),
        sort_by="Value", descending=False,
        description="The replace window (7 days) over the node's faults in it, for the nodes "
                    "with a fault; empty while no node had one.",
    ), 14, 8)
