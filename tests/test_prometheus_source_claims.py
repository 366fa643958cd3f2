"""A node speaks only for itself, in cluster mode: through a real Prometheus scraping two
node exporters' expositions, one of which also publishes series naming the other's node.

Each GPU's series (up, stale, utilisation, memory, power, the old-sample query) count only
from the scrape target (``job``, ``instance``) that serves the node's identity, as the
nodes' summaries do; another target's are refused, counted in
``gpufleet_source_parse_errors_total`` and logged, never taken over the node's own. A node
whose identity two targets serve is left out of the read (its last good reading served
stale), so a lie can neither overwrite nor invent a GPU.

Allocations too: a node's jobs count only from its identity target, or from the scheduler's
exporter named in ``allocation_selector`` (here scraped with ``honor_labels: true``, as Slurm
and Kubernetes allocation exporters often are, so its series' ``job`` is the scheduler's job and
the selector names its ``instance``). Every refused series counts by the target that sent it
(``gpufleet_source_series_refused_total{source, target}``), beside the parse errors.

The expositions are static files (the node exporters' side is not under test; their values
are then exact), served by ``python -m http.server`` and scraped every second.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter import metrics
from exporter.exposition.families import fleet_families
from exporter.snapshot import FleetSnapshot, SourceStatus, TargetCount
from exporter.sources.prometheus.options import PrometheusSource as PrometheusConfig
from exporter.sources.prometheus.source import build
from tests.helpers import free_port, stop
from tests.helpers.servers import wait_http

pytestmark = pytest.mark.slow

JOB = "gpufleet-nodes"


def _gpu(node: str, gpu: int, *, util: float, power: float, up: int = 1) -> list[str]:
    labels = f'node="{node}",gpu="{gpu}",uuid="GPU-{node}-{gpu}",model="H100",pool="p"'
    return [f"gpufleet_gpu_info{{{labels},architecture=\"hopper\"}} 1",
            f"gpufleet_gpu_up{{{labels}}} {up}", f"gpufleet_gpu_stale{{{labels}}} 0",
            f"gpufleet_gpu_utilization_ratio{{{labels}}} {util}",
            f"gpufleet_gpu_memory_used_bytes{{{labels}}} {int(util * 80e9)}",
            f"gpufleet_gpu_memory_total_bytes{{{labels}}} 80000000000",
            f"gpufleet_gpu_power_watts{{{labels}}} {power}"]


def _node(node: str, gpus: int) -> list[str]:
    labels = f'node="{node}",pool="p",model="H100"'
    return ['gpufleet_build_info{version="test"} 1',
            f'gpufleet_node_info{{{labels},architecture="hopper",gpus="{gpus}"}} 1',
            f"gpufleet_node_cpu_cores{{{labels}}} 128",
            f'gpufleet_node_gpus{{{labels},state="up"}} {gpus}']


def _alloc(node: str, gpu: int, job: str, cpus: int) -> list[str]:
    info = (f'node="{node}",gpu="{gpu}",uuid="GPU-{node}-{gpu}",model="H100",pool="p",'
            f'job="{job}",namespace="",pod="",account="a",job_gpus="1",priority="0"')
    return [f"gpufleet_gpu_allocation_info{{{info}}} 1",
            f'gpufleet_allocation_cpu_cores{{job="{job}",node="{node}"}} {cpus}']


# gpu-a's node exporter knows its own job (the simulator's, or NVML with the kubelet's
# PodResources); the scheduler's exporter places another on gpu-l
HONEST = "\n".join([*_node("gpu-a", 2), *_gpu("gpu-a", 0, util=0.25, power=300.0),
                    *_gpu("gpu-a", 1, util=0.5, power=310.0), *_alloc("gpu-a", 0, "train", 8),
                    ""])
SCHEDULER = "\n".join(['gpufleet_build_info{version="test"} 1', *_alloc("gpu-l", 0, "sched-1", 4),
                       ""])
LIAR_OWN = [*_node("gpu-l", 1), *_gpu("gpu-l", 0, util=0.75, power=320.0)]
# gpu-l's exporter also speaks for gpu-a: GPU 0 down and busy, GPU 1 stale and at 999 W,
# and (where the summaries are read) gpu-a's summary says both GPUs are down
_A = 'node="gpu-a",uuid="GPU-x",model="H100",pool="p"'
LIES = [f'gpufleet_gpu_up{{{_A},gpu="0"}} 0', f'gpufleet_gpu_utilization_ratio{{{_A},gpu="0"}} 0.99',
        f'gpufleet_gpu_power_watts{{{_A},gpu="1"}} 999', f'gpufleet_gpu_stale{{{_A},gpu="1"}} 1',
        'gpufleet_node_gpus{node="gpu-a",pool="p",model="H100",state="down"} 2',
        # and places a job of its own on gpu-a's GPU 1, with 64 of its CPUs
        *_alloc("gpu-a", 1, "fake", 64)]
# and then it invents a GPU 5 on gpu-a, with its identity
INVENTED = [*LIES, *_gpu("gpu-a", 5, util=0.9, power=700.0)]


def _view(snapshot: FleetSnapshot) -> list[tuple]:
    return [(g.node, g.index, g.uuid, g.up, g.stale, g.utilization_ratio, g.memory_used_bytes,
             g.memory_total_bytes, g.power_watts) for g in snapshot.gpus]


def _jobs(snapshot: FleetSnapshot) -> list[tuple]:
    return [(a.job, tuple((p.node, p.gpus, p.cpus) for p in a.placements))
            for a in snapshot.allocations]


JOBS = [("sched-1", (("gpu-l", (0,), 4.0),)), ("train", (("gpu-a", (0,), 8.0),))]
HONEST_VIEW = [
    ("gpu-a", 0, "GPU-gpu-a-0", True, False, 0.25, 20_000_000_000, 80_000_000_000, 300.0),
    ("gpu-a", 1, "GPU-gpu-a-1", True, False, 0.5, 40_000_000_000, 80_000_000_000, 310.0),
    ("gpu-l", 0, "GPU-gpu-l-0", True, False, 0.75, 60_000_000_000, 80_000_000_000, 320.0),
]


@pytest.mark.parametrize("summaries", [False, True], ids=["each-gpu", "summaries"])
def test_a_target_naming_another_nodes_gpus_is_refused_and_counted(
        tmp_path: Path, prometheus_factory, caplog, summaries: bool):
    sites = {name: tmp_path / name for name in ("honest", "liar", "scheduler")}
    first = {"honest": HONEST, "liar": "\n".join([*LIAR_OWN, ""]), "scheduler": SCHEDULER}
    for name, site in sites.items():
        site.mkdir()
        (site / "metrics").write_text(first[name])
    procs: list[subprocess.Popen] = []
    ports: dict[str, int] = {}
    try:
        for name, site in sites.items():
            ports[name] = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "http.server", str(ports[name]), "--bind", "127.0.0.1",
                 "--directory", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http(f"http://127.0.0.1:{ports[name]}/metrics", timeout=30, proc=procs[-1])
        targets = ", ".join(f'"127.0.0.1:{ports[name]}"' for name in ("honest", "liar"))
        scheduler = f"127.0.0.1:{ports['scheduler']}"
        prom = prometheus_factory(f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: {JOB}
    static_configs: [{{targets: [{targets}]}}]
  - job_name: gpufleet-cluster
    honor_labels: true
    static_configs: [{{targets: ["{scheduler}"]}}]
""")
        def liar_says(lines: list[str], check: str) -> None:
            (sites["liar"] / "metrics").write_text("\n".join([*LIAR_OWN, *lines, ""]))
            prom.wait_for(check, bool)

        async def reads() -> list[tuple[list[tuple], int, int, list[tuple], tuple]]:
            source = build(PrometheusConfig(url=prom.url, selector=f'job="{JOB}"',
                                            allocation_selector=f'instance="{scheduler}"',
                                            node_summaries=summaries,
                                            identity_refresh=0.001), time.time)
            out = []
            try:
                for lines, check in (
                        ([], 'count(gpufleet_gpu_up{node="gpu-l"}) == 1'),  # an honest fleet
                        (LIES, 'gpufleet_gpu_power_watts{node="gpu-a",gpu="1"} == 999'),
                        (INVENTED, 'gpufleet_gpu_info{node="gpu-a",gpu="5"}')):
                    await asyncio.to_thread(liar_says, lines, check)
                    reading = await source.read()
                    assert reading.error == ""
                    snapshot = FleetSnapshot(0.0, reading.nodes, reading.gpus,
                                             reading.allocations)
                    out.append((_view(snapshot), reading.parse_errors, source.series_refused,
                                _jobs(snapshot), reading.series_refused))
            finally:
                await source.close()
            return out

        prom.wait_for("count(gpufleet_gpu_info)", lambda r: bool(r) and r[0]["value"][1] == "3")
        prom.wait_for('gpufleet_allocation_cpu_cores{job="sched-1"}', bool)
        with caplog.at_level(logging.WARNING, logger="exporter.sources.prometheus.source"):
            honest, lied, invented = asyncio.run(reads())
    finally:
        for proc in procs:
            stop(proc)

    liar = f"{JOB}/127.0.0.1:{ports['liar']}"
    honest_target = f"{JOB}/127.0.0.1:{ports['honest']}"
    # an honest fleet reads as it is, nothing counted: gpu-a's job from its own exporter, the
    # scheduler's job on gpu-l from the target allocation_selector names
    assert honest == (HONEST_VIEW, 0, 0, JOBS, ())
    # the lies change nothing of gpu-a: each lie about one GPU's series refused and counted
    # (with the summaries, gpu-a's lying summary is ignored and counted too, and gpu-a read
    # per GPU: its own series say all up); the job it placed on gpu-a is refused too (its
    # allocation info and CPU cores: 2 series)
    view, errors, refused, jobs, by_target = lied
    assert (view, jobs) == (HONEST_VIEW, JOBS)
    assert refused == 4 + 2 and errors == 4 + 2 + summaries
    # the counter by target: every one of them is the liar's
    assert by_target == (TargetCount(liar, 4 + 2 + summaries),)
    # a GPU invented with its identity: gpu-a has two targets serving its identity, so no
    # target's word is taken; gpu-a is left out of the read and its last good reading is
    # served, stale; no GPU 5 appears; gpu-l, the liar's own node, still reads
    view, errors, refused, jobs, by_target = invented
    assert view == [(*HONEST_VIEW[0][:4], True, *HONEST_VIEW[0][5:]),
                    (*HONEST_VIEW[1][:4], True, *HONEST_VIEW[1][5:]), HONEST_VIEW[2]]
    # gpu-a's job is its last good reading's, served with it; the liar's is nowhere
    assert jobs == JOBS
    # refused this read: gpu-a's identity rows (2 from its own target, GPU 5's from the liar),
    # every series of its GPUs from either target (5 families read each read and memory total,
    # read again for gpu-a, whose identity changed: of GPUs 0 and 1 from its own, the 4 lies
    # and GPU 5's 6), its node record (node_info, CPU cores) and its allocations (2 from each)
    assert refused - 6 == 3 + 2 * 6 + 4 + 6 + 2 + 2 * 2
    # with the summaries, both targets' summaries of gpu-a are ignored too
    assert errors - (6 + summaries) == refused - 6 + 2 * summaries
    # by target, since start: the liar's lies of both reads (the 4 lies and its job's 2, then
    # those again, GPU 5's identity and 6 values; its summary each read), gpu-a's own (its 2
    # identity rows and 12 values, its node record's 2 series, its job's 2; its summary)
    assert by_target == tuple(sorted([
        TargetCount(liar, (4 + 2 + summaries) + (4 + 2 + 1 + 6 + summaries)),
        TargetCount(honest_target, 2 + 2 * 6 + 2 + 2 + summaries)], key=lambda t: t.target))
    # and that is what /metrics serves
    status = SourceStatus("prometheus", True, 0.0, None, series_refused=by_target)
    (family,) = [f for f in fleet_families(FleetSnapshot(0.0, sources=(status,)))
                 if f.name == metrics.SOURCE_SERIES_REFUSED_TOTAL.name]
    assert sorted(family.samples) == sorted(
        ((("source", "prometheus"), ("target", t.target)), float(t.count)) for t in by_target)
    # logged once per target and change: the liar, then both targets once gpu-a is contested
    logged = [(r.target, r.nodes, r.series, r.err)  # type: ignore[attr-defined]
              for r in caplog.records if r.getMessage().startswith("GPU series refused")]
    assert logged[0] == (liar, "gpu-a", 6, f"the node's identity comes from {honest_target}")
    assert sorted(logged[1:]) == sorted([
        (liar, "gpu-a", 13, "several targets serve the node's identity"),
        (honest_target, "gpu-a", 18, "several targets serve the node's identity")])
