"""No blind green: a source whose fleet vanished between two reads counts as down.

A scheduler or API server that answers with no node at all, after it listed GPUs, is
far more often wrong (a partition renamed, an RBAC role cut down, a label selector
edited, slurmctld answering from an empty state file) than right: a fleet does not
drain in one collection interval. Served as it is, that answer is
``gpufleet_source_up 1`` with fragmentation 0 and no alert (issue 30). So the Slurm
and Kubernetes sources pass every reading through :class:`EmptiedFleet`: once a read
listed GPUs, a read that lists none keeps its (empty) fleet but sets ``error``, which
the collector serves as ``gpufleet_source_up 0`` with the reason in the source's
status, and the source logs the reason once per outage.

A fleet that is empty from the first read is left alone (a new cluster, or a
source that only ever sees part of one): there is nothing it had to lose. A fleet
that is really gone for good keeps the source down until gpufleet restarts, which
is the honest answer for an exporter that has nothing left to export.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from exporter.sources import SourceReading

log = logging.getLogger(__name__)


@dataclass
class EmptiedFleet:
    source: str  # the source's name, for the log line
    what: str  # what came back empty, in the source's words ("sinfo listed no GPU node")
    most_gpus: int = 0  # the most GPUs one read listed so far; 0: never had a fleet
    _down: bool = False  # logged for this outage already

    def check(self, reading: SourceReading) -> SourceReading:
        """``reading`` as it is, or with ``error`` set when its fleet vanished."""
        if reading.gpus:
            if self._down:
                log.info("source lists GPUs again", extra={"source": self.source,
                                                           "gpus": len(reading.gpus)})
                self._down = False
            self.most_gpus = max(self.most_gpus, len(reading.gpus))
            return reading
        if not self.most_gpus or reading.error:
            return reading
        error = f"empty fleet: {self.what}, after a read that listed {self.most_gpus} GPUs"
        if not self._down:  # once per outage, not every collection
            log.warning("source returned an empty fleet", extra={"source": self.source, "err": error})
            self._down = True
        return dataclasses.replace(reading, error=error)
