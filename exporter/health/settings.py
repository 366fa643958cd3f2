"""Bounds of the health settings: a wrong value is one error naming its key.

The settings are the threshold table's ``health`` section (exporter/thresholds/health.py,
where :func:`check_settings` lives with them); this module keeps its old import path.
"""

from exporter.thresholds.health import check_settings as check_settings
