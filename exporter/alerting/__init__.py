"""Alerting from one threshold table.

:mod:`exporter.thresholds` loads and validates ``rules/thresholds.yaml``
(the only place a threshold is written); :mod:`exporter.alerting.rules` turns it
into Prometheus alerting and recording rules and the Kubernetes
``PrometheusRule`` object. ``gpufleet rules`` (:mod:`exporter.cli.rules`) writes
them.
"""
