"""The table's vocabulary: one record per metric a row of ``rules/thresholds.yaml`` compares.

A :class:`TableMetric` holds every fact of one concept, written once: its key (a row's
``metric:``, ``gpu_temperature``), its unit, the object it is about, the comparisons that
make sense for it, the PromQL its alerts compare and their description. The table's loader
checks rows against it (:mod:`exporter.thresholds.table`), the rules compare its expression
(:mod:`exporter.alerting.rules`), and a dashboard panel coloured at a row's levels plots
that same expression (:meth:`Thresholds.panel_query
<exporter.thresholds.table.Thresholds.panel_query>`: restricted to the row's scope, over
the series the panel's variables select), so a gauge that turns a colour means the alert
with those levels would fire on what it shows.

Every family name comes from the catalogue (:mod:`exporter.metrics`), every recorded series
from :mod:`exporter.thresholds.recorded`: no metric name is typed here.

``expr`` may contain ``{exporter_jobs}``, filled from the table (an alternation of its job
names; an ``absent_too`` metric gets one ``absent()`` per job), ``{critical_xids}`` (an
alternation of the table's ``critical_xids``) and ``{event_window_seconds}``
(:meth:`TableMetric.filled`). ``describe`` is the description annotation, with ``<VALUE>``,
``<RELATION>``, ``<THRESHOLD>`` and ``<FOR>`` filled per rule; Prometheus templates
(``{{ $labels.gpu }}``) pass through untouched.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from exporter import metrics as m
from exporter.thresholds import recorded

EVENT_WINDOW_SECONDS = 600.0  # XIDs: how recent a new series' last XID must be (the [10m])
# Preemption overhead: the window its lost and delivered GPU-seconds are taken over
PREEMPTION_WINDOW = "6h"


def promql_number(value: float) -> str:
    """A PromQL literal: 0.3, 650, 325.5; never 650.0 or 0.30000000000000004."""
    return f"{value:.10g}"


def regex_alternatives(names: tuple[str, ...]) -> str:
    """An RE2 alternation of literal names, escaped for a PromQL double-quoted string."""
    special = set(r".+*?()[]{}|^$\\")
    return "|".join("".join(f"\\\\{c}" if c in special else c for c in name) for name in names)


@dataclass(frozen=True, slots=True)
class TableMetric:
    """One metric of the table: what a row may compare, and how its alerts compare it."""

    key: str  # the row's `metric:`, the one name of the concept from the table to the panel
    unit: str  # ratio | celsius | watts | index | state | count | seconds
    subject: str  # gpu | job | pool | cluster | source | target | advisor | node
    ops: tuple[str, ...]  # the comparisons that make sense for it
    expr: str  # the PromQL value each rule compares with the row's levels
    describe: str  # the description annotation (the placeholders above)
    cap: str = ""  # per-model metrics: the per-GPU limit their fractions are of
    absent_too: bool = False  # also fires when the series is absent
    # per-GPU series the comparison must also find for the GPU (`and on` its place): the
    # evidence that the level reached is a fault, not a busy GPU doing its work
    evidence: str = ""
    # a label whose values ``expr`` selects with one alternation (``type=~"a|b"``): the rules
    # are one per value, each with an exact matcher (:meth:`one_value`), so that no rule reads
    # every value's series; a panel still plots them all with the alternation
    each: tuple[str, tuple[str, ...]] | None = None

    @property
    def relative_to_tdp(self) -> bool:
        """Levels are fractions of each model's TDP (of ``cap``), or the row's watts."""
        return bool(self.cap)

    def filled(self, exporter_jobs: tuple[str, ...], critical_xids: tuple[int, ...]) -> str:
        """``expr`` with the table's facts in place of its placeholders."""
        return (self.expr
                .replace("{exporter_jobs}", regex_alternatives(exporter_jobs))
                .replace("{critical_xids}", "|".join(str(code) for code in critical_xids))
                .replace("{event_window_seconds}", promql_number(EVENT_WINDOW_SECONDS)))

    def one_value(self, expr: str, value: str) -> str:
        """``expr`` (this metric's, filled) selecting only ``value`` of the ``each`` label."""
        assert self.each is not None and value in self.each[1], (self.key, value)
        label, values = self.each
        alternation = f'{label}=~"{regex_alternatives(values)}"'
        assert alternation in expr, (self.key, alternation)
        return expr.replace(alternation, f'{label}="{value}"')


# Per-GPU series are joined on the GPU's place, not on every label: `and` needs no
# one-to-one match, so two exporters scraping one fleet still work. `cluster` (the
# exporter's `cluster` setting) keeps two clusters' gpu-001 apart.
GPU_MATCH = "on (cluster, node, gpu)"


def scope_filter(scope: str, busy_utilization: float) -> str:
    """The lines that restrict a per-GPU value to the GPUs a row's ``scope`` covers
    (``and``: the value's labels and number stay), empty for ``all``."""
    busy_gpus = (f"\nand {GPU_MATCH}\n  {m.GPU_UTILIZATION_RATIO.name} > "
                 f"{promql_number(busy_utilization)}")
    if scope == "allocated":
        return f"\nand {GPU_MATCH}\n  {m.GPU_ALLOCATED_RATIO.name} > 0"
    if scope == "busy":
        return busy_gpus
    if scope == "busy_multi_gpu":
        # job_gpus is the job's GPU count as a label; counting by GPU drops the job's
        # name and pod, so a replaced pod leaves the alert's clock running.
        return (f"{busy_gpus}\nand {GPU_MATCH}\n"
                f'  count by (cluster, node, gpu) ({m.GPU_ALLOCATION_INFO.name}{{job_gpus!="1"}})')
    return ""


@functools.cache  # compiled where a dashboard needs it, not at every start of the CLI (15 ms)
def _series_pattern() -> re.Pattern[str]:
    names = {*m.CATALOGUE, "up",
             *(value for name, value in vars(recorded).items() if name.isupper())}
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![\w:])({alternatives})(\{{[^{{}}]*\}})?(?![\w:{{])")


def with_matchers(expr: str, selector: str) -> str:
    """``expr`` with the matchers of ``selector`` (``{pool=~"$pool"}``, a dashboard's
    variables) on every series it reads, before the series' own: the same expression over
    the series the selector picks. An empty selector leaves ``expr`` as it is."""
    matchers = selector.strip()[1:-1] if selector.strip() else ""
    if not matchers:
        return expr

    def selected(match: re.Match[str]) -> str:
        own = (match.group(2) or "{}")[1:-1]
        return f"{match.group(1)}{{{matchers}{',' if own else ''}{own}}}"
    return _series_pattern().sub(selected, expr)


_GPU = "GPU {{ $labels.gpu }} on {{ $labels.node }} ({{ $labels.model }}, pool {{ $labels.pool }})"
_POOL = "Pool {{ $labels.pool }} ({{ $labels.model }})"
_XIDS = f'{m.GPU_XID_ERRORS_TOTAL.name}{{xid=~"{{critical_xids}}"}}'
_UP = 'up{job=~"{exporter_jobs}"}'  # Prometheus' own series for each gpufleet target


def template_label(name: str) -> str:
    """A label's value as a template function's argument: ``(index $labels "cluster")``.

    Not ``$labels.cluster``: a label the alert lacks (``cluster`` without a ``cluster:`` in
    the exporter's config) is "" to Prometheus but nil to vmalert, whose ``printf "%q"``
    then writes ``%!q(<nil>)`` into the query, which fails, and the whole alert is dropped
    (``eq`` fails on nil the same way). ``index`` gives "" for a missing key on both
    engines. A label only printed may be ``{{ $labels.pool }}``; one that may be absent is
    printed inside ``{{ with $labels.account }}``."""
    return f'(index $labels "{name}")'


def _growth(selector: str) -> str:
    """How much a driver lifetime counter grew in the last 10 min: now less the window's
    lowest value. Not ``increase()``: on a series' first appearance Prometheus sees no
    growth but VictoriaMetrics counts its first value as growth from 0, so a GPU first seen
    with an old lifetime NVLink or ECC count would open a ticket or page on one engine
    only. Now minus the minimum reads the same samples the same way on both: an old count
    that does not grow is 0, a first error of a new series counts at once, and a counter
    reset (a GPU reset zeroes the volatile ECC count) never reads as growth."""
    return f"(\n  {selector}\n  - min_over_time({selector}[10m])\n)"


# In the table's order of concepts: the loader's "known:" list follows it.
METRICS: dict[str, TableMetric] = {metric.key: metric for metric in (
    TableMetric(
        "gpu_utilization", "ratio", "gpu", ("<", ">"),
        m.GPU_UTILIZATION_RATIO.name,
        f"{_GPU} is held by a job but <VALUE> busy, <RELATION> <THRESHOLD> for <FOR>."),
    # A job, not each of its GPUs: 8 idle GPUs of one job are one ticket for its owner.
    # The recorded average is over the job's GPUs; `job_gpus` and `account` ride along
    # (constant for a job), the pod does not, so a replaced pod keeps the `for` clock.
    TableMetric(
        "job_utilization", "ratio", "job", ("<",),
        recorded.JOB_UTILIZATION,
        # a scheduler without accounts leaves the label absent: said only when there is one
        "Job {{ $labels.exported_job }}{{ with $labels.account }} (account {{ . }}){{ end }} "
        "holds {{ $labels.job_gpus }} GPU(s) at <VALUE> average utilization, <RELATION> "
        "<THRESHOLD> for <FOR>: {{ with printf "
        f"`avg_over_time({recorded.JOB_IDLE}{{cluster=%q,exported_job=%q}}[1h])` "
        f"{template_label('cluster')} {template_label('exported_job')} | query }}}}"
        '{{ . | first | value | printf "%.1f" }}{{ end }} GPU-hours idle in the last hour.'),
    # Only a checkpoint the job states (a Slurm comment's last-checkpoint=, the pod
    # annotation gpufleet.io/last-checkpoint) says the job is one that checkpoints, i.e.
    # a training job: an `assumed` age restarts every advisor.checkpoint_interval by
    # construction and can never be stale. Maxed by the job's constant labels, so a
    # replaced or second exporter (its instance) does not restart the `for` clock.
    TableMetric(
        "job_checkpoint_age", "seconds", "job", (">", ">="),
        "max by (cluster, exported_job, namespace, account) (\n"
        f'  {m.JOB_CHECKPOINT_AGE_SECONDS.name}{{source="stated"}}\n)',
        # a scheduler without accounts leaves the label empty (not stored): said only
        # when there is one
        "Job {{ $labels.exported_job }}{{ with $labels.account }} (account {{ . }})"
        "{{ end }} last checkpointed <VALUE> ago, <RELATION> <THRESHOLD> for <FOR>: "
        "that much work of each GPU it holds is not saved."),
    # The work preemptions lost over the work the pool delivered, both over the last
    # PREEMPTION_WINDOW (6h): GPU-seconds from each stopped job's last checkpoint to its stop,
    # over GPU-seconds its running jobs held (exporter/preemption/). Summed over the causes,
    # then maxed by the pool's labels: two cluster-mode exporters count the same stops. A pool
    # that delivered nothing has no ratio (no division by 0).
    TableMetric(
        "pool_preemption_overhead", "ratio", "pool", (">", ">="),
        "max by (cluster, pool) (\n"
        f"  sum without (cause) (increase({m.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name}"
        f"[{PREEMPTION_WINDOW}]))\n)\n/\n"
        "max by (cluster, pool) (\n"
        f"  increase({m.POOL_DELIVERED_GPU_SECONDS_TOTAL.name}[{PREEMPTION_WINDOW}]) > 0\n)",
        "Preemptions in pool {{ $labels.pool }} lost <VALUE> of the GPU-hours it delivered "
        f"over the last {PREEMPTION_WINDOW}, <RELATION> <THRESHOLD> for <FOR>: "
        "jobs are stopped long after their last checkpoint, or too often."),
    # Multi-node jobs only (the family has no series for a single-node job); maxed by
    # the job's constant labels for the same reason as above.
    TableMetric(
        "job_nvlink_generations", "count", "job", (">", ">="),
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
    TableMetric(
        "job_straggler_gpus", "count", "job", (">", ">="),
        f"max by (cluster, exported_job, namespace, account) ({m.JOB_STRAGGLER_GPUS.name})",
        "Job {{ $labels.exported_job }}{{ with $labels.namespace }} (namespace {{ . }})"
        "{{ end }}{{ with $labels.account }} (account {{ . }}){{ end }} has <VALUE> GPU(s) "
        "out of step with its peers (<RELATION> <THRESHOLD>, for <FOR>): the whole job runs "
        "at its slowest GPU's pace."),
    TableMetric(
        "gpu_memory_used", "ratio", "gpu", (">", ">="),
        m.GPU_MEMORY_USED_RATIO.name,
        f"{_GPU} has <VALUE> of its memory in use, <RELATION> <THRESHOLD> for <FOR>."),
    TableMetric(
        "gpu_temperature", "celsius", "gpu", (">", ">="),
        m.GPU_TEMPERATURE_CELSIUS.name,
        f"{_GPU} is at <VALUE>, <RELATION> <THRESHOLD> for <FOR>."),
    # A busy GPU draws at its power limit by design: the cap holding the draw there is the
    # limit the site set doing its work, and alerting on it ticketed every busy H200 and
    # B200 of a healthy fleet. The evidence of a fault is the power brake: the node's power
    # supply (or the rack's) pulling the GPU's clocks down (NVML's HW_POWER_BRAKE_SLOWDOWN,
    # asserted by the system, never by the GPU's own cap), at least once in the last 5 min.
    # Compared with the table's levels: fractions of the limit the GPU is held to (the
    # exporter's gauge: the site's enforced limit, or the catalogue TDP where a GPU reports
    # none), or the table's watts.
    TableMetric(
        "gpu_power", "watts", "gpu", (">", ">="),
        m.GPU_POWER_WATTS.name,
        f"{_GPU} draws <VALUE>, <RELATION> <THRESHOLD> for <FOR>, and its power supply "
        "applied the power brake (hw_power_brake) in the last 5m: the node or its rack "
        "cannot supply what its GPUs draw.",
        cap=m.GPU_POWER_LIMIT_EFFECTIVE_WATTS.name,
        evidence=f'max_over_time({m.GPU_CLOCK_EVENT_ACTIVE.name}{{reason="hw_power_brake"}}'
                 "[5m]) == 1"),
    # Held back by the power cap: the share of the last 5 min NVML's clock-event reason
    # sw_power_cap held the clocks down. Its own row, so GpuPowerHigh fires on power alone
    # and this one only where clock events exist (GPUs without them have no series).
    TableMetric(
        "gpu_power_capped", "ratio", "gpu", (">", ">="),
        f'avg_over_time({m.GPU_CLOCK_EVENT_ACTIVE.name}{{reason="sw_power_cap"}}[5m])',
        f"{_GPU} is busy but had its clocks held down by the software power cap <VALUE> "
        "of the last 5m (<RELATION> <THRESHOLD>, for <FOR>): the job runs slower than "
        "the GPU could."),
    # The exporter's gauge (the rate of its byte counters over its last 5 min of collections,
    # over the capacity): where a GPU has no value yet (a first reading, a counter reset) the
    # alert sees no series and stays quiet, as the rate over one sample gave none.
    TableMetric(
        "gpu_nvlink_utilization", "ratio", "gpu", ("<",),
        m.GPU_NVLINK_UTILIZATION_RATIO.name,
        f"{_GPU} runs a multi-GPU job but uses <VALUE> of its NVLink bandwidth, "
        "<RELATION> <THRESHOLD> for <FOR>."),
    # Less the pool's tier-inversion penalty, as the cluster's below (the reasons there).
    TableMetric(
        "pool_fragmentation_index", "index", "pool", (">", ">="),
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
    TableMetric(
        "cluster_fragmentation_index", "index", "cluster", (">", ">="),
        f"{m.CLUSTER_FRAGMENTATION_INDEX.name} - ({m.CLUSTER_TIER_INVERSION_PENALTY.name} or "
        f"{m.CLUSTER_FRAGMENTATION_INDEX.name} * 0)",
        "The cluster has a fragmentation index of <VALUE> without its tier-inversion "
        "penalties, <RELATION> <THRESHOLD> for <FOR>: idle GPUs are scattered so that large "
        "jobs cannot start."),
    # A failing node the scheduler has drained (its own state: Slurm's DRAIN flag, not only
    # gpufleet's advice): one ticket for the node while it stays drained and failing, and its
    # row's mutes_pages makes Alertmanager mute the node's GPU pages meanwhile (GpuLost
    # re-paged every hour after the drain). Maxed by the node: two exporters may say it.
    TableMetric(
        "node_drained_failing", "state", "node", ("==",),
        f"max by (cluster, node, pool) ({m.NODE_DRAINED.name})\n"
        "and on (cluster, node)\n"
        f'  max by (cluster, node) ({m.NODE_HEALTH_VERDICT.name}{{verdict="failing"}})',
        "Node {{ $labels.node }} (pool {{ $labels.pool }}) is drained in the scheduler and "
        "gpufleet's health verdict holds it failing, for <FOR>: its jobs have left it and its "
        "GPUs' pages are muted while it stays drained."),
    TableMetric(
        "gpu_up", "state", "gpu", ("==",),
        m.GPU_UP.name,
        f"{_GPU} has not answered for <FOR>: it is lost or every read of it fails."),
    # XIDs are events: an increase over 10 min holds the alert for 10 min after one,
    # long enough to be seen, short enough to resolve once the GPU is quiet again.
    # A GPU's first XID of a code creates its series at 1, which increase() cannot see
    # (no earlier sample): a series new in the last 10 min counts too, if the GPU's
    # last XID is that recent (so a restarted Prometheus does not page on old ones).
    # The increase is filtered first: `or` would keep its 0 over the new series' 1.
    # And while gpufleet's own health verdict still holds the GPU failing for an XID (the
    # verdict falls only after its clean window, and /v1/advice says so), the XIDs it counted
    # stay firing: the page does not resolve after 10 min on a GPU that is still failing.
    TableMetric(
        "gpu_xid_critical", "count", "gpu", (">",),
        f"(\n  increase({_XIDS}[10m]) > 0\n"
        "  or\n"
        f"  ({_XIDS}\n"
        f"    unless {_XIDS} offset 10m)\n"
        "  and on (cluster, node, gpu)\n"
        f"    time() - {m.GPU_LAST_XID_TIMESTAMP_SECONDS.name} < {{event_window_seconds}}\n"
        "  or\n"
        f"  {_XIDS}\n"
        "  and on (cluster, node, gpu)\n"
        f'    {m.GPU_HEALTH_VERDICT.name}{{verdict="failing",signal="xid"}}\n)',
        f"{_GPU} reported XID {{{{ $labels.xid }}}} (<VALUE> in the last 10m, or counted "
        "in all while gpufleet's health verdict holds the GPU failing; for <FOR>), an error "
        "that needs a human: see the runbook for what it means."),
    TableMetric(
        "gpu_ecc_double_bit", "count", "gpu", (">",),
        _growth(f'{m.GPU_ECC_ERRORS_TOTAL.name}{{type="double_bit",counter="volatile"}}'),
        f"{_GPU} had <VALUE> uncorrectable (double-bit) ECC error(s) in the last 10m: "
        "the data of the job on it may be corrupt."),
    TableMetric(
        "gpu_remapped_rows_failure", "state", "gpu", ("==",),
        m.GPU_REMAPPED_ROWS_FAILURE.name,
        f"{_GPU} failed to remap a memory row (for <FOR>): it has run out of spare "
        "rows."),
    TableMetric(
        "gpu_remapped_rows_pending", "state", "gpu", ("==",),
        m.GPU_REMAPPED_ROWS_PENDING.name,
        f"{_GPU} has memory rows waiting to be remapped for <FOR>; the remap happens "
        "at the next GPU reset."),
    # Hardware or thermal slowdown, one series per GPU: hw_slowdown is set together with
    # hw_thermal or hw_power_brake (NVML's HW_SLOWDOWN covers both), so the reasons are
    # folded with max, not summed. The share of the last 10 min each reason held the
    # clocks down; the description names the reasons that did (a query, sorted).
    TableMetric(
        "gpu_clock_slowdown", "ratio", "gpu", (">", ">="),
        "max without (reason) (\n"
        f"  avg_over_time({m.GPU_CLOCK_EVENT_ACTIVE.name}{{reason=~\"{m.SLOWDOWN_REASONS}\"}}"
        "[10m])\n)",
        f"{_GPU} is busy but had its clocks held down <VALUE> of the last 10m "
        "(<RELATION> <THRESHOLD>, for <FOR>) by {{ range $i, $s := printf "
        f"`avg_over_time({m.GPU_CLOCK_EVENT_ACTIVE.name}{{cluster=%q,node=%q,gpu=%q,"
        f'reason=~"{m.SLOWDOWN_REASONS}"}}[10m]) > 0` '
        f"{template_label('cluster')} {template_label('node')} {template_label('gpu')} "
        "| query | sortByLabel `reason` }}"
        "{{ if $i }}, {{ end }}{{ $s.Labels.reason }}{{ end }}: the job runs slower."),
    # NVLink counters summed over the GPU's links, by type. Replays and recoveries are
    # link errors at any count (DCGM's health watch: DCGM_LIMIT_MAX_NVLINK_ERROR 1);
    # CRC errors are corrected by a replay and matter only at 100 a second or more
    # (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR, "RM has informed us that CRC errors only matter
    # at rates of 100+ per second"), so they have a row and a threshold of their own.
    TableMetric(
        "gpu_nvlink_link_errors", "count", "gpu", (">", ">="),
        _growth(f'{m.GPU_NVLINK_ERRORS_TOTAL.name}{{type=~"replay|recovery"}}'),
        f"{_GPU} counted <VALUE> NVLink {{{{ $labels.type }}}} error(s) in the last "
        "10m (<RELATION> <THRESHOLD>, for <FOR>): a link retransmits or retrains.",
        each=("type", ("replay", "recovery"))),
    TableMetric(
        "gpu_nvlink_crc_errors", "count", "gpu", (">", ">="),
        _growth(f'{m.GPU_NVLINK_ERRORS_TOTAL.name}{{type=~"crc_flit|crc_data"}}'),
        f"{_GPU} counted <VALUE> NVLink {{{{ $labels.type }}}} CRC errors in the last "
        "10m, <RELATION> <THRESHOLD>, for <FOR>: a link is degrading.",
        each=("type", ("crc_flit", "crc_data"))),
    # SM activity is GPM's (Hopper and later) or DCGM's profiling field; GPUs without it
    # have no series and never fire. Utilization counts time any kernel ran, so a job
    # spinning on a lock or waiting on a peer reads busy while its SMs idle.
    TableMetric(
        "gpu_sm_active", "ratio", "gpu", ("<",),
        m.GPU_SM_ACTIVE_RATIO.name,
        f"{_GPU} reads as busy, but its SMs were active <VALUE> of the time, "
        "<RELATION> <THRESHOLD> for <FOR>: its kernels run but do little work."),
    TableMetric(
        "source_up", "state", "source", ("==",),
        m.SOURCE_UP.name,
        "Source {{ $labels.source }}{{ with $labels.target }} (target {{ . }}){{ end }} "
        "on {{ $labels.instance }} has failed for <FOR>; its GPUs are served stale."),
    # Fleet-wide: every exporter's instance of the source fails (the cluster mode's only
    # Prometheus or Slurm reader, or NVML on every node): nothing is seen, so it pages.
    TableMetric(
        "fleet_source_up", "state", "source", ("==",),
        f'max by (cluster, source) ({m.SOURCE_UP.name}{{target=""}})',
        "Source {{ $labels.source }} has failed on every gpufleet that runs it for "
        "<FOR>: the whole fleet is served stale."),
    TableMetric(
        "exporter_up", "state", "target", ("==",),
        _UP,
        "gpufleet target {{ $labels.instance }} of job {{ $labels.job }} has been "
        "down for <FOR>: its GPUs' metrics are not collected."),
    # Every target of a job down, or the job gone from service discovery: the fleet
    # (node mode) or its analysis (cluster mode) is blind, and no alert can fire.
    TableMetric(
        "exporter_job_up", "state", "target", ("==",),
        f"max by (job) ({_UP})",
        "No target of gpufleet job {{ $labels.job }} has answered for <FOR> (or the "
        "job has no target at all): no GPU metrics are collected.",
        absent_too=True),
    # The watchdog (issue 32, Build 1): the snapshot an exporter serves stops aging only
    # when a collection finishes. /-/ready turns 503 past web.stall_intervals collect
    # intervals (15 s by default), but nothing scrapes /-/ready; this reads the same
    # stall from /metrics, which keeps serving the old snapshot.
    TableMetric(
        "snapshot_age", "seconds", "target", (">", ">="),
        f"time() - {m.SNAPSHOT_TIMESTAMP_SECONDS.name}",
        "The snapshot gpufleet {{ $labels.instance }} serves is <VALUE> old, <RELATION> "
        "<THRESHOLD>, and has been for <FOR>: its collection has stalled, and every GPU "
        "value and alert of it is frozen."),
    # errors in the last 10 min, not a rate: "3 inserts failed" reads better than
    # 0.005/s, and a row's `for` longer than the window makes one blip never fire
    TableMetric(
        "advisor_outbox_errors", "count", "advisor", (">", ">="),
        f"increase({m.ADVISOR_OUTBOX_ERRORS_TOTAL.name}[10m])",
        "The advisor's outbox on {{ $labels.instance }} failed <VALUE> "
        "{{ $labels.operation }} operations in the last 10m (<RELATION> <THRESHOLD>) "
        "and has kept failing for <FOR>: plans that cannot be written wait in memory, "
        "with no cooldown."),
    # A file read again that failed (the table, the web config, the advisor's token, a
    # receiver's secret): the last good version stays in force (exporter/thresholds/
    # reloading.py); the process says which file in its log.
    TableMetric(
        "config_reload_successful", "state", "target", ("==",),
        m.CONFIG_LAST_RELOAD_SUCCESSFUL.name,
        "gpufleet {{ $labels.instance }} has failed to reload a file it reads (its threshold "
        "table, web config, advisor token or a receiver's secret) for <FOR>: the last good "
        "version stays in force, not what is on disk."),
    # Node pressure (issue 20): series recorded from node_exporter's by the `pressure`
    # section's rules (exporter/alerting/pool_load_rules.py). One row per resource holds its
    # bands: warning is the medium band, critical the high one.
    TableMetric(
        "node_cpu_busy", "ratio", "node", (">", ">="),
        recorded.NODE_CPU_BUSY,
        "Node {{ $labels.instance }} has its CPUs <VALUE> busy, <RELATION> "
        "<THRESHOLD> for <FOR>."),
    TableMetric(
        "node_memory_used", "ratio", "node", (">", ">="),
        recorded.NODE_MEMORY_USED,
        "Node {{ $labels.instance }} has <VALUE> of its memory in use (1 - "
        "MemAvailable/MemTotal), <RELATION> <THRESHOLD> for <FOR>."),
    TableMetric(
        "node_disk_io_busy", "ratio", "node", (">", ">="),
        recorded.NODE_DISK_IO_BUSY,
        "Node {{ $labels.instance }} has its busiest disk doing I/O <VALUE> of the "
        "time, <RELATION> <THRESHOLD> for <FOR>."),
    TableMetric(
        "node_pressure_score", "ratio", "node", (">", ">="),
        recorded.NODE_PRESSURE_SCORE,
        "Node {{ $labels.instance }} has a pressure score of <VALUE> of the "
        "maximum (CPU, memory and disk I/O, weighted against their caps), "
        "<RELATION> <THRESHOLD> for <FOR>."),
)}

__all__ = ["EVENT_WINDOW_SECONDS", "GPU_MATCH", "METRICS", "TableMetric", "promql_number",
           "regex_alternatives", "scope_filter", "template_label", "with_matchers"]
