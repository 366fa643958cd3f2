"""The prometheus source: the fleet read back from a Prometheus-API server (cluster mode).

source.py queries; options.py declares ``sources.prometheus``."""
