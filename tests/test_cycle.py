"""One cycle, one frame: serve and simulate run the same cycle function; health is a stage of
its own, judged and delivered whether or not the advisor runs."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from dataclasses import dataclass, field

import pytest

from exporter.advisor.webhook import EVENT_HEADER
from exporter.cli.serve import assemble
from exporter.config import Config, ReceiverConfig, load
from exporter.cycle import RENDER_ORDER, Frame, run_cycle, with_exposition
from exporter.cycle.serving import ServingCycle
from exporter.exposition import LabelCache
from exporter.web.server import collect_and_render
from tests.helpers.health import T0, gpu, snap, xid_gpu
from tests.test_advisor_webhook import SECRET, Scheduler


@dataclass
class Recorder:
    """A stage that records which function stepped it, and the frames it saw."""

    name: str = "logs"  # any part of RENDER_ORDER: its families are none
    callers: list[object] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)

    def step(self, frame: Frame) -> Frame:
        self.callers.append(sys._getframe(1).f_code)
        self.frames.append(frame)
        return frame

    def families(self, frame: Frame) -> list:
        return []


def test_serve_and_simulate_run_the_same_cycle_function(tmp_path):
    from exporter.outcome_sim.advisor_loop import AdvisorStrategy
    from tests.test_simulate import job, sim_of, tiny_fleet

    # serve: one collection of the default config, with the recorder last in its cycle
    config = load(None)
    config = dataclasses.replace(config, advisor=dataclasses.replace(
        config.advisor, outbox=str(tmp_path / "outbox.sqlite")))
    collector, state, advisor = assemble(config, ["sim"])
    assert isinstance(state.cycle, ServingCycle)
    served = Recorder()
    state.cycle.stages = [*state.cycle.stages, served]

    rendered = []

    async def once() -> None:
        try:
            rendered.append(await collect_and_render(collector, state, LabelCache(), 1))
        finally:
            await collector.close()
            if advisor is not None:
                advisor.deliverer.store.close()

    asyncio.run(once())
    assert served.callers == [run_cycle.__code__]
    frame = served.frames[0]
    assert frame.report is not None and frame.health is not None and frame.advice is not None
    assert rendered[0].snapshot is frame.snapshot  # the frame's snapshot is what was rendered

    # simulate: the advisor strategy's stages, with the recorder after them
    simulated = Recorder()
    sim = sim_of(tiny_fleet(nodes=3, models=("H100", "A100")))
    for j in (job(1, 1, 50_000, share=0.5), job(2, 4, 50_000), job(3, 2, 50_000)):
        sim.cluster.start(j, sim.cluster.find(j), 0.0)
    strategy = AdvisorStrategy(evaluate_every=600.0)
    strategy._setup()
    strategy._stages = (*strategy._stages, simulated)
    for now in range(0, 3600, 60):
        strategy.tick(sim, float(now))
    assert simulated.callers and set(simulated.callers) == {run_cycle.__code__}
    # the advisor sees the frames at its cadence, nothing between them
    times = [f.snapshot.taken_at for f in simulated.frames]
    assert times == [0.0, 600.0, 1200.0, 1800.0, 2400.0, 3000.0] and strategy.evaluations == 6
    assert all(f.report is not None and f.advice is not None for f in simulated.frames)


def test_the_exposition_follows_the_render_order_not_the_stage_order():
    frame = with_exposition(Frame(snap(T0)), [("table", ["t"]), ("health", ["h"]), ("analysis", ["a"]),
                                               ("advisor", ["v"]), ("logs", ["l"]), ("load", ["o"]),
                                               ("preemption", ["p"]), ("nvlink", ["n"])])
    assert [name for name, _ in frame.families] == list(RENDER_ORDER)
    with pytest.raises(ValueError, match="not in RENDER_ORDER"):
        with_exposition(frame, [("bogus", [])])


async def test_health_is_judged_and_delivered_with_the_advisor_off(aiohttp_server, tmp_path, monkeypatch):
    scheduler = Scheduler()
    server = await aiohttp_server(scheduler.app())
    monkeypatch.setenv("GPUFLEET_WEBHOOK_SECRET", SECRET.decode())
    config: Config = load(None)
    receiver = ReceiverConfig(name="slurm", url=str(server.make_url("/gpufleet")))
    config = dataclasses.replace(config, advisor=dataclasses.replace(
        config.advisor, enabled=False, receivers=(receiver,), outbox=str(tmp_path / "outbox.sqlite"),
        retry_initial=0.01))
    collector, state, advisor = assemble(config, ["sim"])
    await collector.close()
    assert advisor is None
    cycle = state.cycle
    assert isinstance(cycle, ServingCycle) and cycle.deliverer is not None
    assert [s.name for s in cycle.stages] == ["table", "nvlink", "analysis", "load", "health", "preemption"]
    nodes = [f"a-{n}" for n in range(4)]
    first = await cycle.run(snap(T0, *(gpu(n, 0, "a") for n in nodes)))
    # the frame serve renders holds its families already: rendering reads nothing else
    assert [name for name, _ in first.families] == ["nvlink", "analysis", "load", "health",
                                                    "preemption", "logs", "table"]
    frame = await cycle.run(snap(T0 + 30, *(xid_gpu(n, 0, T0 + 30, pool="a") if n == "a-3"
                                            else gpu(n, 0, "a") for n in nodes)))
    assert frame.health is not None and [e.node for e in frame.health.events][:1] == ["a-3"]
    families = {f.name: f for f in cycle.families(frame)}
    verdicts = dict(families["gpufleet_node_health_verdict"].samples)
    assert verdicts == {(("node", "a-3"), ("pool", "a"), ("verdict", "failing")): 1.0}
    assert "gpufleet_advisor_decision_info" not in families  # no advisor, no advisor families
    deliverer = cycle.deliverer
    task = asyncio.create_task(deliverer.run())
    try:
        for _ in range(500):
            if scheduler.accepted:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        deliverer.store.close()
    assert scheduler.bad_signatures == 0
    drains = [b for b in scheduler.accepted if b["type"] == "drain"]
    assert [(b["node"], b["event"]) for b in drains] == [("a-3", "remediation")]
    assert {h[EVENT_HEADER] for h, _ in scheduler.requests} == {"remediation"}
