"""Which kubeconfig the kubernetes source reads (issue 30): kubectl's order, against the
fake apiserver. ``sources.kubernetes.kubeconfig``, else ``KUBECONFIG`` (files merged in
order, the first to name an entry or a current-context wins), else ``~/.kube/config``,
else in-cluster."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from exporter.collect import Collector
from exporter.sources import SourceStartupError
from exporter.sources.kubernetes.kubeconfig import choose
from exporter.sources.kubernetes.options import KubernetesSource as KubernetesConfig
from exporter.sources.kubernetes.source import build
from tests.helpers.fake_apiserver import write_kubeconfig
from tests.test_kubernetes_source import TOKEN, apiserver, serve_on_the_recorded_cluster  # noqa: F401

DEAD = "http://127.0.0.1:9"  # the discard port: nothing answers


def split_kubeconfig(folder: Path, url: str) -> tuple[Path, Path]:
    """Two files that reach ``url`` only merged as kubectl merges them: ``a`` has the
    cluster, the user and the current-context; ``b`` the context, plus a later ``recorded``
    cluster and current-context pointing at nothing (the first file wins both)."""
    a = folder / "a.yaml"
    a.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: recorded
  cluster: {{server: "{url}"}}
users:
- name: gpufleet
  user: {{token: {TOKEN}}}
current-context: recorded
""")
    b = folder / "b.yaml"
    b.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: recorded
  cluster: {{server: "{DEAD}"}}
- name: dead
  cluster: {{server: "{DEAD}"}}
contexts:
- name: recorded
  context: {{cluster: recorded, user: gpufleet}}
- name: dead
  context: {{cluster: dead, user: gpufleet}}
current-context: dead
""")
    return a, b


def enabled(**options) -> KubernetesConfig:
    return KubernetesConfig(enabled=True, **options)


async def test_kubeconfig_files_are_merged_in_order(apiserver, tmp_path):  # noqa: F811
    a, b = split_kubeconfig(tmp_path, apiserver.url)
    environ = {"KUBECONFIG": f"{a}:{tmp_path / 'missing.yaml'}:{b}", "HOME": str(tmp_path)}
    source = build(enabled(), time.time, environ=environ)
    try:
        assert (source.kubeconfig_choice.files, source.kubeconfig_choice.context) == \
            ((str(a), str(b)), "recorded")
        snapshot = await Collector([source], 10, clock=time.time).collect()
    finally:
        await source.close()
    assert [(s.up, s.error) for s in snapshot.sources] == [(True, "")]
    assert len(snapshot.gpus) == 21


def test_the_option_overrides_kubeconfig_then_home(tmp_path):
    a, b = split_kubeconfig(tmp_path, "http://127.0.0.1:1")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    default = write_kubeconfig(home / ".kube" / "config", "http://127.0.0.1:2")
    given = write_kubeconfig(tmp_path / "given.yaml", "http://127.0.0.1:3")
    environ = {"KUBECONFIG": f"{a}:{b}", "HOME": str(home)}
    assert choose(enabled(kubeconfig=str(given)), environ).files == (str(given),)
    assert choose(enabled(), environ).files == (str(a), str(b))
    assert choose(enabled(), {"HOME": str(home)}).files == (str(default),)
    assert choose(enabled(), {"HOME": str(tmp_path)}).in_cluster
    assert choose(enabled(context="dead"), environ).context == "dead"


def test_bad_kubeconfig_lists_name_where_they_came_from(tmp_path):
    with pytest.raises(SourceStartupError, match=r"^KUBECONFIG: none of its files exists \(.*/x:.*/y\)$"):
        build(enabled(), time.time, environ={"KUBECONFIG": f"{tmp_path / 'x'}:{tmp_path / 'y'}"})
    a, b = split_kubeconfig(tmp_path, "http://127.0.0.1:1")
    with pytest.raises(SourceStartupError, match=r"^sources\.kubernetes\.context: 'prod' is not a "
                                                 r"context of KUBECONFIG \(.*\) \(it has: recorded, dead\)$"):
        build(enabled(context="prod"), time.time, environ={"KUBECONFIG": f"{a}:{b}"})
    (tmp_path / "broken").write_text("clusters: [\n")
    with pytest.raises(SourceStartupError, match=r"^KUBECONFIG: "):
        build(enabled(), time.time, environ={"KUBECONFIG": str(tmp_path / "broken")})


@pytest.mark.slow
def test_serve_reads_a_merged_kubeconfig_list(tmp_path):
    """``KUBECONFIG=a:b gpufleet serve --source kubernetes``, the fake apiserver in its own
    process: the exporter reaches it through the merged files and serves the cluster."""
    def merged(url: str) -> dict[str, Any]:
        a, b = split_kubeconfig(tmp_path, url)
        return {"env": {"KUBECONFIG": f"{a}:{b}", "HOME": str(tmp_path)},
                "drop_env": ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}

    metrics = serve_on_the_recorded_cluster(tmp_path, merged)
    assert metrics.value("gpufleet_source_up", source="kubernetes") == 1
    assert len(metrics.all("gpufleet_gpu_info")) == 21
