"""The informers back off as client-go's reflector does, on a 410 and on a failure.

client-go (``tools/cache/reflector.go``) waits before every list after the first, and
before reopening a watch that failed: ``wait.NewExponentialBackoffManager(800ms, 30s,
2min, 2.0, 1.0)``, a step from 0.8 s doubling to 30 s, each wait 1 to 2 times its step,
the step starting again after two minutes without a wait. Before, the informer waited
0.1 s doubling to 1 s: an apiserver answering 410 to every watch saw 88 lists in 20 s
over three resources.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from exporter.config import ConfigError
from exporter.config import load as load_config
from exporter.options import Duration
from exporter.sources.kubernetes.informer import Backoff, Endpoint, Informer, Limits
from exporter.sources.kubernetes.options import KubernetesSource as KubernetesConfig
from exporter.sources.kubernetes.source import build
from tests.helpers.fake_apiserver import PODS, FakeApiserver, read_objects, write_kubeconfig

RECORDED = Path(__file__).parent / "data" / "kubernetes"
TOKEN = "backoff-token"
DEADLINE = 20.0  # seconds: a functional bound, far above what any step takes


async def until(what: str, check, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(0.01)


def test_the_steps_double_from_the_initial_to_the_cap_each_wait_jittered_to_twice():
    low, high = [], []
    for draw, out in ((0.0, low), (0.999999, high)):
        backoff = Backoff(initial=0.8, cap=30.0, reset=120.0)
        now = 0.0
        for _ in range(8):
            wait = backoff.next(now, draw)
            out.append(round(wait, 3))
            now += wait  # failing again as soon as each wait ends: no reset
    assert low == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    assert high == [1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 60.0, 60.0]


def test_the_step_starts_again_only_after_reset_seconds_without_a_wait():
    backoff = Backoff(initial=0.8, cap=30.0, reset=120.0)
    now = 0.0
    for _ in range(6):
        now += backoff.next(now, 0.0)
    assert backoff.next(now + 119.0, 0.0) == 30.0  # ran 119 s since the last wait ended
    now += 119.0 + 30.0
    assert backoff.next(now + 121.0, 0.0) == 0.8  # a list and watch that lived 121 s


def test_a_cap_below_the_initial_step_caps_the_first_wait_too():
    # a config from before, backoff_max: 0.2s, still waits at most twice that
    backoff = Backoff(initial=0.8, cap=0.2, reset=120.0)
    assert [backoff.next(0.0, 0.0) for _ in range(3)] == [0.2, 0.2, 0.2]


def test_the_defaults_are_client_gos_and_reach_the_informers():
    config = KubernetesConfig()
    assert (config.backoff_initial, config.backoff_max, config.backoff_reset) == (0.8, 30, 120)
    limits = Limits()
    assert (limits.backoff_initial, limits.backoff_max, limits.backoff_reset) == (0.8, 30, 120)


def test_the_backoff_keys_are_read_from_the_config_and_a_bad_one_names_itself(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("sources:\n  kubernetes:\n    backoff_initial: 200ms\n"
                    "    backoff_max: 1s\n    backoff_reset: 10s\n")
    kube = load_config(path).sources.kubernetes
    assert (kube.backoff_initial, kube.backoff_max, kube.backoff_reset) == (0.2, 1.0, 10.0)
    path.write_text("sources:\n  kubernetes:\n    backoff_initial: 0s\n")
    with pytest.raises(ConfigError, match=r"^sources\.kubernetes\.backoff_initial: "):
        load_config(path)


@pytest.fixture
async def storm():
    fake = FakeApiserver(token=TOKEN, gone_every_watch=True)
    fake.load(read_objects(RECORDED))
    await fake.start()
    yield fake
    await fake.kill()


@pytest.mark.slow
async def test_an_apiserver_answering_410_to_every_watch_sees_at_most_20_lists_in_20_s(
        storm, tmp_path):
    """The issue's bound, with the real defaults: nodes, pods and claims, 20 s counted from
    the source's start. Before: 88 lists (0.1 s doubling to 1 s, a first 410 at once)."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", storm.url, TOKEN)
    source = build(KubernetesConfig(enabled=True, kubeconfig=str(kubeconfig)), time.time)
    started = time.monotonic()
    try:
        reading = await source.read()
        informers = source._informers.informers
        await asyncio.sleep(20.0 - (time.monotonic() - started))
        lists = storm.lists()
        stats = {i.name: i.stats for i in informers}
    finally:
        await source.close()
    total = sum(lists.values())
    print(f"\n410 on every watch: {total} lists in 20 s ({lists})")
    assert reading.gpus  # the lists are good: the source reads from them
    served = {p: n for p, n in lists.items() if n}
    assert len(served) == 3 and all(n >= 2 for n in served.values())  # listed, and again
    assert total <= 20, f"{total} lists in 20 s"
    # the counters show it: each list after a 410, each wait and the step it reached
    assert sum(s.lists for s in stats.values()) <= total
    for name, s in stats.items():
        assert s.gone >= s.lists - 1 >= 1, name
        assert s.waits >= 3 and s.backoff >= 3.2, (name, s.waits, s.backoff)


@pytest.fixture
async def informer_for():
    session = aiohttp.ClientSession()
    made: list[Informer] = []

    async def auth() -> str:
        return f"Bearer {TOKEN}"

    def make(server: FakeApiserver, **limits) -> Informer:
        informer = Informer(session, Endpoint(server.url, None, auth), PODS,
                            lambda obj: obj["metadata"]["name"], Limits(**limits))
        made.append(informer)
        return informer

    yield make
    for informer in made:
        await informer.stop()
    await session.close()


# scaled down a hundredfold: 8 ms doubling to 0.3 s, a watch that lived 1.2 s resets
SCALED = {"backoff_initial": 0.008, "backoff_max": 0.3, "backoff_reset": 1.2}


async def _stormed_to_the_cap(fake: FakeApiserver, informer: Informer) -> None:
    informer.start()
    await until("the step at its cap", lambda: informer.stats.backoff >= 0.3)
    assert informer.stats.lists >= 2 and informer.stats.gone >= 5


async def test_a_watch_that_lived_past_the_reset_window_starts_the_backoff_again(
        storm, informer_for):
    informer = informer_for(storm, **SCALED)
    await _stormed_to_the_cap(storm, informer)
    storm.gone_every_watch = False
    watches = informer.stats.watches
    await until("a watch that works", lambda: informer.stats.watches > watches)
    await asyncio.sleep(1.5)  # it lives past the reset window
    waits = informer.stats.waits
    storm.gone_every_watch = True
    await storm.kill()  # the watch breaks; the storm goes on
    await storm.start()
    await until("the first wait after it", lambda: informer.stats.waits > waits)
    assert informer.stats.backoff < 0.016  # the initial step again: 8 ms, jittered to 16
    await until("the step at its cap again", lambda: informer.stats.backoff >= 0.3)


async def test_a_watch_that_lived_less_than_the_reset_window_keeps_the_backoff(
        storm, informer_for):
    informer = informer_for(storm, **SCALED)
    await _stormed_to_the_cap(storm, informer)
    storm.gone_every_watch = False
    watches = informer.stats.watches
    await until("a watch that works", lambda: informer.stats.watches > watches)
    waits = informer.stats.waits
    storm.gone_every_watch = True
    await storm.kill()  # the watch breaks at once
    await storm.start()
    await until("the first wait after it", lambda: informer.stats.waits > waits)
    assert informer.stats.backoff >= 0.3  # still at the cap


async def test_a_failing_apiserver_is_retried_with_the_same_backoff(informer_for):
    fake = FakeApiserver(token=TOKEN, forbidden=True)
    await fake.start()
    try:
        informer = informer_for(fake, **SCALED)
        informer.start()
        await until("the step at its cap", lambda: informer.stats.backoff >= 0.3)
        calls = len(fake.requests)
        await asyncio.sleep(1.2)
        retried = len(fake.requests) - calls
    finally:
        await fake.kill()
    assert informer.stats.failures == informer.stats.waits >= 5
    assert 1 <= retried <= 5  # once every 0.3-0.6 s


def test_the_old_key_alone_still_configures_the_cap():
    config = KubernetesConfig(backoff_max=Duration(1))
    assert (config.backoff_initial, config.backoff_max) == (0.8, 1.0)
