"""What node mode's kubelet read costs: both PodResources calls over a real unix socket, and the join.

A grpcio server speaking the kubelet's v1 proto (tests/helpers/kubelet.py) answers for an
8-GPU node at the kubelet's default of 110 pods (8 holding one GPU each, 102 holding none,
as the kubelet lists every pod), and at the client's caps (5,000 pods, 20 device ids each:
100,000 ids). For each, the nvml source's kubelet side (exporter/sources/nvml/pods.py)
fetches both answers ``--reads`` times and joins them to the node's GPUs; printed: the
median and worst fetch (wall) and join (CPU) times. Nothing is asserted: the figures go in
docs/sources.md ("The kubelet's PodResources API") with this command line.

Usage: ``.venv/bin/python bench/kubelet_pods.py [--reads 50]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.snapshot import Gpu
from exporter.sources.nvml.podresources_v1 import api_pb2 as pb
from exporter.sources.nvml.pods import PodGpus, build
from tests.helpers.kubelet import Kubelet, start_kubelet

NODE = "gpu-node-1"
UUIDS = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)]


def node(pods: int, ids_per_pod: int, holding: int) -> tuple[Kubelet, list[Gpu]]:
    listed = pb.ListPodResourcesResponse(pod_resources=[
        pb.PodResources(namespace="ns", name=f"pod-{p}", containers=[pb.ContainerResources(
            name="main", devices=[pb.ContainerDevices(
                resource_name="nvidia.com/gpu",
                device_ids=[f"{UUIDS[p % 8]}::{r}" if ids_per_pod > 1 else UUIDS[p % 8]
                            for r in range(ids_per_pod)])] if p < holding else [])])
        for p in range(pods)])
    replicas = ids_per_pod if ids_per_pod > 1 else 1
    allocatable = pb.AllocatableResourcesResponse(devices=[pb.ContainerDevices(
        resource_name="nvidia.com/gpu",
        device_ids=[f"{u}::{r}" if replicas > 1 else u for u in UUIDS for r in range(replicas)])])
    return Kubelet(listed, allocatable), [Gpu(NODE, i, u, "H100", "") for i, u in enumerate(UUIDS)]


async def measure(name: str, kubelet: Kubelet, gpus: list[Gpu], reads: int) -> None:
    with tempfile.TemporaryDirectory(prefix="kubelet-", dir="/tmp") as directory:
        path = os.path.join(directory, "kubelet.sock")
        server = await start_kubelet(kubelet, path)
        pods: PodGpus = build(path, timeout=5.0, stale_for=300.0, clock=time.time)
        fetches, joins = [], []
        try:
            for _ in range(reads):
                started = time.perf_counter()
                await pods.fetch()
                fetches.append(time.perf_counter() - started)
                started = time.process_time()
                allocations, status = pods.join(NODE, gpus, ())
                joins.append(time.process_time() - started)
                assert status.up, status.error
        finally:
            await pods.close()
            await server.stop(grace=None)
    print(f"{name}: {len(allocations):,} allocations; fetch median "
          f"{statistics.median(fetches) * 1000:.2f} ms, worst {max(fetches) * 1000:.2f} ms; "
          f"join median {statistics.median(joins) * 1000:.2f} ms CPU, worst "
          f"{max(joins) * 1000:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(measure("110 pods, 8 GPUs held", *node(110, 1, 8), args.reads))
    asyncio.run(measure("5,000 pods x 20 replica ids (the caps)", *node(5_000, 20, 5_000),
                        max(3, args.reads // 10)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
