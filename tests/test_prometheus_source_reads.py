"""What cluster mode reads each cycle (issue 45, Build 1): only the families the cycle uses,
identity now and then (through VictoriaMetrics' export API where it has one), and identity
held as rows, not label dicts."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from exporter.sources.prometheus.options import PrometheusSource as PrometheusConfig
from exporter.sources.prometheus.source import (
    GPU_VALUES,
    USED_VALUES,
    build,
    build_queries,
    identity_from_csv,
    identity_rows,
)
from tests.helpers import free_port, require_binary, stop
from tests.helpers.servers import start_server

GPU = {"gpu": "0", "uuid": "GPU-1", "model": "H100", "pool": "p", "instance": "10.0.0.1:9874",
       "job": "nodes"}
UP_QUERY = "max by (node, gpu, instance, job) (gpufleet_gpu_up{"


def _series(name: str, value: float | str, **labels: str) -> dict:
    return {"metric": {"__name__": name, **labels}, "value": [100.0, str(value)]}


def _vector(series: list[dict]) -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": "vector", "result": series}}).encode()


def _gpus(*nodes: str) -> list[dict]:
    return [dict(GPU, node=n, uuid=f"GPU-{n}") for n in nodes]


class FakeBackend:
    """A Prometheus API on 127.0.0.1: ``query(expr, read)`` answers each instant query (the
    read's number counted by its up queries), ``export(form)`` the export API (None: 404, as
    Prometheus answers). Records every query and export request."""

    def __init__(self, query: Callable[[str, int], list[dict]],
                 export: Callable[[dict], bytes] | None = None) -> None:
        self.query, self.export = query, export
        self.queries: list[str] = []
        self.exports: list[dict] = []  # identity's
        self.value_exports: list[dict] = []  # the value families'
        self.reads = 0
        self.source: Any = None  # the source of the last run, for its counters

    def values_csv(self, form: dict) -> bytes:
        """A value family's export as VictoriaMetrics answers it: what its query answers now,
        scraped every 10 s, the newest 1 s before the window's end: the rows in the window."""
        end, start = float(form["end"]), float(form["start"])
        series = self.query(f"max by (node, gpu, instance, job) ({form['match[]']})", self.reads)
        return "".join(f"{int((end - ago) * 1000)},{s['value'][1]},{s['metric'].get('node', '')},"
                       f"{s['metric'].get('gpu', '')},{s['metric'].get('instance', '')},"
                       f"{s['metric'].get('job', '')}\n"
                       for s in series for ago in (11, 1) if end - ago >= start).encode()

    def count(self, prefix: str) -> int:
        return sum(q.startswith(prefix) for q in self.queries)

    async def run(self, config: dict, reads: int, between=None) -> list:
        from aiohttp import web

        from exporter.collect import Collector

        async def on_query(request: web.Request) -> web.Response:
            expr = str((await request.post())["query"])
            self.queries.append(expr)
            if expr.startswith(UP_QUERY):
                self.reads += 1
            return web.Response(body=_vector(self.query(expr, self.reads)),
                                content_type="application/json")

        async def on_export(request: web.Request) -> web.Response:
            form = dict(await request.post())
            identity = form["match[]"].startswith("gpufleet_gpu_info")
            (self.exports if identity else self.value_exports).append(form)
            if self.export is None:
                return web.Response(status=404, text="404 page not found")
            body = self.export(form) if identity else self.values_csv(form)
            return web.Response(body=body, content_type="text/csv")

        app = web.Application()
        app.router.add_post("/api/v1/query", on_query)
        app.router.add_post("/api/v1/export/csv", on_export)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        source = self.source = build(PrometheusConfig(url=f"http://127.0.0.1:{port}", **config),
                                     time.time)
        collector = Collector([source], timeout_seconds=20)
        try:
            snapshots = []
            for i in range(reads):
                snapshots.append(await collector.collect())
                if between is not None:
                    between(i)
            return snapshots
        finally:
            await source.close()
            await runner.cleanup()


def _fleet(identity: Callable[[int], list[str]], up: Callable[[int], list[str]],
           value: Callable[[str], float | None] = lambda family: None):
    """A query answerer: identity and up list these nodes' GPU 0 at each read; each other
    value family its ``value`` (None: no series)."""
    def answer(expr: str, read: int) -> list[dict]:
        if expr.startswith("gpufleet_gpu_info"):
            return [_series("gpufleet_gpu_info", 1, **g) for g in _gpus(*identity(max(read, 1)))]
        if expr.startswith(UP_QUERY):
            return [_series("gpufleet_gpu_up", 1, **g) for g in _gpus(*up(read))]
        for family in GPU_VALUES:
            if expr.startswith(f"max by (node, gpu, instance, job) ({family}{{"):
                v = value(family)
                return [] if v is None else [_series(family, v, **g)
                                             for g in _gpus(*up(read))]
        return []
    return answer


def test_only_the_families_the_cycle_uses_are_read_unless_telemetry_is_asked_for():
    used = build_queries(PrometheusConfig(node_summaries=False))  # each GPU's up and stale
    assert set(used) == {"identity", "old", "nodes", "allocations", "mig", "targets",
                         *USED_VALUES}
    assert sorted(USED_VALUES) == [
        "gpufleet_gpu_memory_total_bytes", "gpufleet_gpu_memory_used_bytes",
        "gpufleet_gpu_power_watts", "gpufleet_gpu_stale", "gpufleet_gpu_up",
        "gpufleet_gpu_utilization_ratio"]
    every = build_queries(PrometheusConfig(gpu_telemetry=True, node_summaries=False))
    assert set(every) - set(used) == set(GPU_VALUES) - USED_VALUES
    assert len(GPU_VALUES) - len(USED_VALUES) == 7

    values = {"gpufleet_gpu_temperature_celsius": 61.0, "gpufleet_gpu_power_watts": 300.0,
              "gpufleet_gpu_utilization_ratio": 0.5}
    answer = _fleet(lambda r: ["a"], lambda r: ["a"], values.get)
    for telemetry, temperature in ((False, None), (True, 61.0)):
        backend = FakeBackend(answer)
        (snapshot,) = asyncio.run(backend.run({"gpu_telemetry": telemetry,
                                               "node_summaries": False}, reads=1))
        (gpu,) = snapshot.gpus
        assert (gpu.power_watts, gpu.utilization_ratio, gpu.temperature_celsius) == (
            300.0, 0.5, temperature)
        assert backend.count(
            "max by (node, gpu, instance, job) (gpufleet_gpu_temperature_celsius") == telemetry
        assert len(backend.queries) == (19 if telemetry else 12)


def test_identity_is_read_again_only_when_up_answers_for_other_gpus():
    # reads 1-3: a and b; 4: c joins; 5: c's series are going stale, identity still lists
    # it; 6: identity no longer does (c is lost: its last reading is kept, stale)
    def up(read: int) -> list[str]:
        return ["a", "b", "c"] if read == 4 else ["a", "b"]

    def identity(read: int) -> list[str]:
        return ["a", "b"] if read < 4 or read > 5 else ["a", "b", "c"]

    backend = FakeBackend(_fleet(identity, up))
    snapshots = asyncio.run(backend.run({}, reads=7))
    assert [len(s.gpus) for s in snapshots] == [2, 2, 2, 3, 3, 3, 3]
    assert [[g.node for g in s.gpus if g.stale] for s in snapshots] == [
        [], [], [], [], ["c"], ["c"], ["c"]]
    # read 1, then reads 4, 5 and 6 (up and the kept identity disagree), not 2, 3 and 7
    assert backend.count("gpufleet_gpu_info") == 4
    assert backend.count(UP_QUERY) == 7
    assert len(backend.exports) == 1  # 404: the export API is not asked again


def test_identity_is_read_again_after_identity_refresh():
    backend = FakeBackend(_fleet(lambda r: ["a"], lambda r: ["a"]))
    asyncio.run(backend.run({"identity_refresh": 0.001}, reads=3))
    assert backend.count("gpufleet_gpu_info") == 3
    backend = FakeBackend(_fleet(lambda r: ["a"], lambda r: ["a"]))
    asyncio.run(backend.run({}, reads=3))
    assert backend.count("gpufleet_gpu_info") == 1


def test_identity_through_the_export_api_the_query_when_it_names_other_gpus():
    """The export's window holds GPUs gone (b, whose newest row is older): its identity is
    used when up answers for the same GPUs, and read by query when not."""
    # served by the target that serves each GPU's series (GPU's instance and job)
    rows = {"a": "1000,1,a,0,GPU-a,H100,p,10.0.0.1:9874,nodes\n"
                 "2000,1,a,0,GPU-a,H100,p,10.0.0.1:9874,nodes\n",
            "b": "1500,1,b,0,GPU-b,H100,p,10.0.0.1:9874,nodes\n"}
    ups = {1: ["a", "b"], 2: ["a"]}
    backend = FakeBackend(_fleet(lambda r: ups.get(r, ["a"]), lambda r: ups.get(r, ["a"])),
                          export=lambda form: "".join(rows.values()).encode())
    first, second = asyncio.run(backend.run({"identity_refresh": 0.001}, reads=2))
    assert [(g.node, g.uuid, g.model, g.pool, g.stale) for g in first.gpus] == [
        ("a", "GPU-a", "H100", "p", False), ("b", "GPU-b", "H100", "p", False)]
    assert backend.count("gpufleet_gpu_info") == 1  # read 2 only: a and b against up's a
    assert [(g.node, g.stale) for g in second.gpus] == [("a", False), ("b", True)]
    assert len(backend.exports) == 2
    form = backend.exports[0]
    assert form["match[]"] == "gpufleet_gpu_info{}"
    # the scrape target's labels too: a node's series are believed only from its identity's
    assert form["format"] == "__timestamp__:unix_ms,__value__,node,gpu,uuid,model,pool,instance,job"
    # half of max_sample_age (120 s), the first read too: every GPU has a row in it here
    assert float(form["end"]) - float(form["start"]) == pytest.approx(60.0)


def test_an_export_answer_that_is_not_the_csv_asked_for_is_not_asked_again():
    backend = FakeBackend(_fleet(lambda r: ["a"], lambda r: ["a"]),
                          export=lambda form: b"<html>a proxy's login page</html>\n")
    snapshots = asyncio.run(backend.run({"identity_refresh": 0.001}, reads=3))
    assert all([g.node for g in s.gpus] == ["a"] for s in snapshots)
    assert len(backend.exports) == 1 and backend.count("gpufleet_gpu_info") == 3


def test_an_export_answer_quoted_with_go_escapes_is_read_by_query_this_time():
    backend = FakeBackend(_fleet(lambda r: ["a"], lambda r: ["a"]),
                          export=lambda form: b'1000,1,a,0,"GPU-\\"a",H100,p,a:9874,nodes\n')
    snapshots = asyncio.run(backend.run({"identity_refresh": 0.001}, reads=2))
    assert all([g.uuid for g in s.gpus] == ["GPU-a"] for s in snapshots)
    assert len(backend.exports) == 2 and backend.count("gpufleet_gpu_info") == 2


def test_identity_from_csv_keeps_each_gpus_newest_row():
    body = (b'2000,1,a,0,GPU-a2,H100,p,a:1,n\n1000,1,a,0,GPU-a1,H100,p,a:1,n\n'
            b'1000,1,"n,1",1,GPU-n,"H100 ""SXM""",,n:1,n\n'
            b'1000,1,c,2,GPU-c,H100,p,c:1,n\n3000,NaN,c,2,GPU-c,H100,p,c:1,n\n'  # c: its series ended
            b'1000,1,d,0,GPU-d,H100,p,d:1,n\n1500,1,d,0,GPU-d,H100,p,e:1,n\n')  # d: two targets
    assert sorted(identity_from_csv(body)) == [
        ("a", "0", "GPU-a2", "H100", "p", "a:1", "n"), ("d", "0", "GPU-d", "H100", "p", "d:1", "n"),
        ("d", "0", "GPU-d", "H100", "p", "e:1", "n"),
        ("n,1", "1", "GPU-n", 'H100 "SXM"', "", "n:1", "n")]
    for bad in (b"1000,1,a,0\n", b"1000,1,a,0,GPU-a,H100,p\n", b"x,1,a,0,GPU-a,H100,p,a:1,n\n",
                b"1000,one,a,0,GPU-a,H100,p,a:1,n\n"):
        with pytest.raises(ValueError):
            identity_from_csv(bad)


def test_identity_is_held_as_rows_not_label_dicts():
    import tracemalloc

    n = 10_000
    labels = {"__name__": "gpufleet_gpu_info", "job": "gpufleet-nodes", "architecture": "hopper",
              "instance": "10.0.0.1:9874", "model": "H100", "pool": "p"}
    body = json.dumps([{"metric": {**labels, "node": f"gpu-{i // 8:05d}", "gpu": str(i % 8),
                                   "uuid": f"GPU-{i:08d}-1111-2222-3333-444455556666"},
                        "value": [1760000000.123, "1"]} for i in range(n)])
    # the node names interned beforehand (as the source's earlier reads would have): a resize
    # of the interpreter's interned table inside the window, timed by whatever the process
    # interned before, would be counted to the rows (it was 1.9 KB a node in a longer run)
    names = [sys.intern(f"gpu-{i:05d}") for i in range(n // 8)]
    gc.collect()
    tracemalloc.start()
    try:
        decoded = json.loads(body)
        whole = tracemalloc.get_traced_memory()[0]
        held = identity_rows(decoded)
        del decoded
        gc.collect()
        size = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # decoded, about 1.0 KB a GPU here (labels as dicts); held as rows, about 200 bytes
    assert whole / n > 900 and size / n < 300, f"{whole / n:.0f} -> {size / n:.0f} bytes a GPU"
    assert len(names) == n // 8
    assert held[9] == ("gpu-00001", "1", "GPU-00000009-1111-2222-3333-444455556666", "H100", "p",
                       "10.0.0.1:9874", "gpufleet-nodes")
    assert identity_rows([{"metric": {"node": 3}}]) == [{"metric": {"node": 3}}]  # kept as is


@pytest.mark.slow
def test_identity_and_values_through_a_real_victoriametrics_export_equal_the_query(tmp_path):
    """Debian's victoria-metrics: the same samples read with identity and the value families
    through its export API and through the query give the same snapshot (a label with a comma
    among them; three samples a series, of which the newest counts)."""
    port = free_port()
    proc = start_server("victoria-metrics", tmp_path, port, [
        require_binary("victoria-metrics"), f"-storageDataPath={tmp_path / 'vm'}",
        f"-httpListenAddr=127.0.0.1:{port}", "-search.latencyOffset=1s",
        "-search.disableCache"], ready_path="/health")
    url = f"http://127.0.0.1:{port}"
    try:
        now = int(time.time())
        lines = []
        for ago in (90, 60, 30):
            ts = (now - ago) * 1000
            for node in ("gpu-001", "gpu-002"):
                for gpu in ("0", "1"):
                    ident = (f'node="{node}",gpu="{gpu}",uuid="GPU-{node}-{gpu}",model="H100",'
                             f'pool="p,q",job="nodes",instance="{node}:9874"')
                    lines += [f"gpufleet_gpu_info{{{ident}}} 1 {ts}",
                              f"gpufleet_gpu_up{{{ident}}} 1 {ts}",
                              f"gpufleet_gpu_memory_total_bytes{{{ident}}} 8{gpu}e9 {ts}",
                              # the newest sample counts: the older ones say otherwise
                              f"gpufleet_gpu_utilization_ratio{{{ident}}} "
                              f"{f'0.{gpu}5' if ago == 30 else '0.99'} {ts}"]
            lines.append(f'gpufleet_node_info{{node="gpu-001",pool="p,q",model="H100",'
                         f'gpus="2",job="nodes"}} 1 {ts}')
        request = urllib.request.Request(f"{url}/api/v1/import/prometheus",
                                         data="\n".join(lines).encode(), method="POST")
        urllib.request.urlopen(request, timeout=10).read()
        urllib.request.urlopen(f"{url}/internal/force_flush", timeout=10).read()

        async def read(export: bool):
            source = build(PrometheusConfig(url=url, selector='job="nodes"'), time.time)
            source._export = export
            posted: list[str] = []
            shipped = source._post

            async def post(name, endpoint, form, headers):
                posted.append(endpoint.rsplit("/api/v1/", 1)[1] + ":" + name)
                return await shipped(name, endpoint, form, headers)

            source._post = post  # type: ignore[method-assign]
            try:
                for _ in range(30):  # until VictoriaMetrics answers for every GPU
                    reading = await source.read()
                    if len(reading.gpus) == 4:
                        return reading, posted
                    await asyncio.sleep(0.5)
                raise AssertionError(f"read {len(reading.gpus)} GPUs")
            finally:
                await source.close()

        exported, exported_posts = asyncio.run(read(True))
        queried, queried_posts = asyncio.run(read(False))
        assert exported_posts.count("export/csv:identity") >= 1
        assert "query:identity" not in exported_posts
        assert "export/csv:identity" not in queried_posts
        utilisation = "gpufleet_gpu_utilization_ratio"
        assert f"export/csv:{utilisation}" in exported_posts
        assert f"query:{utilisation}" not in exported_posts
        assert f"query:{utilisation}" in queried_posts
        assert exported.gpus == queried.gpus
        assert [(g.node, g.index, g.uuid, g.pool, g.utilization_ratio, g.memory_total_bytes)
                for g in exported.gpus] == [
            ("gpu-001", 0, "GPU-gpu-001-0", "p,q", 0.05, 80e9),
            ("gpu-001", 1, "GPU-gpu-001-1", "p,q", 0.15, 81e9),
            ("gpu-002", 0, "GPU-gpu-002-0", "p,q", 0.05, 80e9),
            ("gpu-002", 1, "GPU-gpu-002-1", "p,q", 0.15, 81e9)]
    finally:
        stop(proc)


def test_value_answers_are_read_by_msgspec_and_an_odd_one_by_json_as_before():
    from exporter.sources.prometheus.source import compact, compact_answer

    plain = [{"metric": {"node": f"n{i}", "gpu": str(i % 8), "instance": f"n{i}:9874",
                         "job": "nodes"}, "value": [100.5, f"{i}.5"]}
             for i in range(20)] + [{"metric": {"node": "n20"}, "value": [100.5, "NaN"]}]
    body = json.dumps({"status": "success", "warnings": ["store down"],
                       "data": {"resultType": "vector", "result": plain}}).encode()
    assert compact_answer(body) == (compact(plain), ["store down"])
    assert compact_answer(body)[0][3] == ("n3", "3", "3.5", "n3:9874", "nodes")
    # no gpu label: "0", as before; no target labels (a recorded series): none named
    assert compact_answer(body)[0][20] == ("n20", "0", "NaN", "", "")
    odd = [*plain, {"metric": {"node": 7, "gpu": "0"}, "value": [100.5, "1"]},
           {"metric": {"node": "n21", "gpu": "0"}}]
    for series in (odd, plain[:1]):
        scalar = {"status": "success", "data": {"resultType": "scalar", "result": series}}
        assert compact_answer(json.dumps(scalar).encode()) is None
    assert compact_answer(json.dumps({"status": "success", "data": {
        "resultType": "vector", "result": odd}}).encode()) is None
    # through a read: the odd answer is read by json.loads, its two bad series dropped and
    # counted, the rest of the family stands
    up = [_series("gpufleet_gpu_up", 1, **g) for g in _gpus("a", "b")]
    bad = [{"metric": {"node": 7, "gpu": "0"}, "value": [100.5, "1"]},
           {"metric": {"node": "b", "gpu": "0", "instance": GPU["instance"], "job": GPU["job"]}},
           _series("gpufleet_gpu_power_watts", 250, **_gpus("a")[0])]

    def answer(expr: str, read: int) -> list[dict]:
        if expr.startswith("gpufleet_gpu_info"):
            return [_series("gpufleet_gpu_info", 1, **g) for g in _gpus("a", "b")]
        if expr.startswith(UP_QUERY):
            return up
        return bad if "gpufleet_gpu_power_watts" in expr else []

    (snapshot,) = asyncio.run(FakeBackend(answer).run({}, reads=1))
    assert [(g.node, g.power_watts) for g in snapshot.gpus] == [("a", 250.0), ("b", None)]
    assert snapshot.sources[0].parse_errors == 1  # the series without a value (7 names no GPU)


def test_memory_total_is_read_with_identity_and_held_between():
    """A GPU's total memory does not change while its identity does not: read at the first
    read, whenever identity is read again (c joins at read 3), and held between."""
    values = {"gpufleet_gpu_memory_total_bytes": 80e9, "gpufleet_gpu_memory_used_bytes": 1e9}
    nodes = {1: ["a", "b"], 2: ["a", "b"], 3: ["a", "b", "c"], 4: ["a", "b", "c"]}
    backend = FakeBackend(_fleet(lambda r: nodes[r], lambda r: nodes[r], values.get))
    # each GPU's up read (no summaries): this fake backend counts its reads by them
    snapshots = asyncio.run(backend.run({"node_summaries": False}, reads=4))
    assert [[(g.node, g.memory_total_bytes, g.memory_used_bytes) for g in s.gpus]
            for s in snapshots] == [[(n, 80_000_000_000, 1_000_000_000) for n in nodes[r]]
                                    for r in (1, 2, 3, 4)]
    total = "max by (node, gpu, instance, job) (gpufleet_gpu_memory_total_bytes{"
    assert backend.count(total) == 2 and backend.count("gpufleet_gpu_info") == 2
    # the second time for c alone: a and b's identity did not change, their total is held
    assert [q for q in backend.queries if q.startswith(total)] == [total + "})",
                                                                   total + 'node=~"c"})']
    assert backend.count("max by (node, gpu, instance, job) (gpufleet_gpu_memory_used_bytes{") == 4
    # 12 queries with identity and memory total, 10 without
    assert len(backend.queries) == 12 + 10 + 12 + 10
    # no memory total answered at an identity read: the fields are absent, not made up
    backend = FakeBackend(_fleet(lambda r: ["a"], lambda r: ["a"],
                                 lambda f: None if "total" in f else values.get(f)))
    (snapshot,) = asyncio.run(backend.run({"node_summaries": False}, reads=1))
    assert [(g.memory_total_bytes, g.memory_used_bytes) for g in snapshot.gpus] == [
        (None, 1_000_000_000)]


def test_identity_read_again_reads_memory_total_only_where_identity_changed():
    """Identity read again every read (identity_refresh 1 ms): memory total is read at the
    first read, then only for a node whose GPU's identity changed (b's GPU replaced at read 3:
    another UUID), never for a node whose identity stands."""
    values = {"gpufleet_gpu_memory_total_bytes": 80e9, "gpufleet_gpu_memory_used_bytes": 1e9}
    answer = _fleet(lambda r: ["a", "b"], lambda r: ["a", "b"], values.get)

    identity_reads = []

    def replaced(expr: str, read: int) -> list[dict]:
        series = answer(expr, read)
        if expr.startswith("gpufleet_gpu_info"):
            identity_reads.append(read)
        if len(identity_reads) >= 3 and expr.startswith("gpufleet_gpu_info"):
            for sample in series:
                if sample["metric"]["node"] == "b":
                    sample["metric"]["uuid"] = "GPU-b-new"
        return series

    backend = FakeBackend(replaced)
    snapshots = asyncio.run(backend.run({"node_summaries": False, "identity_refresh": 0.001},
                                        reads=4))
    assert [[(g.node, g.uuid, g.memory_total_bytes) for g in s.gpus] for s in snapshots] == [
        [("a", "GPU-a", 80_000_000_000), ("b", "GPU-b", 80_000_000_000)]] * 2 + [
        [("a", "GPU-a", 80_000_000_000), ("b", "GPU-b-new", 80_000_000_000)]] * 2
    total = "max by (node, gpu, instance, job) (gpufleet_gpu_memory_total_bytes{"
    assert backend.count("gpufleet_gpu_info") == 4
    assert [q for q in backend.queries if q.startswith(total)] == [total + "})",
                                                                   total + 'node=~"b"})']


def _export_rows(now: float, ages: dict[str, float]):
    """An export API over each node's GPU 0, its newest sample ``ages[node]`` seconds old:
    the rows inside the window asked for, as VictoriaMetrics answers."""
    def export(form: dict) -> bytes:
        start = float(form["start"])
        return "".join(f"{int((now - age) * 1000)},1,{node},0,GPU-{node},H100,p,10.0.0.1:9874,"
                       "nodes\n" for node, age in ages.items() if now - age >= start).encode()
    return export


def test_identity_read_again_over_half_the_window_keeps_the_rows_of_gpus_it_misses():
    """The export reads half of max_sample_age (a row a GPU, not two): b's newest sample (90 s
    old) is outside it. At the first read nothing is held for b, so the whole window is read at
    once; later b keeps its row while up answers for it, and the next export reads the whole
    window (more than 1% missed), never the query."""
    backend = FakeBackend(_fleet(lambda r: ["a", "b"], lambda r: ["a", "b"]),
                          export=_export_rows(time.time(), {"a": 30, "b": 90}))
    snapshots = asyncio.run(backend.run({"identity_refresh": 0.001, "node_summaries": False},
                                        reads=4))
    assert all([(g.node, g.uuid, g.stale) for g in s.gpus] == [
        ("a", "GPU-a", False), ("b", "GPU-b", False)] for s in snapshots)
    windows = [round(float(f["end"]) - float(f["start"])) for f in backend.exports]
    assert windows == [60, 120, 60, 120, 60]
    assert backend.count("gpufleet_gpu_info") == 0


def test_a_gpu_gone_is_not_kept_by_the_narrow_export():
    """b is gone at read 2 (up no longer answers for it; its newest sample 90 s old, in the
    whole window but not in its half): its row is not kept, identity equals up, and it is not
    read by query (over the whole window it would be: the window still lists b)."""
    backend = FakeBackend(_fleet(lambda r: ["a", "b"], lambda r: ["a", "b"] if r < 2 else ["a"]),
                          export=_export_rows(time.time(), {"a": 30, "b": 90}))
    snapshots = asyncio.run(backend.run({"identity_refresh": 0.001, "node_summaries": False},
                                        reads=2))
    # b's last good reading is served stale (lost_after), as for any node that stops answering
    assert [[(g.node, g.stale) for g in s.gpus] for s in snapshots] == [
        [("a", False), ("b", False)], [("a", False), ("b", True)]]
    assert backend.count("gpufleet_gpu_info") == 0
    assert backend.source._identity_keys == {("a", "0")}


def test_a_gpu_missed_twice_by_the_narrow_export_brings_the_whole_window():
    """One GPU in 151 (under 1%) is scraped too rarely for half the window: kept once, missed
    twice running, the next export reads the whole window: read again within three refreshes."""
    nodes = [f"n{i}" for i in range(150)] + ["b"]
    ages = {node: 90 if node == "b" else 30 for node in nodes}
    backend = FakeBackend(_fleet(lambda r: nodes, lambda r: nodes),
                          export=_export_rows(time.time(), ages))
    snapshots = asyncio.run(backend.run({"identity_refresh": 0.001, "node_summaries": False},
                                        reads=5))
    assert all(len(s.gpus) == 151 and not any(g.stale for g in s.gpus) for s in snapshots)
    windows = [round(float(f["end"]) - float(f["start"])) for f in backend.exports]
    # the first read: b missed by the half window, nothing held: the whole window at once
    assert windows == [60, 120, 60, 60, 120, 60]
    assert backend.count("gpufleet_gpu_info") == 0


def test_the_first_read_exports_half_the_window_when_every_gpu_is_in_it():
    """At the first read nothing is held: the export over half of max_sample_age suffices when
    up answers for no GPU it misses (one row a GPU, not two), and neither the whole window nor
    the query is read. With summaries (the default) as without."""
    nodes = ["a", "b", "c"]
    for summaries in (False, True):
        backend = FakeBackend(_fleet(lambda r: nodes, lambda r: nodes),
                              export=_export_rows(time.time(), {n: 30 for n in nodes}))
        (snapshot,) = asyncio.run(backend.run({"node_summaries": summaries}, reads=1))
        assert [(g.node, g.uuid, g.stale) for g in snapshot.gpus] == [
            (n, f"GPU-{n}", False) for n in nodes]
        assert [round(float(f["end"]) - float(f["start"])) for f in backend.exports] == [60]
        assert backend.count("gpufleet_gpu_info") == 0
        assert backend.source.identity_reads == 1


def test_the_first_read_whose_half_window_misses_gpus_the_summaries_count_reads_the_whole():
    """With the nodes' summaries (the default): b's newest identity sample is 90 s old, outside
    the half window, and b's summary counts one GPU up: the whole window is exported at once,
    before the cover, so no GPU's up or stale is read one by one and b is in the snapshot.
    A node whose summary counts only what the half window lists brings no second export."""
    def summaries(nodes: list[str]):
        def answer(expr: str, read: int) -> list[dict]:
            if expr.startswith("sum by (node, state, instance, job) (gpufleet_node_gpus{"):
                return [_series("gpufleet_node_gpus", 1, node=n, state="up",
                                instance=GPU["instance"], job=GPU["job"]) for n in nodes]
            return []
        return answer

    for ages, windows in (({"a": 30, "b": 90}, [60, 120]), ({"a": 30, "b": 30}, [60])):
        backend = FakeBackend(summaries(["a", "b"]), export=_export_rows(time.time(), ages))
        (snapshot,) = asyncio.run(backend.run({}, reads=1))
        assert [round(float(f["end"]) - float(f["start"])) for f in backend.exports] == windows
        assert [(g.node, g.uuid, g.stale) for g in snapshot.gpus] == [
            ("a", "GPU-a", False), ("b", "GPU-b", False)]
        assert backend.count(UP_QUERY) == 0 and backend.count("gpufleet_gpu_info") == 0
        assert backend.source.summarised_reads == 1


def test_the_first_read_with_up_unknown_exports_the_whole_window():
    """Up failed at the first read, so nothing says whether the half window missed a GPU
    scraped less often than it (b, 90 s old): the whole window is read too, and b is in the
    snapshot."""
    nodes = ["a", "b"]
    answer = _fleet(lambda r: nodes, lambda r: nodes)

    def up_fails(expr: str, read: int) -> list[dict]:
        if expr.startswith(UP_QUERY):
            raise ValueError("up fails")
        return answer(expr, read)

    backend = FakeBackend(answer, export=_export_rows(time.time(), {"a": 30, "b": 90}))
    backend.query = up_fails
    (snapshot,) = asyncio.run(backend.run({"node_summaries": False}, reads=1))
    assert [round(float(f["end"]) - float(f["start"])) for f in backend.exports] == [60, 120]
    assert [g.node for g in snapshot.gpus] == ["a", "b"]


def test_values_from_csv_keeps_each_series_newest_row_and_the_window_follows_the_oldest():
    from exporter.sources.prometheus.export import ValueRows, next_window, values_from_csv

    body = (b"2000,0.5,a,0,a:1,n\n1000,0.25,a,0,a:1,n\n"
            b"1000,0.75,b,1,b:1,n\n3000,NaN,b,1,b:1,n\n"  # b: its series ended
            b"1000,1,c,,c:1,n\n1500,2,c,,d:1,n\n")  # c: two targets, no gpu label (GPU 0)
    got = values_from_csv(body)
    assert sorted(got.rows) == [("a", "0", "0.5", "a:1", "n"), ("c", "0", "1", "c:1", "n"),
                                ("c", "0", "2", "d:1", "n")]
    assert got.oldest_ms == 1000
    assert got.spacing_ms == 2000  # b's: its marker 2 s after its last sample; a's 1 s
    assert values_from_csv(b'1000,0.5,"n,1",0,n:1,n\n').rows == [("n,1", "0", "0.5", "n:1", "n")]
    assert values_from_csv(b"") == ValueRows([], None, None)
    assert values_from_csv(b"1000,1,a,0,a:1,n\n").spacing_ms is None  # one row: no interval
    # a value that is no number is checked where the query's are (dropped and counted)
    assert values_from_csv(b"1000,half,a,0,a:1,n\n").rows == [("a", "0", "half", "a:1", "n")]
    for bad in (b"1000,0.5,a,0,a:1\n", b"x,0.5,a,0,a:1,n\n", b"1000,0.5,a,0,a:1,n,m\n",
                b"<html>a proxy's login page</html>\n"):
        with pytest.raises(ValueError):
            values_from_csv(bad)
    # the next window: the interval (or the oldest age) and a quarter more, at most the whole;
    # the one that served where no family showed an interval
    assert next_window([], 120.0, 120.0) == 120.0
    assert next_window([(5.0, 59.0), (12.0, 30.0)], 120.0, 120.0) == pytest.approx(74.75)
    assert next_window([(70.0, 59.0)], 74.75, 120.0) == pytest.approx(88.5)
    assert next_window([(5.0, 110.0)], 120.0, 120.0) == 120.0
    assert next_window([(5.0, 10.0), (30.0, None)], 120.0, 120.0) == pytest.approx(38.5)
    assert next_window([(50.0, None), (40.0, None)], 74.75, 120.0) == 74.75


VALUE_QUERY = "max by (node, gpu, instance, job) (gpufleet_gpu_utilization_ratio{"


def _windows(forms: list[dict], family: str = "gpufleet_gpu_utilization_ratio") -> list[float]:
    return [round(float(f["end"]) - float(f["start"]), 2) for f in forms
            if f["match[]"].startswith(family + "{")]


def test_value_families_through_the_export_api_over_the_window_the_last_read_needed():
    """VictoriaMetrics: utilisation, memory used and power are exported, not queried, and give
    the query's values; the first export reads half of max_sample_age, each later one the
    scrape interval the last one showed, and a quarter more. A GPU gone (b: up no longer
    answers for it) is no miss."""
    ups = {3: ["a"]}
    values = {"gpufleet_gpu_utilization_ratio": 0.5, "gpufleet_gpu_memory_used_bytes": 7e9,
              "gpufleet_gpu_power_watts": 300.0}
    backend = FakeBackend(_fleet(lambda r: ["a", "b"], lambda r: ups.get(r, ["a", "b"]),
                                 value=values.get),
                          export=_export_rows(time.time(), {"a": 30, "b": 30}))
    snapshots = asyncio.run(backend.run({"node_summaries": False}, reads=3))
    assert [[(g.node, g.utilization_ratio, g.memory_used_bytes, g.power_watts, g.stale)
             for g in s.gpus] for s in snapshots] == [
        [("a", 0.5, 7e9, 300.0, False), ("b", 0.5, 7e9, 300.0, False)],
        [("a", 0.5, 7e9, 300.0, False), ("b", 0.5, 7e9, 300.0, False)],
        # b gone: stale, no value, as the query answers
        [("a", 0.5, 7e9, 300.0, False), ("b", None, None, None, True)]]
    for family in ("gpufleet_gpu_utilization_ratio", "gpufleet_gpu_memory_used_bytes",
                   "gpufleet_gpu_power_watts"):
        assert backend.count(f"max by (node, gpu, instance, job) ({family}{{") == 0
        # scraped every 10 s: 1.25 x 10 s + 1 s
        assert _windows(backend.value_exports, family) == [60.0, 13.5, 13.5]
    form = backend.value_exports[0]
    assert form["format"] == "__timestamp__:unix_ms,__value__,node,gpu,instance,job"
    assert backend.count(UP_QUERY) == 3  # up and stale stay queries


def test_a_fresh_gpu_the_exports_window_misses_is_read_by_query_and_the_next_window_is_whole():
    """b is up and fresh, but its utilisation's newest row is older than the window the last
    read needed (a scrape late): b's node is read by query (named, not every GPU), b keeps its
    value, and the next export reads the whole max_sample_age."""
    backend = FakeBackend(_fleet(lambda r: ["a", "b"], lambda r: ["a", "b"],
                                 value=lambda family: 0.5),
                          export=_export_rows(time.time(), {"a": 30, "b": 30}))
    whole = backend.values_csv

    def late_b(form: dict) -> bytes:  # from the second read on, b's rows fall before the window
        rows = whole(form)
        return rows if backend.reads < 2 else b"".join(
            line + b"\n" for line in rows.splitlines() if b",b," not in line)

    backend.values_csv = late_b  # type: ignore[method-assign]
    snapshots = asyncio.run(backend.run({"node_summaries": False}, reads=3))
    assert all([(g.node, g.utilization_ratio) for g in s.gpus] == [("a", 0.5), ("b", 0.5)]
               for s in snapshots)
    queried = [q for q in backend.queries if q.startswith(VALUE_QUERY)]
    assert queried == [VALUE_QUERY + 'node=~"b"})'] * 2
    assert _windows(backend.value_exports) == [60.0, 13.5, 120.0]


def test_a_gpu_scraped_less_often_than_the_first_exports_window_is_read_by_query():
    """At the first read no family has answered yet: every GPU up and fresh is expected. b is
    scraped every 90 s (its newest row 80 s old, outside the first export's 60 s): its node is
    read by query, and the next export reads the whole max_sample_age, then what b needs."""
    backend = FakeBackend(_fleet(lambda r: ["a", "b"], lambda r: ["a", "b"],
                                 value=lambda family: 0.5),
                          export=_export_rows(time.time(), {"a": 30, "b": 30}))
    every = backend.values_csv

    def b_every_90_s(form: dict) -> bytes:
        end, start = float(form["end"]), float(form["start"])
        b = f"{int((end - 80) * 1000)},0.5,b,0,10.0.0.1:9874,nodes\n".encode()
        return b"".join(line + b"\n" for line in every(form).splitlines()
                        if b",b," not in line) + (b if end - 80 >= start else b"")

    backend.values_csv = b_every_90_s  # type: ignore[method-assign]
    snapshots = asyncio.run(backend.run({"node_summaries": False}, reads=3))
    assert all([(g.node, g.utilization_ratio) for g in s.gpus] == [("a", 0.5), ("b", 0.5)]
               for s in snapshots)
    assert [q for q in backend.queries if q.startswith(VALUE_QUERY)] == [
        VALUE_QUERY + 'node=~"b"})']
    # a's rows show the interval (10 s), b's the age its window needs: 1.25 x 80 s + 1 s
    assert _windows(backend.value_exports) == [60.0, 120.0, 101.0]
