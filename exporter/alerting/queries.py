"""The PromQL each metric of the threshold table compares, and how its alerts describe it.

The table (:mod:`exporter.thresholds`) names a metric by its key (``gpu_temperature``)
and knows its unit, subject and comparisons; this module gives the same key its PromQL
value and description, and is the only place that does. Every family name comes from
the catalogue (:mod:`exporter.metrics`), every recorded series from
:mod:`exporter.alerting.recorded`: no metric name is typed here.

``expr`` may contain ``{exporter_jobs}``, filled from the table (an alternation of
its job names; an ``absent_too`` query gets one ``absent()`` per job), and
``{critical_xids}`` (an alternation of the table's ``critical_xids``). ``describe``
is the description annotation, with ``<VALUE>``, ``<RELATION>``, ``<THRESHOLD>`` and
``<FOR>`` filled per rule; Prometheus templates (``{{ $labels.gpu }}``) pass through
untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter import metrics as m
from exporter.alerting import recorded


@dataclass(frozen=True, slots=True)
class AlertQuery:
    """What one table metric compares in PromQL, and the alert's description of it."""

    expr: str
    describe: str
    cap: str = ""  # relative metrics: the per-GPU limit their fractions are of
    absent_too: bool = False  # also fires when the series is absent


_GPU = "GPU {{ $labels.gpu }} on {{ $labels.node }} ({{ $labels.model }}, pool {{ $labels.pool }})"
_POOL = "Pool {{ $labels.pool }} ({{ $labels.model }})"
# Clock-event reasons that mean a hardware or thermal slowdown (not the power cap, which
# is GpuPowerHigh's, nor sync boost, which follows another GPU).
SLOWDOWN_REASONS = m.SLOWDOWN_REASONS  # the dashboards and the health verdicts too
_XIDS = f'{m.GPU_XID_ERRORS_TOTAL.name}{{xid=~"{{critical_xids}}"}}'
_UP = 'up{job=~"{exporter_jobs}"}'  # Prometheus' own series for each gpufleet target


def _growth(selector: str) -> str:
    """How much a driver lifetime counter grew in the last 10 min: now less the window's
    lowest value. Not ``increase()``: on a series' first appearance Prometheus sees no
    growth but VictoriaMetrics counts its first value as growth from 0, so a GPU first seen
    with an old lifetime NVLink or ECC count would open a ticket or page on one engine
    only. Now minus the minimum reads the same samples the same way on both: an old count
    that does not grow is 0, a first error of a new series counts at once, and a counter
    reset (a GPU reset zeroes the volatile ECC count) never reads as growth."""
    return f"(\n  {selector}\n  - min_over_time({selector}[10m])\n)"

QUERIES: dict[str, AlertQuery] = {
    "gpu_utilization": AlertQuery(
        m.GPU_UTILIZATION_RATIO.name,
        f"{_GPU} is held by a job but <VALUE> busy, <RELATION> <THRESHOLD> for <FOR>."),
    # A job, not each of its GPUs: 8 idle GPUs of one job are one ticket for its owner.
    # The recorded average is over the job's GPUs; `job_gpus` and `account` ride along
    # (constant for a job), the pod does not, so a replaced pod keeps the `for` clock.
    "job_utilization": AlertQuery(
        recorded.JOB_UTILIZATION,
        "Job {{ $labels.exported_job }} (account {{ $labels.account }}) holds "
        "{{ $labels.job_gpus }} GPU(s) at <VALUE> average utilization, <RELATION> "
        "<THRESHOLD> for <FOR>: {{ with printf "
        f"`avg_over_time({recorded.JOB_IDLE}{{cluster=%q,exported_job=%q}}[1h])` "
        "$labels.cluster $labels.exported_job | query }}"
        '{{ . | first | value | printf "%.1f" }}{{ end }} GPU-hours idle in the last hour.'),
    # Only a checkpoint the job states (a Slurm comment's last-checkpoint=, the pod
    # annotation gpufleet.io/last-checkpoint) says the job is one that checkpoints, i.e.
    # a training job: an `assumed` age restarts every advisor.checkpoint_interval by
    # construction and can never be stale. Maxed by the job's constant labels, so a
    # replaced or second exporter (its instance) does not restart the `for` clock.
    "job_checkpoint_age": AlertQuery(
        "max by (cluster, exported_job, namespace, account) (\n"
        f'  {m.JOB_CHECKPOINT_AGE_SECONDS.name}{{source="stated"}}\n)',
        # a scheduler without accounts leaves the label empty (not stored): said only
        # when there is one
        "Job {{ $labels.exported_job }}{{ with $labels.account }} (account {{ . }})"
        "{{ end }} last checkpointed <VALUE> ago, <RELATION> <THRESHOLD> for <FOR>: "
        "that much work of each GPU it holds is not saved."),
    # Multi-node jobs only (the family has no series for a single-node job); maxed by
    # the job's constant labels for the same reason as above.
    "job_nvlink_generations": AlertQuery(
        f"max by (cluster, exported_job, namespace) ({m.JOB_NVLINK_GENERATIONS.name})",
        "Multi-node job {{ $labels.exported_job }}{{ with $labels.namespace }} "
        "(namespace {{ . }}){{ end }} runs on GPUs of <VALUE> NVLink generations for "
        "<FOR>: they do not interconnect (Blackwell's NVLink 5, Hopper's NVLink 4), "
        "so its traffic "
        "between them falls back to the network."),
    # Only jobs with a straggler have the series, and only once a GPU has been outside its
    # peers for the table's health.stragglers.for (issue 31): the series is the verdict, the
    # alert's `for` only waits out one collection. Maxed by the job's constant labels, as
    # above, so a second cluster-mode exporter does not restart the clock.
    "job_straggler_gpus": AlertQuery(
        f"max by (cluster, exported_job, namespace, account) ({m.JOB_STRAGGLER_GPUS.name})",
        "Job {{ $labels.exported_job }}{{ with $labels.namespace }} (namespace {{ . }})"
        "{{ end }}{{ with $labels.account }} (account {{ . }}){{ end }} has <VALUE> GPU(s) "
        "out of step with its peers (<RELATION> <THRESHOLD>, for <FOR>): the whole job runs "
        "at its slowest GPU's pace."),
    "gpu_memory_used": AlertQuery(
        recorded.GPU_MEMORY_USED,
        f"{_GPU} has <VALUE> of its memory in use, <RELATION> <THRESHOLD> for <FOR>."),
    "gpu_temperature": AlertQuery(
        m.GPU_TEMPERATURE_CELSIUS.name,
        f"{_GPU} is at <VALUE>, <RELATION> <THRESHOLD> for <FOR>."),
    # Power alone, on every source (dcgm-exporter's default counters report no clock
    # events): compared with the recorded limit, the enforced one or the catalogue TDP
    # where none is reported (exporter/alerting/rules.py records it).
    "gpu_power": AlertQuery(
        m.GPU_POWER_WATTS.name,
        f"{_GPU} draws <VALUE>, <RELATION> <THRESHOLD> for <FOR>.",
        cap=recorded.GPU_POWER_LIMIT),
    # Held back by the power cap: the share of the last 5 min NVML's clock-event reason
    # sw_power_cap held the clocks down. Its own row, so GpuPowerHigh fires on power alone
    # and this one only where clock events exist (GPUs without them have no series).
    "gpu_power_capped": AlertQuery(
        f'avg_over_time({m.GPU_CLOCK_EVENT_ACTIVE.name}{{reason="sw_power_cap"}}[5m])',
        f"{_GPU} is busy but had its clocks held down by the software power cap <VALUE> "
        "of the last 5m (<RELATION> <THRESHOLD>, for <FOR>): the job runs slower than "
        "the GPU could."),
    "gpu_nvlink_utilization": AlertQuery(
        recorded.GPU_NVLINK_UTILIZATION,
        f"{_GPU} runs a multi-GPU job but uses <VALUE> of its NVLink bandwidth, "
        "<RELATION> <THRESHOLD> for <FOR>."),
    # Less the pool's tier-inversion penalty, as the cluster's below (the reasons there).
    "pool_fragmentation_index": AlertQuery(
        f"{m.POOL_FRAGMENTATION_INDEX.name} - ({m.POOL_TIER_INVERSION_PENALTY.name} or "
        f"{m.POOL_FRAGMENTATION_INDEX.name} * 0)",
        f"{_POOL} has a fragmentation index of <VALUE> without its tier-inversion penalties, "
        "<RELATION> <THRESHOLD> for <FOR>: idle GPUs are scattered so that large jobs cannot "
        "start."),
    # Less the tier-inversion penalty, as the advisor judges it (docs/simulate.md, "Tier
    # inversion"): an idle higher tier beside a busy lower one is no fragmentation, no
    # compaction recovers it, and the advisor answers `none` to it; it must not page the
    # advisor. Plain one-to-one matching: both series come from the same target with the
    # same labels (Prometheus and VictoriaMetrics alike). A target that does not export the
    # penalty yet (rules upgraded before the exporter) counts it as 0, so the alert keeps
    # firing on the index there instead of never firing.
    "cluster_fragmentation_index": AlertQuery(
        f"{m.CLUSTER_FRAGMENTATION_INDEX.name} - ({m.CLUSTER_TIER_INVERSION_PENALTY.name} or "
        f"{m.CLUSTER_FRAGMENTATION_INDEX.name} * 0)",
        "The cluster has a fragmentation index of <VALUE> without its tier-inversion "
        "penalties, <RELATION> <THRESHOLD> for <FOR>: idle GPUs are scattered so that large "
        "jobs cannot start."),
    "gpu_up": AlertQuery(
        m.GPU_UP.name,
        f"{_GPU} has not answered for <FOR>: it is lost or every read of it fails."),
    # XIDs are events: an increase over 10 min holds the alert for 10 min after one,
    # long enough to be seen, short enough to resolve once the GPU is quiet again.
    # A GPU's first XID of a code creates its series at 1, which increase() cannot see
    # (no earlier sample): a series new in the last 10 min counts too, if the GPU's
    # last XID is that recent (so a restarted Prometheus does not page on old ones).
    # The increase is filtered first: `or` would keep its 0 over the new series' 1.
    "gpu_xid_critical": AlertQuery(
        f"(\n  increase({_XIDS}[10m]) > 0\n"
        "  or\n"
        f"  ({_XIDS}\n"
        f"    unless {_XIDS} offset 10m)\n"
        "  and on (cluster, node, gpu)\n"
        f"    time() - {m.GPU_LAST_XID_TIMESTAMP_SECONDS.name} < {{event_window_seconds}}\n)",
        f"{_GPU} reported XID {{{{ $labels.xid }}}} (<VALUE> in the last 10m, "
        "for <FOR>), an error that needs a human: see the runbook for what it means."),
    "gpu_ecc_double_bit": AlertQuery(
        _growth(f'{m.GPU_ECC_ERRORS_TOTAL.name}{{type="double_bit",counter="volatile"}}'),
        f"{_GPU} had <VALUE> uncorrectable (double-bit) ECC error(s) in the last 10m: "
        "the data of the job on it may be corrupt."),
    "gpu_remapped_rows_failure": AlertQuery(
        m.GPU_REMAPPED_ROWS_FAILURE.name,
        f"{_GPU} failed to remap a memory row (for <FOR>): it has run out of spare "
        "rows."),
    "gpu_remapped_rows_pending": AlertQuery(
        m.GPU_REMAPPED_ROWS_PENDING.name,
        f"{_GPU} has memory rows waiting to be remapped for <FOR>; the remap happens "
        "at the next GPU reset."),
    # Hardware or thermal slowdown, one series per GPU: hw_slowdown is set together with
    # hw_thermal or hw_power_brake (NVML's HW_SLOWDOWN covers both), so the reasons are
    # folded with max, not summed. The share of the last 10 min each reason held the
    # clocks down; the description names the reasons that did (a query, sorted).
    "gpu_clock_slowdown": AlertQuery(
        "max without (reason) (\n"
        f"  avg_over_time({m.GPU_CLOCK_EVENT_ACTIVE.name}{{reason=~\"{SLOWDOWN_REASONS}\"}}"
        "[10m])\n)",
        f"{_GPU} is busy but had its clocks held down <VALUE> of the last 10m "
        "(<RELATION> <THRESHOLD>, for <FOR>) by {{ range $i, $s := printf "
        f"`avg_over_time({m.GPU_CLOCK_EVENT_ACTIVE.name}{{cluster=%q,node=%q,gpu=%q,"
        f'reason=~"{SLOWDOWN_REASONS}"}}[10m]) > 0` '
        "$labels.cluster $labels.node $labels.gpu | query | sortByLabel `reason` }}"
        "{{ if $i }}, {{ end }}{{ $s.Labels.reason }}{{ end }}: the job runs slower."),
    # NVLink counters summed over the GPU's links, by type. Replays and recoveries are
    # link errors at any count (DCGM's health watch: DCGM_LIMIT_MAX_NVLINK_ERROR 1);
    # CRC errors are corrected by a replay and matter only at 100 a second or more
    # (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR, "RM has informed us that CRC errors only matter
    # at rates of 100+ per second"), so they have a row and a threshold of their own.
    "gpu_nvlink_link_errors": AlertQuery(
        _growth(f'{m.GPU_NVLINK_ERRORS_TOTAL.name}{{type=~"replay|recovery"}}'),
        f"{_GPU} counted <VALUE> NVLink {{{{ $labels.type }}}} error(s) in the last "
        "10m (<RELATION> <THRESHOLD>, for <FOR>): a link retransmits or retrains."),
    "gpu_nvlink_crc_errors": AlertQuery(
        _growth(f'{m.GPU_NVLINK_ERRORS_TOTAL.name}{{type=~"crc_flit|crc_data"}}'),
        f"{_GPU} counted <VALUE> NVLink {{{{ $labels.type }}}} CRC errors in the last "
        "10m, <RELATION> <THRESHOLD>, for <FOR>: a link is degrading."),
    # SM activity is GPM's (Hopper and later) or DCGM's profiling field; GPUs without it
    # have no series and never fire. Utilization counts time any kernel ran, so a job
    # spinning on a lock or waiting on a peer reads busy while its SMs idle.
    "gpu_sm_active": AlertQuery(
        m.GPU_SM_ACTIVE_RATIO.name,
        f"{_GPU} reads as busy, but its SMs were active <VALUE> of the time, "
        "<RELATION> <THRESHOLD> for <FOR>: its kernels run but do little work."),
    "source_up": AlertQuery(
        m.SOURCE_UP.name,
        "Source {{ $labels.source }}{{ with $labels.target }} (target {{ . }}){{ end }} "
        "on {{ $labels.instance }} has failed for <FOR>; its GPUs are served stale."),
    # Fleet-wide: every exporter's instance of the source fails (the cluster mode's only
    # Prometheus or Slurm reader, or NVML on every node): nothing is seen, so it pages.
    "fleet_source_up": AlertQuery(
        f'max by (cluster, source) ({m.SOURCE_UP.name}{{target=""}})',
        "Source {{ $labels.source }} has failed on every gpufleet that runs it for "
        "<FOR>: the whole fleet is served stale."),
    "exporter_up": AlertQuery(
        _UP,
        "gpufleet target {{ $labels.instance }} of job {{ $labels.job }} has been "
        "down for <FOR>: its GPUs' metrics are not collected."),
    # Every target of a job down, or the job gone from service discovery: the fleet
    # (node mode) or its analysis (cluster mode) is blind, and no alert can fire.
    "exporter_job_up": AlertQuery(
        f"max by (job) ({_UP})",
        "No target of gpufleet job {{ $labels.job }} has answered for <FOR> (or the "
        "job has no target at all): no GPU metrics are collected.",
        absent_too=True),
    # The watchdog (issue 32, Build 1): the snapshot an exporter serves stops aging only
    # when a collection finishes. /-/ready turns 503 past web.stall_intervals collect
    # intervals (15 s by default), but nothing scrapes /-/ready; this reads the same
    # stall from /metrics, which keeps serving the old snapshot.
    "snapshot_age": AlertQuery(
        f"time() - {m.SNAPSHOT_TIMESTAMP_SECONDS.name}",
        "The snapshot gpufleet {{ $labels.instance }} serves is <VALUE> old, <RELATION> "
        "<THRESHOLD>, and has been for <FOR>: its collection has stalled, and every GPU "
        "value and alert of it is frozen."),
    # errors in the last 10 min, not a rate: "3 inserts failed" reads better than
    # 0.005/s, and a row's `for` longer than the window makes one blip never fire
    "advisor_outbox_errors": AlertQuery(
        f"increase({m.ADVISOR_OUTBOX_ERRORS_TOTAL.name}[10m])",
        "The advisor's outbox on {{ $labels.instance }} failed <VALUE> "
        "{{ $labels.operation }} operations in the last 10m (<RELATION> <THRESHOLD>) "
        "and has kept failing for <FOR>: plans that cannot be written wait in memory, "
        "with no cooldown."),
    # Node pressure (issue 20): series recorded from node_exporter's by the `pressure`
    # section's rules (exporter/alerting/pool_load_rules.py). One row per resource holds its
    # bands: warning is the medium band, critical the high one.
    "node_cpu_busy": AlertQuery(
        recorded.NODE_CPU_BUSY,
        "Node {{ $labels.instance }} has its CPUs <VALUE> busy, <RELATION> "
        "<THRESHOLD> for <FOR>."),
    "node_memory_used": AlertQuery(
        recorded.NODE_MEMORY_USED,
        "Node {{ $labels.instance }} has <VALUE> of its memory in use (1 - "
        "MemAvailable/MemTotal), <RELATION> <THRESHOLD> for <FOR>."),
    "node_disk_io_busy": AlertQuery(
        recorded.NODE_DISK_IO_BUSY,
        "Node {{ $labels.instance }} has its busiest disk doing I/O <VALUE> of the "
        "time, <RELATION> <THRESHOLD> for <FOR>."),
    "node_pressure_score": AlertQuery(
        recorded.NODE_PRESSURE_SCORE,
        "Node {{ $labels.instance }} has a pressure score of <VALUE> of the "
        "maximum (CPU, memory and disk I/O, weighted against their caps), "
        "<RELATION> <THRESHOLD> for <FOR>."),
}

__all__ = ["QUERIES", "SLOWDOWN_REASONS", "AlertQuery"]
