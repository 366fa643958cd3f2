"""Config defaults that come from the threshold table, and follow it when it changes.

``advisor.trigger`` and ``analysis.compaction_threshold`` default to the fragmentation
row's level, ``advisor.clear_below`` to the trigger less :data:`CLEAR_HYSTERESIS`, and
``advisor.checkpoint_interval`` to half the GpuJobCheckpointStale level. A default is
built as :class:`FromTable` (or :class:`DurationFromTable`): a number like any other that
also says "nobody set me". The config's parser turns every value written in a file into a
plain ``float`` or ``Duration``, so the type alone tells a default from a choice, with no
second record of which keys were given. Settings built from the config
(``advise.decision_settings``, ``configure.index_settings``) then read a default from the
table ``gpufleet serve`` runs on (``--thresholds FILE``, re-read on SIGHUP and on change)
and keep an explicit value as written.
"""

from __future__ import annotations

from exporter.options import Duration

# Index points between advisor.trigger and the advisor.clear_below derived from it: the
# reference table's 50 and the old fixed default 40. Never more than half the trigger, so
# a low trigger (10) still clears (at 5), and clear_below < trigger holds for any trigger > 0.
CLEAR_HYSTERESIS = 10.0


class FromTable(float):
    """A default read from the threshold table; a value set in the config is a plain float."""

    __slots__ = ()

    def __repr__(self) -> str:  # shown as the number in `serve --help`
        return float.__repr__(self)


class DurationFromTable(Duration):
    """A duration default read from the threshold table (``advisor.checkpoint_interval``)."""

    def __repr__(self) -> str:
        return float.__repr__(self)


def follows_table(value: float) -> bool:
    """Whether ``value`` is a default that follows the table (not set in the config)."""
    return isinstance(value, FromTable | DurationFromTable)


def clear_below_for(trigger: float) -> float:
    """``advisor.clear_below``'s default for a trigger: below it by :data:`CLEAR_HYSTERESIS`
    points, or by half the trigger when that is less (never negative).

    >>> clear_below_for(50), clear_below_for(40), clear_below_for(10), clear_below_for(0)
    (40.0, 30.0, 5.0, 0.0)
    """
    return float(trigger - min(CLEAR_HYSTERESIS, trigger / 2))
