"""A kubelet's PodResources side, served by a real grpcio server on a unix socket.

``v1.PodResourcesLister`` from the vendored proto (exporter/sources/nvml/podresources_v1), so a
client's requests, method paths, deadlines and message-size limit all go through real gRPC.
No real kubelet runs in the tests: this server's answers stand for its side. Used by
tests/test_podresources.py (the client) and tests/test_nvml_pods.py (node mode end to end).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import grpc

from exporter.sources.nvml.podresources_v1 import api_pb2 as pb
from exporter.sources.nvml.podresources_v1 import api_pb2_grpc


@dataclass
class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's side: answers what it is given; ``stall`` holds every call until stopped."""

    listed: pb.ListPodResourcesResponse = field(default_factory=pb.ListPodResourcesResponse)
    allocatable: pb.AllocatableResourcesResponse | None = field(
        default_factory=pb.AllocatableResourcesResponse)  # None: an old kubelet, UNIMPLEMENTED
    stall: asyncio.Event | None = None
    calls: list[str] = field(default_factory=list)

    async def List(self, request: Any, context: Any) -> pb.ListPodResourcesResponse:
        self.calls.append("List")
        if self.stall is not None:
            await self.stall.wait()
        return self.listed

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        self.calls.append("GetAllocatableResources")
        if self.allocatable is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        return self.allocatable


async def start_kubelet(kubelet: Kubelet, path: str) -> grpc.aio.Server:
    """Serve ``kubelet`` on the unix socket ``path`` (at most 107 bytes); stop it when done."""
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server
