"""Preemption as the scheduler runs it, watched: how often jobs are stopped, by cause and pool,
the work each stop lost (the time since the job's last checkpoint), the overhead that is of the
work the pool delivered, and the stopped jobs waiting to resume.

The sources say what the scheduler did (:class:`exporter.snapshot.Interruption`: Slurm's
requeue count and suspend, a pod's ``DisruptionTarget`` condition); :mod:`.watch` turns the
snapshots into counters, :mod:`.stage` runs it in the cycle. The overhead over a window is the
rules' arithmetic on the counters (``increase`` of the lost GPU-seconds over ``increase`` of
the delivered ones), so a restarted exporter loses nothing Prometheus has not already kept.
"""
