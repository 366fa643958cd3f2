"""Our renderer against prometheus-client's ``generate_latest``, and against promtool."""

from __future__ import annotations

import dataclasses
import gzip
import math
import random
import struct
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.utils import floatToGoString

from exporter.exposition import (
    GPU_FAMILIES,
    ExpositionOptions,
    Family,
    GpuLabelledFamily,
    LabelCache,
    go_texts,
    identity,
    render,
    render_text,
    snapshot_families,
)
from exporter.fleet_sim.fleet import Simulation
from exporter.metrics import CATALOGUE, IDENTITY
from exporter.snapshot import Gpu, GpuHealth, GpuPerformance, MigInstance, XidCount
from exporter.sources.sim.options import Scenario, SimSource
from tests.helpers import http_get, require_binary
from tests.helpers.servers import SMALL_GPUS

START = 1_760_000_000.0
NODE_MODE = ExpositionOptions()  # the defaults: every family, no cluster label


def _client_python_families(snapshot, extra=(), options=NODE_MODE):
    """The same data as client_python metric families, for generate_latest: every label
    (the cluster label too) is added here as a plain label of each sample."""
    const = dict(options.const_labels)
    families = []
    for gpu_family in GPU_FAMILIES:
        spec = gpu_family.spec
        if not options.serves(spec):
            continue
        if isinstance(gpu_family, GpuLabelledFamily):
            names = spec.labels[len(IDENTITY):]
            samples = [({**dict(identity(g)), **dict(zip(names, values, strict=True))}, v)
                       for g in snapshot.gpus for values, v in gpu_family.samples(g)]
        else:
            samples = [(dict(identity(g)), gpu_family.value(g)) for g in snapshot.gpus]
        families.append((spec.name, spec.type, spec.help,
                         [(labels, v) for labels, v in samples if v is not None]))
    for family in [*snapshot_families(snapshot), *extra]:
        if not options.serves_name(family.name):
            continue
        families.append((family.name, family.type, family.help,
                         [(dict(labels), v) for labels, v in family.samples]))
    out = []
    for name, kind, help_text, samples in families:
        if kind == "counter":
            metric = CounterMetricFamily(name.removesuffix("_total"), help_text)
        else:
            metric = GaugeMetricFamily(name, help_text)
        for labels, value in samples:
            metric.add_sample(name, {**labels, **const}, float(value))
        out.append(metric)
    return out


def _generate_latest(snapshot, extra=(), options=NODE_MODE):
    families = _client_python_families(snapshot, extra, options)

    class Snapshot:
        def collect(self):
            return families

        def describe(self):
            return []

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot())
    return generate_latest(registry)


def _snapshot(**changes):
    config = SimSource(seed=3, **changes)
    sim = Simulation(config, start_time=START)
    sim.advance(START + 1800)
    return sim.snapshot()


def test_render_is_byte_identical_to_generate_latest():
    snapshot = _snapshot(scenarios=(Scenario(kind="gpu_lost", node="gpu-004", gpu=1),))
    # values that exercise Go float formatting: exponents, integers, tiny values, escapes
    odd = Gpu("gpu-x", 0, 'GPU-"odd"\\uuid\n', "H100", "gpu-h100", memory_total_bytes=80 * 10**9,
              memory_used_bytes=0, utilization_ratio=1e-7, temperature_celsius=-3.0,
              power_watts=1234567.5, energy_joules=1.5e18, nvlink_transmit_bytes=float("inf"),
              mig=(MigInstance(3, "3g.40gb", 40 * 10**9, 5),))
    # issue 16: labelled per-GPU families, with a % in the identity (the renderer formats with %)
    health = Gpu("gpu-%s", 1, "GPU-100%", "H100", "gpu-%d", serial="1%s",
                 health=GpuHealth(xid_counts=(XidCount(48, 2), XidCount(79, 1)), last_xid=79,
                                  last_xid_time=1.76e9, ecc_single_bit_volatile=3,
                                  ecc_double_bit_aggregate=1, remapped_rows_failure=True,
                                  nvlink_replay_errors=12345678, clock_event_reasons=0x44),
                 performance=GpuPerformance(sm_clock_hertz=1.98e9, memory_clock_max_hertz=2.619e9,
                                            sm_active_ratio=0.25))
    snapshot = dataclasses.replace(snapshot, gpus=(*snapshot.gpus, odd, health))
    extra = [Family("gpufleet_test_extra", "gauge", "help with \\ and\nnewline",
                    [((("a", "x"), ("b", "y")), 0.1 + 0.2), ((), 1e21)])]
    ours = render_text(snapshot, LabelCache(), extra)
    assert ours == _generate_latest(snapshot, extra)
    # the values above must really have been rendered, not dropped
    assert b"gpufleet_gpu_power_watts{" in ours and b"1.2345675e+06" in ours
    assert b"+Inf" in ours
    assert b'gpufleet_gpu_xid_errors_total{gpu="1",model="H100",node="gpu-%s",pool="gpu-%d",' \
           b'uuid="GPU-100%",xid="79"} 1.0\n' in ours
    assert b'gpufleet_gpu_clock_event_active{gpu="1",model="H100",node="gpu-%s",pool="gpu-%d",' \
           b'reason="hw_thermal",uuid="GPU-100%"} 1.0\n' in ours
    assert b'serial="1%s"' in ours


def test_cluster_label_on_every_series_is_byte_identical_to_generate_latest():
    """issue 15: the config's `cluster` label, merged into every series in its sorted place
    (before `gpu` on per-GPU families, after `architecture` and `account` where they are)."""
    snapshot = _snapshot()
    extra = [Family("gpufleet_test_extra", "gauge", "h", [((("a", "x"), ("d", "y")), 1.0), ((), 2.0)])]
    options = ExpositionOptions(cluster='prod "eu"')
    ours = render_text(snapshot, LabelCache(), extra, options)
    assert ours == _generate_latest(snapshot, extra, options)
    samples = [line for line in ours.decode().splitlines() if not line.startswith("#")]
    assert samples and all('cluster="prod \\"eu\\""' in line for line in samples)
    assert 'gpufleet_test_extra{cluster="prod \\"eu\\""} 2.0' in samples
    # and without the option, no series has it
    assert b"cluster=" not in render_text(snapshot, LabelCache(), extra)


def test_no_family_has_a_label_named_cluster():
    """The cluster label is added to every series; a family with its own would carry it twice."""
    assert [name for name, spec in CATALOGUE.items() if "cluster" in spec.labels] == []


def _served_families(text: bytes) -> set[str]:
    return {line.split()[2] for line in text.decode().splitlines() if line.startswith("# TYPE")}


def test_per_gpu_off_serves_no_family_read_from_the_nodes():
    """issue 15: cluster mode re-exported every per-GPU series it read from Prometheus, so
    node mode and cluster mode under one Prometheus doubled every GPU count."""
    snapshot = _snapshot()
    everything = _served_families(render_text(snapshot))
    cluster = _served_families(render_text(snapshot, options=ExpositionOptions(
        per_gpu=False, reads_scheduler=False)))
    scheduler = {"gpufleet_gpu_allocated_ratio", "gpufleet_gpu_allocation_info",
                 "gpufleet_allocation_cpu_cores", "gpufleet_allocation_gpu_share_ratio",
                 "gpufleet_node_cpu_allocated_cores", "gpufleet_node_drained", "gpufleet_pending_jobs",
                 "gpufleet_pending_gpus"}
    fleet = {"gpufleet_source_up", "gpufleet_collect_duration_seconds",
             "gpufleet_last_collect_success_timestamp_seconds",
             "gpufleet_source_parse_errors_total", "gpufleet_source_series_refused_total",
             "gpufleet_compose_unmatched_gpus", "gpufleet_snapshot_timestamp_seconds",
             "gpufleet_build_info"}
    assert cluster == fleet
    # with a scheduler read here (Slurm), its joins are served too: this process makes them
    with_slurm = _served_families(render_text(
        snapshot, options=ExpositionOptions(per_gpu=False, reads_scheduler=True)))
    assert with_slurm == fleet | scheduler
    # node mode without a scheduler (NVML, dcgm) serves no joins: it knows no jobs, and its
    # zeros would sit beside cluster mode's Slurm view (every GPU counted idle)
    nvml = _served_families(render_text(snapshot, options=ExpositionOptions(
        per_gpu=True, reads_scheduler=False)))
    assert not nvml & scheduler and fleet < nvml
    # node mode on the simulator (its own scheduler) serves everything
    everything = _served_families(render_text(
        snapshot, options=ExpositionOptions(per_gpu=True, reads_scheduler=True)))
    assert fleet | scheduler < everything
    assert {"gpufleet_gpu_up", "gpufleet_gpu_info", "gpufleet_gpu_mig_instance_info",
            "gpufleet_node_info", "gpufleet_node_cpu_cores"} <= everything - with_slurm
    assert ExpositionOptions(per_gpu=False).serves(CATALOGUE["gpufleet_cluster_fragmentation_index"])


def test_every_gpu_family_is_read_from_the_nodes():
    """A GPU_FAMILIES row is per-GPU telemetry: cluster mode must never serve it."""
    assert {f.spec.producer for f in GPU_FAMILIES} == {"node"}


def test_lost_gpu_exports_only_up_zero():
    snapshot = _snapshot(scenarios=(Scenario(kind="gpu_lost", node="gpu-004", gpu=1),))
    text = render_text(snapshot).decode()
    lines = [line for line in text.splitlines() if 'node="gpu-004"' in line and 'gpu="1"' in line]
    by_name = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in lines}
    assert by_name["gpufleet_gpu_up"] == "0.0"
    assert "gpufleet_gpu_utilization_ratio" not in by_name  # absent, never 0 or NaN
    assert "gpufleet_gpu_temperature_celsius" not in by_name
    assert by_name["gpufleet_gpu_info"] == "1.0"


def test_gzip_body_is_the_text_body():
    rendered = render(_snapshot())
    # one gzip member per block, end to end; the standard library reads them as one body
    assert gzip.decompress(rendered.gzipped) == rendered.text == render_text(_snapshot())
    assert rendered.gzipped.count(b"\x1f\x8b\x08") > len(GPU_FAMILIES)
    samples = [line for line in rendered.text.split(b"\n") if line and not line.startswith(b"#")]
    assert rendered.series == len(samples)
    assert rendered.text_bytes == len(rendered.text)


def test_blocks_reused_from_the_last_snapshot_give_the_bytes_of_a_fresh_render():
    """issue 14, Build 8: a block is re-rendered only when its inputs changed. Over more GPUs
    than one block holds, with a GPU lost, jobs moved and the cluster label changed between
    renders, the cached render equals a fresh one and generate_latest's, every time."""
    config = SimSource(seed=5)
    sim = Simulation(config, start_time=START)
    labels = LabelCache()
    for step, (options, scenarios) in enumerate((
        (NODE_MODE, ()),
        (NODE_MODE, ()),
        (ExpositionOptions(cluster="a"), ()),
        (ExpositionOptions(cluster="a"), (Scenario(kind="gpu_lost", node="gpu-007", gpu=2),)),
        (ExpositionOptions(per_gpu=False, reads_scheduler=False, cluster="a"), ()),
        (NODE_MODE, ()),
        (NODE_MODE, ("xid",)),
    )):
        sim.advance(START + 600 * (step + 1))
        snapshot = sim.snapshot()
        if scenarios == ("xid",):  # one GPU's health part replaced: its blocks are redone
            render(snapshot, labels, options=options)  # the same snapshot unchanged, first
            hit = [dataclasses.replace(g, health=dataclasses.replace(g.health, last_xid=79.0))
                   if (g.node, g.index) == ("gpu-130", 3) else g for g in snapshot.gpus]
            snapshot = dataclasses.replace(snapshot, gpus=tuple(hit))
        elif scenarios:  # the lost GPU: up 0, its values and parts gone
            lost = [dataclasses.replace(g, up=False, utilization_ratio=None, health=None,
                                        performance=None)
                    if (g.node, g.index) == ("gpu-007", 2) else g for g in snapshot.gpus]
            snapshot = dataclasses.replace(snapshot, gpus=tuple(lost))
        before = dict(labels.blocks)
        cached = render(snapshot, labels, options=options)
        assert len(snapshot.gpus) > 1024  # two blocks per per-GPU family at least
        assert cached.text == render_text(snapshot, LabelCache(), options=options), step
        assert cached.text == _generate_latest(snapshot, options=options), step
        if scenarios == ("xid",):
            assert 'gpufleet_gpu_last_xid{gpu="3",model="B200",node="gpu-130"' in cached.text.decode()
            where = [(g.node, g.index) for g in snapshot.gpus].index(("gpu-130", 3)) // 1024 * 1024
            reused = [key for key, block in labels.blocks.items() if before.get(key) is block]
            assert ("gpufleet_gpu_last_xid", where) not in reused
            assert ("gpufleet_gpu_last_xid", 1024 - where) in reused  # the other block's GPUs kept theirs
        if step == 1:  # the second of two snapshots: static families were not re-rendered
            reused = [key for key, block in labels.blocks.items() if before.get(key) is block]
            assert ("gpufleet_gpu_memory_total_bytes", 0) in reused
            assert ("gpufleet_gpu_utilization_ratio", 0) not in reused


def test_a_job_that_ends_rebuilds_the_allocation_lines_of_its_gpus_only():
    """issue 14, Build 8: the allocation families are rebuilt per GPU inside a block. A job that
    ends changes its GPUs' lines; every other GPU of the block keeps the very string it had,
    and the body is still a fresh render's."""
    sim = Simulation(SimSource(seed=5), start_time=START)
    sim.advance(START + 1800)
    snapshot = sim.snapshot()
    labels = LabelCache()
    render(snapshot, labels)
    gone = next(a for a in snapshot.allocations if len(a.placements) == 1)
    node, index = gone.placements[0].node, gone.placements[0].gpus[0]
    where = [(g.node, g.index) for g in snapshot.gpus].index((node, index))
    start, offset = where // 1024 * 1024, where % 1024
    key = ("gpufleet_gpu_allocated_ratio", start)
    before = labels.blocks[key]
    info = labels.blocks[("gpufleet_gpu_info", start)]
    assert before.pieces is not None and f'node="{node}"' in before.pieces[offset]
    assert before.pieces[offset].endswith(" 1.0\n")  # the job holds the whole GPU
    ended = dataclasses.replace(snapshot, allocations=tuple(
        a for a in snapshot.allocations if a is not gone))
    cached = render(ended, labels)
    assert cached.text == render_text(ended, LabelCache())
    assert cached.text == _generate_latest(ended)
    after = labels.blocks[key]
    assert after is not before  # the block was rebuilt ...
    assert after.pieces is not None and after.pieces[offset].endswith(" 0.0\n")
    changed = [i for i, (old, new) in enumerate(zip(before.pieces, after.pieces, strict=True))
               if old is not new]
    assert offset in changed and len(changed) == len(gone.placements[0].gpus)  # ... for its GPUs
    assert labels.blocks[("gpufleet_gpu_info", start)] is info  # gpu_info reads no holder


def test_labelled_families_escape_hostile_identity_values_as_generate_latest_does():
    """The labelled families paste each GPU's identity text around their extra labels. Node,
    pool and UUID text comes from sources: quotes, backslashes, line breaks, a NUL and text
    that looks like a label pair must come out as client_python writes them, with the
    cluster label first or not at all."""
    snapshot = _snapshot()
    hostile = ['a"b', "c\\d", "e\nf", "g\x00h", 'x,uuid="y', "", "{}"]
    gpus = [dataclasses.replace(g, node=hostile[i % len(hostile)] + g.node,
                                pool=hostile[(i + 3) % len(hostile)],
                                uuid=g.uuid + hostile[(i + 5) % len(hostile)])
            if i % 97 < len(hostile) else g for i, g in enumerate(snapshot.gpus)]
    odd = dataclasses.replace(snapshot, gpus=tuple(gpus))
    for options in (NODE_MODE, ExpositionOptions(cluster='k"\x00'), ExpositionOptions(cluster="zz")):
        text = render_text(odd, LabelCache(), options=options)
        assert text == _generate_latest(odd, options=options)
        assert b'gpufleet_gpu_ecc_errors_total{counter="' in text or options.cluster


def test_go_texts_are_client_pythons_text_for_every_kind_of_value():
    """go_texts formats a block's values in C (msgspec's shortest digits, ``e`` with a computed
    precision for whole numbers); each text must be floatToGoString's, which generate_latest
    writes: random bit patterns (subnormals, NaN, huge), every decade of both signs, whole
    numbers with and without trailing zeros up to 2**53 and past it, and the edges."""
    rng = random.Random(14)
    bits = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            for _ in range(50_000)]
    decades = [rng.choice((1, -1)) * rng.random() * 10.0 ** rng.randint(-9, 20)
               for _ in range(50_000)]
    whole = [float(rng.randrange(1, 10 ** rng.randint(1, 16)) * 10 ** rng.randint(0, 12))
             for _ in range(50_000)]
    counters = [rng.randrange(10 ** 6, 2 ** 53) for _ in range(10_000)]  # ints, as NVML gives
    edges = [0.0, -0.0, 1.0, True, False, 1e-4, 9.999999999999999e-05, -1e-4, 999999.9999999999,
             1e6, -1e6, 1000000.5, 1e6 - 0.5, 2.0 ** 53 - 1, 2.0 ** 53, 2.0 ** 53 + 2, 1e15, 1e16,
             1.5e16, 5e-324, 1.7976931348623157e308, math.nan, math.inf, -math.inf, 3e9, 141e9]
    for values in (bits, decades, whole, counters, edges, edges[:1], []):
        assert go_texts(values) == [floatToGoString(v) for v in values]


def test_every_per_gpu_series_carries_identity_labels():
    text = render_text(_snapshot()).decode()
    for line in text.splitlines():
        if line.startswith("gpufleet_gpu_"):
            for label in ("node=", "gpu=", "uuid=", "model=", "pool="):
                assert label in line, line


def test_promtool_check_metrics_on_a_real_scrape(exporter_factory):
    promtool = require_binary("promtool")
    exporter = exporter_factory("--seed", "11")
    body = http_get(f"{exporter.url}/metrics")
    assert body.count(b"\ngpufleet_gpu_utilization_ratio{") == SMALL_GPUS  # one per GPU
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"" and result.stderr == b""


def test_labels_never_collide_with_prometheus_target_labels_and_agree_across_families():
    """issue 15: the MIG `instance` label arrived as `exported_instance` (Prometheus's target
    label wins), and node_info said `generation` where gpu_info says `architecture`."""
    mig = Gpu("gpu-x", 0, "GPU-x", "A100", "gpu-a100", mig=(MigInstance(3, "3g.40gb", 40, 5),))
    snapshot = dataclasses.replace(_snapshot(), gpus=(mig,))
    families = {}
    for line in render_text(snapshot).decode().splitlines():
        if "{" in line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            families.setdefault(name, set()).update(
                part.split("=")[0] for part in rest.split("}")[0].split(","))
    for name, labels in families.items():
        assert "instance" not in labels, name  # `job` on allocation_info is known: exported_job
    assert {"gpu_instance", "profile"} <= families["gpufleet_gpu_mig_instance_info"]
    assert "architecture" in families["gpufleet_node_info"]
    assert "generation" not in families["gpufleet_node_info"]


def test_per_gpu_auto_is_off_only_with_the_prometheus_source_and_the_config_can_force_it():
    from exporter.cli.serve import exposition_options
    from exporter.config import Config as ConfigClass
    from exporter.config import ConfigError, build

    class Slurm:
        role = "allocation"

    def options(data, names, sources=()):
        return exposition_options(build(ConfigClass, data), names, list(sources))

    class Sim:
        role = "full"
        schedules = True

    class Nvml:
        pass

    assert options({}, ["sim"], [Sim()]) == ExpositionOptions(per_gpu=True, reads_scheduler=True)
    assert options({}, ["nvml"], [Nvml()]) == ExpositionOptions(per_gpu=True,
                                                                reads_scheduler=False)
    assert options({}, ["nvml"]).per_gpu and options({}, ["dcgm"]).per_gpu
    assert options({}, ["prometheus"]) == ExpositionOptions(per_gpu=False, reads_scheduler=False)
    assert options({}, ["slurm", "prometheus"], [Slurm()]) == ExpositionOptions(
        per_gpu=False, reads_scheduler=True)
    # YAML's true and false are the setting's words, not a type error
    assert options({"exposition": {"per_gpu": True}}, ["prometheus"]).per_gpu is True
    assert options({"exposition": {"per_gpu": False}}, ["sim"]).per_gpu is False
    assert options({"cluster": "prod"}, ["sim"]).cluster == "prod"
    from exporter.sources.sim.source import SimulatedFleetSource
    assert SimulatedFleetSource.schedules is True
    for data, message in (
        ({"exposition": {"per_gpu": "yes"}},
         "exposition.per_gpu: must be one of auto, true, false, got 'yes'"),
        ({"cluster": "a\nb"}, "cluster: must be at most 128 printable characters, got 'a\\nb'"),
        ({"cluster": 7}, "cluster: must be a string, got 7"),
    ):
        with pytest.raises(ConfigError) as raised:
            build(ConfigClass, data)
        assert str(raised.value) == message


def test_the_family_table_is_the_catalogues_per_gpu_families_in_its_order():
    """GPU_FAMILIES is made from the catalogue's records; the joined families' samples are
    written by hand (exposition/families.py), so a new one in the catalogue fails here."""
    from exporter.exposition import GPU_SNAPSHOT_FAMILIES

    assert [f.spec for f in GPU_FAMILIES] == [
        s for s in CATALOGUE.values() if s.kind in ("gpu", "gpu_labelled")]
    assert list(GPU_SNAPSHOT_FAMILIES) == [s for s in CATALOGUE.values() if s.kind == "gpu_joined"]
    by_name = {f.spec.name: f for f in GPU_FAMILIES}
    assert by_name["gpufleet_gpu_fan_speed_ratio"].part == "performance"
    assert by_name["gpufleet_gpu_xid_errors_total"].part == "health"
    assert by_name["gpufleet_gpu_utilization_ratio"].part is None
