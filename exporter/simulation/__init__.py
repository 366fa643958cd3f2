"""The simulated fleet: a model of the reference cluster, its jobs and their telemetry.

Not a source: :mod:`exporter.sources.sim.source` reads it on a clock and is handed it by
its ``build`` (the registry's factory), so that importing a source never loads
the placement engine the simulator places jobs with. ``gpufleet replay``,
``analyze`` and the benches use :class:`exporter.simulation.fleet.Simulation`
directly.

- :mod:`exporter.simulation.config`: what it reads of its config (the sim source's options
  fit it; it does not import them);
- :mod:`exporter.simulation.jobs`: the job mix;
- :mod:`exporter.simulation.fleet`: the fleet, its scenarios and its telemetry.
"""
