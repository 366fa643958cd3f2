"""The rebalancing advisor: decides when compaction pays, plans verified moves, tells the scheduler.

``engine`` decides and ``planner`` plans, neither calling the other; ``advise`` runs one
evaluation of both on a snapshot and returns typed advice (``advice``, ``plan``). ``wire``
writes that as JSON where it leaves: ``api`` serves the advisor's HTTP endpoints on the
exporter's aiohttp server, and ``store`` and ``webhook`` carry plans to schedulers durably.
"""
