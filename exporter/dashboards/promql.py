"""PromQL pieces the dashboards share: label selectors built from the template
variables, and the expressions more than one panel needs.

Where the alerting package records a series (``rules/gpufleet-recording.yaml``,
``level:metric:operations`` names) the dashboards read the recorded series
rather than repeat its expression, so Prometheus computes it once for alerts
and panels alike; that file must be loaded into Prometheus.

Joins are ``on (cluster, node, gpu)``: a GPU's place identifies it, and the other
identity labels (uuid, model, pool) then need not agree between series, nor the
target labels (``job``, ``instance``): with node mode and cluster mode side by
side, a GPU's telemetry comes from its node's exporter and its allocation from
the cluster-mode process that reads Slurm (docs/deploy.md).

Every query is filtered by the ``cluster`` variable (the ``cluster`` label the
config sets on every series): one Prometheus or Thanos may hold several
clusters, whose node names may repeat.
"""

from __future__ import annotations

from exporter import metrics as m
from exporter.thresholds import recorded

# label -> template variable; multi-value variables expand to a regex alternation,
# so every selector matches with =~
CLUSTER = (("cluster", "cluster"),)
POOL = (*CLUSTER, ("pool", "pool"))
FLEET = (*POOL, ("model", "model"))
NODE = (*FLEET, ("node", "node"))
GPU = (*NODE, ("gpu", "gpu"))


def selector(labels: tuple[tuple[str, str], ...], *extra: str) -> str:
    """``{pool=~"$pool",model=~"$model"}`` plus any extra matchers."""
    matchers = [f'{label}=~"${variable}"' for label, variable in labels] + list(extra)
    return "{" + ",".join(matchers) + "}"


def allocations(sel: str) -> str:
    """``gpufleet_gpu_allocation_info`` with the job's name copied into ``job_name``.

    The exporter's ``job`` label collides with the ``job`` label Prometheus sets
    on every scraped series. With the default ``honor_labels: false`` the
    exporter's value arrives as ``exported_job``; with ``honor_labels: true`` it
    stays ``job``. The inner label_replace copies ``job``; the outer one
    replaces it with ``exported_job`` when that exists, so the panels show the
    job's name under either scrape setting.
    """
    inner = f'label_replace({m.GPU_ALLOCATION_INFO.name}{sel}, "job_name", "$1", "job", "(.*)")'
    return f'label_replace({inner}, "job_name", "$1", "exported_job", "(.+)")'


def nvlink_utilization(sel: str) -> str:
    """Share of the GPU's NVLink bandwidth in use over 5 min, both directions together (0-1):
    the exporter's gauge."""
    return m.GPU_NVLINK_UTILIZATION_RATIO.selector() + sel


def gpus_in_state(state: str, sel: str, by: str = "") -> str:
    """GPUs that are allocated, idle or lost, as a sum that is 0 (not absent) when none are.

    States do not overlap: a lost GPU (``gpufleet_gpu_up`` 0) is lost whether or
    not a job still holds it; allocated and idle count answering GPUs only.
    """
    grouping = f" by ({by})" if by else ""
    if state == "lost":
        return f"sum{grouping} ({m.GPU_UP.name}{sel} == bool 0)"
    if state == "idle":
        return f"sum{grouping} ({recorded.POOL_IDLE}{sel})"
    if state == "allocated":
        # on (...) group_left: the allocation may come from another process than gpu_up
        return (f"sum{grouping} (({m.GPU_ALLOCATED_RATIO.name}{sel} > bool 0) "
                f"* on (cluster, node, gpu) group_left () {m.GPU_UP.name}{sel})")
    raise ValueError(f"unknown GPU state {state!r}")


def firing_alerts(names: tuple[str, ...]) -> str:
    """The gpufleet alerts that fire now: those the threshold table generates, nothing else.

    Those of the chosen clusters, and those with no ``cluster`` label at all: an alert on
    ``up`` (GpufleetTargetDown) or on a sum over clusters cannot say which it is, and a
    page hidden by a dashboard filter is worse than one shown on every cluster's."""
    matchers = f'cluster=~"$cluster|",alertstate="firing",alertname=~"{"|".join(sorted(names))}"'
    return f"ALERTS{{{matchers}}}"


def zero_filled_by_pool(expr: str, sel: str) -> str:
    """``expr`` (a sum by pool) with 0 for every pool it has no series for, so a pool
    with nothing pending shows 0 rather than a gap."""
    return f"{expr} or sum by (pool) (0 * {m.NODE_INFO.name}{sel})"


def xid_events(sel: str, window: str) -> str:
    """XID events per GPU and code over ``window``: the counter's increase, plus the
    series that appeared within it. A GPU's first XID of a code creates its series at 1,
    which increase() cannot see (no earlier sample); GpuXidError counts it the same way."""
    counter = f"{m.GPU_XID_ERRORS_TOTAL.name}{sel}"
    return (f"(increase({counter}[{window}]) > 0 "
            f"or ({counter} unless {counter} offset {window}))")


def zero_filled_by_gpu(expr: str, sel: str, label: str, value: str) -> str:
    """``expr`` (by cluster, node, gpu and ``label``) with a 0 for every answering GPU it has
    no series for, ``label`` set to ``value``: "none seen" draws as 0, not as "No data"."""
    zero = f'label_replace(0 * {m.GPU_UP.name}{sel}, "{label}", "{value}", "", "")'
    return f"{expr}\nor on (cluster, node, gpu) {zero}"


def slowdown(labels: tuple[tuple[str, str], ...]) -> str:
    """1 while a thermal or power-brake reason holds the GPU's clocks down (GpuClocksThrottled's
    reasons), per GPU; 0 while none does."""
    sel = selector(labels, f'reason=~"{m.SLOWDOWN_REASONS}"')
    return f"max by (cluster, node, gpu) ({m.GPU_CLOCK_EVENT_ACTIVE.name}{sel})"
