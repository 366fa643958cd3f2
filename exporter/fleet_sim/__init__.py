"""The fleet simulator behind ``serve``'s ``sim`` source: a model of the reference cluster,
its jobs and their telemetry (the outcome simulator of ``gpufleet simulate`` is
:mod:`exporter.outcome_sim`).

Not a source: :mod:`exporter.sources.sim.source` reads it on a clock and is handed it by
its ``build`` (the registry's factory), so that importing a source never loads
the placement engine the simulator places jobs with. ``gpufleet replay``,
``analyze`` and the benches use :class:`exporter.fleet_sim.fleet.Simulation`
directly.

- :mod:`exporter.fleet_sim.config`: what it reads of its config (the sim source's options
  fit it; it does not import them);
- :mod:`exporter.fleet_sim.jobs`: the job mix;
- :mod:`exporter.fleet_sim.fleet`: the fleet, its scenarios and its telemetry.
"""
