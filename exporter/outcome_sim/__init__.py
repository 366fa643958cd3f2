"""The outcome simulator behind ``gpufleet simulate``: the fleet over days, with jobs that
arrive, queue, run and leave (the fleet behind ``serve``'s ``sim`` source is
:mod:`exporter.fleet_sim`).

A discrete-event replay (docs/simulate.md): :mod:`.timeline` turns the
Alibaba spot-GPU trace's hourly rhythm and the openb pod shapes into jobs;
:mod:`.cluster` places them with the same placement engine ``replay`` and
the advisor use; :mod:`.scheduler` queues them (FIFO with backfill, as
Slurm, or Kubernetes' per-pod retry); :mod:`.strategies` are what acts on
the running fleet (nothing, a descheduler, KAI-like consolidation, the
advisor through :mod:`.advisor_loop`); :mod:`.outcomes` measures what the
jobs got; :mod:`.run` drives one (strategy, seed, load) run.
"""
