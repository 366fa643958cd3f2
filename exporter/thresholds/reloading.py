"""The threshold table ``gpufleet serve`` runs on, read again on SIGHUP and when it changes.

``serve --thresholds FILE`` (config ``thresholds_file``) names the table; without one it
is the table installed with gpufleet, which cannot change under a running process.
:meth:`LiveThresholds.poll` runs before each collection (one ``stat()``) and on SIGHUP
(forced). A new version is validated whole, then offered to every follower (the advisor's
trigger, the analysis' compaction threshold: exporter/cli/serve.py wires them), each of
which prepares its change and may refuse it; only when all accept are the changes made, so
a reload is taken whole or not at all. The state the followers keep (dwell, cooldown, idle
clocks, scaling) is theirs and is not touched: only their settings change.

A table that fails (a YAML error, a bad row, a follower's refusal) keeps the last good one
in force, logs one line naming the file and the row, and sets
``gpufleet_config_last_reload_successful`` to 0, as Prometheus does for its own config.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from exporter import metrics
from exporter.errors import ConfigError
from exporter.metrics import Family
from exporter.thresholds.table import Thresholds, load_thresholds

log = logging.getLogger(__name__)

# A follower: given a new table, prepare the change and return what makes it (called only
# once every follower has prepared); raise ConfigError to refuse the table.
Follower = Callable[[Thresholds], Callable[[], None]]
Stamp = tuple[int, int, int, int] | None


def _stamp(path: str) -> Stamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    # size, inode and ctime too: a rewrite within one mtime tick, or a rename over the file
    return (info.st_mtime_ns, info.st_size, info.st_ino, info.st_ctime_ns)


class LiveThresholds:
    """The table in force (:attr:`current`), its followers, and how the last reload went."""

    def __init__(self, path: str | Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = None if path is None else str(path)
        self.clock = clock
        self._seen: Stamp = None if self.path is None else _stamp(self.path)
        self.current = load_thresholds(self.path)  # at the start, an error stops it
        self.successful = True
        self.success_at = clock()
        self.reloads = 0
        self._failed: Stamp | bool = False  # the version last refused, for one line per version
        self._followers: list[tuple[str, Follower]] = []
        # the other files read again (serve's token and secret files, cli/serve.py reloaders):
        # name -> whether its last read succeeded; a failed one sets the gauge to 0 too
        self.other_files: dict[str, Callable[[], bool]] = {}

    def follow(self, name: str, follower: Follower) -> None:
        self._followers.append((name, follower))

    def poll(self, force: bool = False) -> str:
        """Read the file again if it changed, or at once when ``force`` (SIGHUP). Blocking (a
        ``stat()``, and a parse when it changed): the server calls it from a thread. Returns
        the outcome for the SIGHUP log line: unchanged, changed, failed, or installed (no
        file named: nothing to read)."""
        if self.path is None:
            return "installed"
        stamp = _stamp(self.path)
        if stamp == self._seen and not force:
            return "unchanged"
        self._seen = stamp
        try:
            table = load_thresholds(self.path)
            commits = [follower(table) for _, follower in self._followers]
        except (ConfigError, KeyError, ValueError) as exc:  # ThresholdError is a ConfigError
            self.successful = False
            if force or self._failed != stamp:  # one line per broken version, or per SIGHUP
                log.error(f"threshold table not reloaded, keeping the last good one: {exc}")
            self._failed = stamp
            return "failed"
        self._failed = False
        self.successful = True
        self.success_at = self.clock()
        if table == self.current:  # touched, or a comment edited: nothing to follow
            return "unchanged"
        for commit in commits:
            commit()
        self.current = table
        self.reloads += 1
        log.info("threshold table reloaded", extra={
            "path": self.path, "compaction_threshold": table.compaction_threshold(),
            "followers": ",".join(name for name, _ in self._followers)})
        return "changed"

    async def on_snapshot(self, snapshot: object) -> None:
        """A ``ServingState.snapshot_listeners`` entry, first of them: the file is looked at
        once per collection, before the analysis and the advisor see the snapshot, so each
        snapshot is judged against the table as it is on disk then."""
        if self.path is not None:
            await asyncio.to_thread(self.poll)

    def families(self, snapshot: object) -> list[Family]:
        """``gpufleet_config_last_reload_successful`` and its success timestamp (the table's)."""
        successful = self.successful and all(ok() for ok in self.other_files.values())
        return [
            metrics.CONFIG_LAST_RELOAD_SUCCESSFUL.family([((), float(successful))]),
            metrics.CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS.family([((), self.success_at)]),
        ]
