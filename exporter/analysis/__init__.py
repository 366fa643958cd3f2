"""Fragmentation analysis: how many idle GPUs the jobs we run cannot use, and where.

Data flows one way: a :class:`~exporter.snapshot.FleetSnapshot` (or the openb
node list) becomes a columnar :class:`~exporter.analysis.state.FleetState`;
a :class:`~exporter.analysis.workload.Workload` of task shapes is compiled
against it; :mod:`~exporter.analysis.fgd` measures FGD fragmentation per
node; :mod:`~exporter.analysis.index` sums it per pool and cluster and turns
it into a 0-100 index. Every function here is pure; the only state kept
between snapshots is the live workload window in :mod:`.families`.
"""
