"""Issue 29: the operator's threshold table at runtime: ``serve --thresholds FILE``, read again
on SIGHUP and when the file changes, with the advisor's state kept and a broken table refused.

At the app level: ``serve``'s own wiring (effective_config, assemble, the advisor's routes),
the shipped configs, a table in tmp_path, and the advisor fed reports of chosen indices on a
clock of the test's. No server is started, no Prometheus is needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiohttp import web

from exporter.advisor.advise import advise, decision_settings
from exporter.advisor.api import add_routes
from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction
from exporter.cli import serve
from exporter.config import Config, ConfigError, build
from exporter.cycle import Frame
from exporter.snapshot import FleetSnapshot
from exporter.web.server import Reload
from tests.helpers import REPO

TABLE = REPO / "rules" / "thresholds.yaml"
ROW = "  - alert: GpuClusterFragmentationHigh\n"
LEVEL = "warning: {threshold: 50, for: 15m}"
START = 1_760_000_000.0
TOKEN = "t0ken-for-tests"
SHIPPED = {
    "node": REPO / "deploy" / "systemd" / "node.yaml",
    "cluster": REPO / "deploy" / "systemd" / "cluster.yaml",
    "kubernetes node": REPO / "deploy" / "kubernetes" / "overlays" / "node" / "node.yaml",
    "kubernetes cluster": REPO / "deploy" / "kubernetes" / "overlays" / "cluster" / "cluster.yaml",
    "gpu-operator": REPO / "deploy" / "kubernetes" / "overlays" / "gpu-operator" / "cluster.yaml",
}


def table_at(path: Path, level: float) -> Path:
    """The shipped table with the fragmentation row (GpuClusterFragmentationHigh) at ``level``,
    written in place: a rename, as an editor or a config manager writes it."""
    text = TABLE.read_text()
    at = text.index(LEVEL, text.index(ROW))
    new = path.with_name(path.name + ".new")
    new.write_text(f"{text[:at]}warning: {{threshold: {level:g}, for: 15m}}{text[at + len(LEVEL):]}")
    os.replace(new, path)
    return path


def serve_config(shipped: Path, table: Path, tmp_path: Path, *extra: str) -> Config:
    """The shipped config as `gpufleet serve --config FILE --thresholds TABLE --source sim`
    reads it, its credentials and outbox moved into tmp_path."""
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    config = serve.effective_config(parser.parse_args(
        ["--config", str(shipped), "--thresholds", str(table), "--source", "sim", *extra]))
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "secret").write_text("s3cret")
    receivers = tuple(dataclasses.replace(r, secret_file=str(tmp_path / "secret"))
                      for r in config.advisor.receivers)
    advisor = dataclasses.replace(config.advisor, token_file=str(tmp_path / "token"),
                                  outbox=str(tmp_path / "outbox.sqlite"), receivers=receivers)
    return dataclasses.replace(config, advisor=advisor)


def report(index: float) -> SimpleNamespace:  # what the advisor reads of an analysis
    return SimpleNamespace(cluster=SimpleNamespace(index=index, allocated_ratio=0.97), pools=[])


def one_move(snapshot, report, scope, now) -> CompactionPlan:
    moves = (Migration("job-1", "ns", "pod-1", Endpoint("gpu-033", (2,)), Endpoint("gpu-034", (5,)),
                       "checkpoint_then_migrate", None, 120.0),)
    return CompactionPlan(scope, snapshot.taken_at, now + 900, "compact", ("stub",),
                          Prediction(60, 10), Prediction(40, 8), {"gpu-h100": 1}, moves)


def reload_families(state) -> dict[str, float]:
    table = state.cycle.stage("table")
    return {f.name: f.samples[0][1] for f in table.families(Frame(FleetSnapshot(START)))
            if f.name.startswith("gpufleet_config_last_reload")}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_config_starts_on_a_table_at_40(name, tmp_path):
    """The issue: after the table went to 40, every config with an ``advisor:`` block exited 2
    (advisor.clear_below 40 >= advisor.trigger 40), the node configs' ``{enabled: false}`` too."""
    table = table_at(tmp_path / "thresholds.yaml", 40)
    config = serve_config(SHIPPED[name], table, tmp_path)
    assert config.thresholds_file == str(table)
    _, state, service = serve.assemble(config, ["sim"])
    try:
        assert reload_families(state) == {
            "gpufleet_config_last_reload_successful": 1.0,
            "gpufleet_config_last_reload_success_timestamp_seconds": pytest.approx(
                reload_families(state)["gpufleet_config_last_reload_success_timestamp_seconds"])}
        if config.advisor.enabled and config.analysis.enabled:
            assert service is not None
            settings = service.advisor.settings
            assert (settings.trigger, settings.clear_below) == (40, 30)
            assert service.analyzer.settings.compaction_threshold == 40
        else:
            assert service is None
    finally:
        if service is not None:
            service.deliverer.store.close()


async def test_an_edited_table_moves_the_trigger_live_keeps_the_dwell_and_a_broken_one_is_refused(
        tmp_path, aiohttp_client, caplog):
    """The must-show: at 40, /v1/advice triggers at 40; edited to 45 while serving, it triggers
    at 45 with no restart, and the dwell served at 40 still counts; a broken table keeps 45
    and says so in gpufleet_config_last_reload_successful."""
    table = table_at(tmp_path / "thresholds.yaml", 40)
    config = serve_config(SHIPPED["cluster"], table, tmp_path)
    now = [START]
    _, state, service = serve.assemble(config, ["sim"], clock=lambda: now[0])
    assert service is not None
    service.advisor.clock = lambda: now[0]
    app = web.Application()
    add_routes(app, service.api())
    client = await aiohttp_client(app)
    stage = state.cycle.stages[0]  # the first stage: before the analysis and the advisor's
    live = stage.live  # the LiveThresholds serve wired in: its reload families are served
    assert stage.name == "table" and live.path == str(table)

    async def advice(at: float, index: float) -> dict:
        now[0] = at
        stage.step(Frame(FleetSnapshot(at)))  # what each cycle does first
        advise(service.advisor, FleetSnapshot(at), report(index), one_move)
        resp = await client.get("/v1/advice", headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status == 200
        return await resp.json()

    # at 40: an index of 43 is above the trigger, and its dwell starts
    first = await advice(START, 43)
    assert first["scopes"]["cluster"]["above_since"] == START
    assert first["reasons"] == ["cluster index 43 > 40 for 0 s, dwell is 10 min"]
    # 5 min into the dwell, the operator edits the table to 45: the next collection reads it
    table_at(table, 45)
    edited = await advice(START + 300, 50)
    assert service.advisor.settings.trigger == 45 and service.advisor.settings.clear_below == 35
    assert service.analyzer.settings.compaction_threshold == 45
    assert edited["scopes"]["cluster"]["above_since"] == START  # the dwell served so far stays
    assert edited["reasons"] == ["cluster index 50 > 45 for 5 min, dwell is 10 min"]
    # 10 min after the dwell began at 40 (not 10 min after the reload), compaction is due
    due = await advice(START + 600, 50)
    assert (due["decision"], due["plan"]["migrations"][0]["job"]) == ("compact", "job-1")
    assert reload_families(state) == {"gpufleet_config_last_reload_successful": 1.0,
                                      "gpufleet_config_last_reload_success_timestamp_seconds": START + 300}
    # a broken table, read on SIGHUP: 45 stays, one error line names the file and the row
    text = table.read_text()
    table.write_text(text.replace("warning: {threshold: 45, for: 15m}",
                                  "warning: {threshold: 450, for: 15m}"))
    caplog.clear()
    now[0] = START + 700
    assert Reload(state).run_once()["thresholds"] == "failed"
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and str(table) in errors[0] and "alerts[" in errors[0], errors
    assert reload_families(state) == {"gpufleet_config_last_reload_successful": 0.0,
                                      "gpufleet_config_last_reload_success_timestamp_seconds": START + 300}
    # the index falls (the recommendation clears below 35), then sits at 43: below 45, so
    # nothing is above the trigger; under the 40 of the first table, 43 would be
    await advice(START + 800, 20)
    held = await advice(START + 900, 43)
    assert held["scopes"]["cluster"]["above_since"] is None
    assert held["reasons"][0] == "cluster index 43 <= 45"
    # the same broken version is not logged again at each collection
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
    # fixed: taken at the next collection, and the reload is successful again
    table_at(table, 45)
    await advice(START + 1000, 43)
    assert reload_families(state)["gpufleet_config_last_reload_successful"] == 1.0
    service.deliverer.store.close()


def test_a_clear_bound_set_at_the_tables_trigger_is_one_line_at_start_and_refused_at_reload(tmp_path):
    """Derived settings follow the trigger; an explicit bad one is still an error: at the start
    a one-line ConfigError (exit 2), at a reload the old table stays."""
    table = table_at(tmp_path / "thresholds.yaml", 40)
    (tmp_path / "c.yaml").write_text(f"advisor: {{clear_below: 42, outbox: {tmp_path / 'o.sqlite'}}}\n")
    with pytest.raises(ConfigError) as caught:
        serve.assemble(serve_config(tmp_path / "c.yaml", table, tmp_path), ["sim"])
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("advisor.clear_below: must be below advisor.trigger (42 >= 40, "
                              f"the fragmentation level of {table.name})")
    # started at 50, the same bound is fine; an edit to 40 is refused and 50 stays
    table_at(table, 50)
    _, state, service = serve.assemble(serve_config(tmp_path / "c.yaml", table, tmp_path), ["sim"])
    assert service is not None
    try:
        assert (service.advisor.settings.trigger, service.advisor.settings.clear_below) == (50, 42)
        table_at(table, 40)
        assert Reload(state).run_once()["thresholds"] == "failed"
        assert service.advisor.settings.trigger == 50
        assert service.analyzer.settings.compaction_threshold == 50  # taken whole or not at all
        assert reload_families(state)["gpufleet_config_last_reload_successful"] == 0.0
    finally:
        service.deliverer.store.close()


def test_require_pending_set_in_the_config_survives_a_reload_on_sighup(tmp_path):
    """advisor.require_pending is read from the config at start, as dwell and cooldown are; a
    reload of the table (SIGHUP, or the file changing) rebuilds the engine's settings from
    the config and the new table, and must not put the default rule back."""
    table = table_at(tmp_path / "thresholds.yaml", 50)
    (tmp_path / "c.yaml").write_text(
        f"advisor: {{require_pending: false, dwell: 7m, outbox: {tmp_path / 'o.sqlite'}}}\n")
    _, state, service = serve.assemble(serve_config(tmp_path / "c.yaml", table, tmp_path), ["sim"])
    assert service is not None
    try:
        assert service.advisor.settings.require_pending is False
        table_at(table, 40)
        assert Reload(state).run_once()["thresholds"] == "changed"
        settings = service.advisor.settings
        assert (settings.trigger, settings.require_pending, settings.dwell_seconds) == (40, False, 420)
    finally:
        service.deliverer.store.close()


def test_a_trigger_set_in_the_config_stays_and_its_clear_bound_follows_it():
    """`advisor: {trigger: 40}` alone no longer exits 2: the default clear bound follows the
    trigger in force; a table's level never replaces a trigger set by hand."""
    config = build(Config, {"advisor": {"trigger": 40}})
    from exporter.thresholds import load_thresholds

    fifty = load_thresholds(TABLE)
    settings = decision_settings(config.advisor, fifty)
    assert (settings.trigger, settings.clear_below) == (40, 30)
    assert (decision_settings(Config().advisor, fifty).trigger,
            decision_settings(Config().advisor, fifty).clear_below) == (50, 40)
    with pytest.raises(ConfigError, match=r"^advisor.clear_below: must be below advisor.trigger "
                                          r"\(40 >= 40\)$"):
        build(Config, {"advisor": {"trigger": 40, "clear_below": 40}})


@pytest.mark.slow
def test_a_real_serve_reloads_its_table_on_sighup_and_serves_the_runbooks(exporter_factory, tmp_path):
    """The process as operators run it: `serve --thresholds FILE`; SIGHUP with a broken FILE
    keeps the process and the last good table, and /metrics says the reload failed."""
    import signal
    import time

    from tests.helpers.servers import http_get, wait_until

    table = table_at(tmp_path / "thresholds.yaml", 40)
    served = exporter_factory("--thresholds", str(table), config="advisor: {enabled: false}\n")
    assert b'id="gpupowerhigh"' in http_get(f"{served.url}/runbooks")

    def reload_successful() -> bytes:
        body = http_get(f"{served.url}/metrics", timeout=30)
        return next(line for line in body.splitlines()
                    if line.startswith(b"gpufleet_config_last_reload_successful "))

    assert reload_successful() == b"gpufleet_config_last_reload_successful 1.0"
    table.write_text("alerts: [\n")
    served.proc.send_signal(signal.SIGHUP)
    wait_until("the failed reload", lambda: reload_successful().endswith(b" 0.0"), timeout=30,
               interval=0.5)
    time.sleep(0.5)
    assert served.proc.poll() is None
    assert "threshold table not reloaded, keeping the last good one" in served.log.read_text()


async def test_a_reload_moves_the_reclaim_rule_and_the_scaling_settings_and_keeps_their_state(tmp_path):
    """Beyond the trigger: the advisor's reclaim rule (GpuJobUtilizationLow) and the pools'
    scaling settings follow the table too; a pool's scaler keeps its recommendation."""
    table = table_at(tmp_path / "thresholds.yaml", 50)
    config = serve_config(SHIPPED["cluster"], table, tmp_path)
    _, state, service = serve.assemble(config, ["sim"])
    assert service is not None
    try:
        assert service.advisor.settings.idle == (0.1, 7200)
        load = state.cycle.stage("load").tracker
        assert load is not None and load.table.default.up == 0.8
        from exporter.sources.sim.options import SimSource
        from exporter.sources.sim.source import build as sim_source

        reading = await sim_source(SimSource(seed=1), lambda: START).read()
        load.observe(FleetSnapshot(START, reading.nodes, reading.gpus, reading.allocations,
                                   reading.pending))
        pool, kept = next(iter(load.pools.items()))
        recommended = kept.scaler.nodes
        text = table.read_text().replace("critical: {threshold: 10%, for: 2h}",
                                         "critical: {threshold: 5%, for: 3h}")
        table.write_text(text.replace("  up: 0.8\n", "  up: 0.9\n", 1))
        assert Reload(state).run_once()["thresholds"] == "changed"
        assert service.advisor.settings.idle == (0.05, 10800)
        assert load.table.default.up == 0.9
        assert load.pools[pool] is kept and kept.scaler.settings.up == 0.9
        assert kept.scaler.nodes == recommended
    finally:
        service.deliverer.store.close()
