"""The rebalancing advisor: decides when compaction pays, plans verified moves, tells the scheduler.

``outbox`` and ``webhook`` carry plans to schedulers durably; ``api`` serves
the advisor's HTTP endpoints on the exporter's aiohttp server.
"""
