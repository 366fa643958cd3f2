"""The names of every series gpufleet's recording rules write, in one place.

These are not catalogue families (:mod:`exporter.metrics` lists what the exporter
exposes); Prometheus produces them from the rules in ``rules/gpufleet-recording.yaml``.
The table's metric records (:mod:`exporter.thresholds.table_metrics`, whose alerts compare
several of them), the rules that record them (:mod:`exporter.alerting.rules`,
:mod:`exporter.alerting.pool_load_rules`) and the dashboards (:mod:`exporter.dashboards`)
all spell a recorded series through these constants, so a rename is one edit. They live in
the table's leaf package so that the records can name them without importing alerting.
Names follow ``level:metric:operations`` (https://prometheus.io/docs/practices/rules/).
"""

from __future__ import annotations

# (none per GPU: the memory-used ratio, the power limit a GPU is held to and the NVLink
# utilisation are the exporter's own gauges, gpufleet_gpu_memory_used_ratio,
# gpufleet_gpu_power_limit_effective_watts and gpufleet_gpu_nvlink_utilization_ratio: issue 45)
# per job, and per GPU a job holds
JOB_GPU_UTILIZATION = "job_gpu:gpufleet_gpu_utilization:ratio"
JOB_UTILIZATION = "job:gpufleet_gpu_utilization:avg"
JOB_IDLE = "job:gpufleet_gpu_idle:sum"
# per pool (and model)
POOL_UTILIZATION = "pool:gpufleet_gpu_utilization:avg"
POOL_MEMORY_USED = "pool:gpufleet_gpu_memory_used:ratio"
POOL_ALLOCATED = "pool:gpufleet_gpu_allocated:sum"
POOL_IDLE = "pool:gpufleet_gpu_idle:count"
# the load statistics' inputs (issue 20); each gets its mean, stddev and quantile series
POOL_DEMAND = "pool:gpufleet_demand:ratio"
POOL_CAPACITY = "pool:gpufleet_gpu_capacity:count"
CLUSTER_UTILIZATION = "cluster:gpufleet_gpu_utilization:avg"
CLUSTER_DEMAND = "cluster:gpufleet_demand:ratio"
# node pressure (issue 20), from node_exporter's series
NODE_CPU_BUSY = "instance:gpufleet_node_cpu_busy:ratio"
NODE_MEMORY_USED = "instance:gpufleet_node_memory_used:ratio"
NODE_DISK_IO_BUSY = "instance:gpufleet_node_disk_io_busy:ratio"
NODE_PRESSURE_SCORE = "instance:gpufleet_node_pressure:score"
# fleet reliability (issue 31), from the health families; exporter/alerting/rules.py
CLUSTER_FAULTS_7D = "cluster:gpufleet_health_faults:increase7d"  # interruptions by cause
CLUSTER_FAULTS_30D = "cluster:gpufleet_health_faults:increase30d"
NODE_TIME_BETWEEN_FAULTS = "node:gpufleet_node_time_between_faults:seconds"
NODE_REPEAT_OFFENDER = "node:gpufleet_node_faults:repeat_offender"
CLUSTER_FAULT_TO_DRAIN = "cluster:gpufleet_remediation_fault_to_drain_seconds:mean7d"
CLUSTER_DRAIN_TO_RESUME = "cluster:gpufleet_remediation_drain_to_resume_seconds:mean7d"
