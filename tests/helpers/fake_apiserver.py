"""A fake Kubernetes apiserver on aiohttp: the real paths and list/watch semantics, no etcd.

No apiserver, kind or k3s binary is packaged for these machines, so the kubernetes
source is tested against this. It serves what the source reads, on the real paths
(``/api/v1/nodes``, ``/api/v1/pods``, ``/apis/resource.k8s.io/v1/resourceclaims``,
``/apis/resource.k8s.io/v1/resourceslices``), with the semantics of the real one
(``api-concepts``, "Efficient detection of changes" and "Retrieving large results
sets in chunks"):

- one ``resourceVersion`` counter for every kind, as etcd's revision, moved on by
  every change;
- a list answers with ``metadata.resourceVersion``; ``limit`` pages it, with a
  ``continue`` token under which every page comes from the same view (the first
  page's), and ``remainingItemCount``;
- ``?watch=1&resourceVersion=N`` streams, as chunked JSON lines, every change after
  N (replayed from the history, then live), ``BOOKMARK`` events when asked to
  (``allowWatchBookmarks=true``), and ends after ``timeoutSeconds``;
- a version older than the last :meth:`FakeApiserver.compact` answers ``410 Gone``:
  as an ``ERROR`` event with a Status of code 410 on a watch (what a real apiserver
  does), or as HTTP 410 with ``gone_as_http``; an expired ``continue`` token too;
- ``Authorization: Bearer <token>`` is checked when a token is set; ``forbidden``
  answers 403 with a Status like RBAC's;
- :meth:`kill` drops every connection at once (no clean end of the streams) and
  stops listening; :meth:`start` listens again on the same port, with the same
  objects and history, as an apiserver restarted in front of the same etcd.

Objects are kept as their JSON bytes as well, so a page of 500 pods is a join,
not a ``json.dumps`` of 500 dicts: the bench measures the source, not the fake.

``python -m tests.helpers.fake_apiserver --port P DIR`` serves the ``*.json``
objects of DIR (a file holds one object or a ``List``) until killed; ``--bench
NODES,PODS`` serves a generated cluster of that size instead (bench/kubernetes.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PATHS = {"Node": NODES, "Pod": PODS, "ResourceClaim": CLAIMS, "ResourceSlice": SLICES}
LIST_KINDS = {NODES: ("v1", "NodeList"), PODS: ("v1", "PodList"),
              CLAIMS: ("resource.k8s.io/v1", "ResourceClaimList"),
              SLICES: ("resource.k8s.io/v1", "ResourceSliceList")}


# Discovery, as kubectl (client-go) asks for it before it lists anything: which groups and
# versions are served and which resources each has (kind, namespaced, verbs).
def _resource(name: str, kind: str, namespaced: bool) -> dict[str, Any]:
    return {"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
            "verbs": ["get", "list", "watch"]}


DISCOVERY: dict[str, dict[str, Any]] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
        "name": "resource.k8s.io",
        "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
        "preferredVersion": {"groupVersion": "resource.k8s.io/v1", "version": "v1"}}]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        _resource("nodes", "Node", False), _resource("pods", "Pod", True)]},
    "/apis/resource.k8s.io/v1": {"kind": "APIResourceList",
                                 "groupVersion": "resource.k8s.io/v1", "resources": [
        _resource("resourceclaims", "ResourceClaim", True),
        _resource("resourceslices", "ResourceSlice", False)]},
    "/version": {"major": "1", "minor": "35", "gitVersion": "v1.35.0-fake",
                 "platform": "linux/amd64"},
}


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``metav1.Status`` as the apiserver writes it."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


@dataclass
class Stored:
    obj: dict[str, Any]
    raw: bytes


@dataclass
class Event:
    version: int
    path: str
    type: str
    raw: bytes  # the object's JSON at that version


@dataclass
class FakeApiserver:
    port: int = 0
    token: str | None = None
    served: tuple[str, ...] = (NODES, PODS, CLAIMS, SLICES)  # others answer 404
    gone_as_http: bool = False  # 410 on a watch as an HTTP status rather than an ERROR event
    # every watch answers 410 Gone, whatever its version (a relist storm, as an apiserver
    # whose watch cache keeps nothing): lists answer as ever
    gone_every_watch: bool = False
    forbidden: bool = False  # every call answers 403
    version: int = 1000
    compacted: int = 0  # versions below this answer 410
    max_page: int = 5000  # the real apiserver caps limit too (it may return fewer)
    objects: dict[str, dict[str, Stored]] = field(default_factory=dict)
    history: list[Event] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # "GET path?query", in order
    _watchers: set[asyncio.Queue[Event | None]] = field(default_factory=set)
    _live: dict[int, web.BaseRequest] = field(default_factory=dict)
    _lists: dict[int, tuple[int, list[bytes]]] = field(default_factory=dict)
    _list_ids: Any = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None
    ssl_context: Any = None  # an ssl.SSLContext: serve https, as every real apiserver does
    # PATCH of a node (a JSON merge patch): this many next patches find the node changed by
    # another writer first (a label), so a patch guarded by resourceVersion gets 409
    concurrent_writes: int = 0

    # -- changing the cluster ----------------------------------------------------------

    def _put(self, path: str, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj = json.loads(json.dumps(obj))  # a copy the caller cannot change under us
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        raw = json.dumps(obj, separators=(",", ":")).encode()
        store = self.objects.setdefault(path, {})
        if kind == "DELETED":
            store.pop(key_of(obj), None)
        else:
            store[key_of(obj)] = Stored(obj, raw)
        event = Event(self.version, path, kind, raw)
        self.history.append(event)
        for queue in self._watchers:
            queue.put_nowait(event)

    def add(self, obj: Mapping[str, Any], path: str | None = None) -> None:
        path = path or PATHS[obj["kind"]]
        exists = key_of(obj) in self.objects.get(path, {})
        self._put(path, "MODIFIED" if exists else "ADDED", dict(obj))

    def delete(self, path: str, key: str) -> None:
        stored = self.objects.get(path, {}).get(key)
        if stored is not None:
            self._put(path, "DELETED", stored.obj)

    def get(self, path: str, key: str) -> dict[str, Any]:
        return json.loads(self.objects[path][key].raw)

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        for obj in objects:
            self.add(obj)

    def load_quietly(self, path: str, raws: Iterable[bytes]) -> None:
        """Many objects at one version, without history (the bench's 50,000 pods)."""
        self.version += 1
        store = self.objects.setdefault(path, {})
        for raw in raws:
            obj = json.loads(raw)
            store[key_of(obj)] = Stored(obj, raw)

    def compact(self) -> None:
        """Forget the history up to now: older versions answer 410 Gone from here on."""
        self.compacted = self.version
        self.history.clear()
        self._lists.clear()

    def lists(self) -> dict[str, int]:
        """Lists asked for so far, by path (first pages only: a list in pages is one list)."""
        counts = dict.fromkeys(self.served, 0)
        for request in self.requests:
            path, _, query = request.removeprefix("GET ").partition("?")
            if path in counts and "watch=" not in query and "continue=" not in query:
                counts[path] += 1
        return counts

    def bookmark(self) -> None:
        """Send every open watch a BOOKMARK at the current version."""
        for queue in self._watchers:
            queue.put_nowait(Event(self.version, "", "BOOKMARK", b""))

    # -- serving -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/fake/churn", self._churn)
        app.router.add_patch(NODES + "/{name}", self._patch_node)
        app.router.add_get("/{path:.*}", self._handle)
        # a client that goes away cancels its watch handler, as it ends a real apiserver watch
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handle_signals=False,
                                     handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True,
                           ssl_context=self.ssl_context)
        await site.start()
        if self.port == 0:
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def kill(self) -> None:
        """Drop every connection without ending its stream, and stop listening."""
        for request in list(self._live.values()):
            if request.transport is not None:
                request.transport.abort()
        for queue in list(self._watchers):
            queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _churn(self, request: web.Request) -> web.Response:
        """Test-only: change ``n`` pods (their checkpoint annotation), ``n`` MODIFIED events;
        how the bench makes watch events in a fake running in another process."""
        count = min(int(request.query.get("n", "1")), 100_000)
        pods = list(self.objects.get(PODS, {}).values())
        for n in range(count):
            obj = json.loads(pods[n % len(pods)].raw)
            obj["metadata"].setdefault("annotations", {})[
                "gpufleet.io/last-checkpoint"] = str(1_764_547_200 + self.version)
            self._put(PODS, "MODIFIED", obj)
        return web.Response(text=str(self.version))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/readyz":  # public on a real apiserver too (system:public-info-viewer)
            return web.Response(text="ok")
        self.requests.append(f"GET {request.path_qs}")
        if self.token is not None and \
                request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)
        path = request.path
        if path in DISCOVERY:
            return web.json_response(DISCOVERY[path])
        kind = path.rsplit("/", 1)[-1]
        if path.startswith(NODES + "/") and not self.forbidden:  # GET one node
            stored = self.objects.get(NODES, {}).get(kind)
            if stored is None:
                return web.json_response(status(404, "NotFound", f'nodes "{kind}" not found'),
                                         status=404)
            return web.Response(body=stored.raw, content_type="application/json")
        if self.forbidden:
            return web.json_response(status(
                403, "Forbidden", f'{kind} is forbidden: User "system:serviceaccount:gpufleet:'
                f'gpufleet" cannot list resource "{kind}" at the cluster scope'), status=403)
        if path not in self.served:
            return web.json_response(status(404, "NotFound", "the server could not find the "
                                            "requested resource"), status=404)
        if request.query.get("watch") in ("1", "true"):
            return await self._watch(request, path)
        return self._list(request, path)

    def _list(self, request: web.Request, path: str) -> web.Response:
        limit = int(request.query.get("limit", "0") or 0)
        token = request.query.get("continue", "")
        if token:
            list_id, _, offset_text = token.partition(":")
            entry = self._lists.get(int(list_id))
            if entry is None:
                return web.json_response(status(
                    410, "Expired", "The provided continue parameter is too old to display a "
                    "consistent list result. You can start a new list without the continue "
                    "parameter."), status=410)
            version, raws = entry
            offset = int(offset_text)
        else:
            version = self.version
            store = self.objects.get(path, {})
            raws = [store[k].raw for k in sorted(store)]
            offset = 0
            list_id = str(next(self._list_ids))
            if limit:
                self._lists[int(list_id)] = (version, raws)
        if limit:
            limit = min(limit, self.max_page)
            page = raws[offset:offset + limit]
            remaining = len(raws) - offset - len(page)
        else:
            page, remaining = raws, 0
        api_version, list_kind = LIST_KINDS[path]
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if remaining > 0:
            meta["continue"] = f"{list_id}:{offset + len(page)}"
            meta["remainingItemCount"] = remaining
        else:
            self._lists.pop(int(list_id), None)
        head = json.dumps({"kind": list_kind, "apiVersion": api_version, "metadata": meta})
        body = head[:-1].encode() + b',"items":[' + b",".join(page) + b"]}"
        return web.Response(body=body, content_type="application/json")

    async def _watch(self, request: web.Request, path: str) -> web.StreamResponse:
        since_text = request.query.get("resourceVersion", "")
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        since = int(since_text) if since_text not in ("", "0") else None
        gone = self.gone_every_watch or (since is not None and since < self.compacted)
        if gone and self.gone_as_http:
            return web.json_response(status(
                410, "Expired", f"too old resource version: {since} ({self.compacted})"),
                status=410)
        # the backlog and the queue are taken together, before any await: a change made
        # meanwhile is in exactly one of them
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._watchers.add(queue)
        self._live[id(request)] = request
        if since is None:  # "any version": the current objects as ADDED, then changes
            backlog = [("ADDED", s.raw) for s in self.objects.get(path, {}).values()]
        else:
            backlog = [(e.type, e.raw) for e in self.history if e.version > since and e.path == path]
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            if gone:
                await self._send(response, "ERROR", json.dumps(status(
                    410, "Expired", f"too old resource version: {since} ({self.compacted})"),
                    separators=(",", ":")).encode())
                return response
            for kind, raw in backlog:
                await self._send(response, kind, raw)
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if event is None:
                    break
                if event.type == "BOOKMARK":
                    if bookmarks:
                        kind = LIST_KINDS[path][1].removesuffix("List")
                        await self._send(response, "BOOKMARK", json.dumps(
                            {"kind": kind, "apiVersion": LIST_KINDS[path][0],
                             "metadata": {"resourceVersion": str(event.version)}}).encode())
                elif event.path == path:
                    await self._send(response, event.type, event.raw)
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.discard(queue)
            self._live.pop(id(request), None)
        return response

    async def _patch_node(self, request: web.Request) -> web.Response:
        """A JSON merge patch (RFC 7386) of one node; a ``metadata.resourceVersion`` in it is
        a precondition, as on a real apiserver (409 Conflict when the node moved on)."""
        name = request.match_info["name"]
        self.requests.append(f"PATCH {request.path_qs}")
        if self.token is not None and \
                request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)
        if request.content_type != "application/merge-patch+json":
            return web.json_response(status(415, "UnsupportedMediaType",
                                            "the body of the request was in an unknown format - "
                                            "accepted media types include: "
                                            "application/merge-patch+json"), status=415)
        if name not in self.objects.get(NODES, {}):
            return web.json_response(status(404, "NotFound", f'nodes "{name}" not found'), status=404)
        if self.concurrent_writes > 0:
            self.concurrent_writes -= 1
            other = self.get(NODES, name)
            other["metadata"].setdefault("labels", {})["other-writer"] = str(self.version)
            self.add(other)
        patch = await request.json()
        current = self.get(NODES, name)
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            return web.json_response(status(
                409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again"),
                status=409)
        self.add(_merge(current, patch))
        return web.Response(body=self.objects[NODES][name].raw, content_type="application/json")

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, raw: bytes) -> None:
        await response.write(b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n")


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def write_kubeconfig(path: Path, url: str, token: str | None = None) -> Path:
    """A kubeconfig whose current context reaches ``url`` with ``token``, as kubectl writes one."""
    user = f"\n    token: {token}" if token else " {}"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: recorded
  cluster:
    server: {url}
users:
- name: gpufleet
  user:{user}
contexts:
- name: recorded
  context:
    cluster: recorded
    user: gpufleet
current-context: recorded
""")
    return path


def read_objects(folder: Path) -> list[dict[str, Any]]:
    """Every object in the ``*.json`` files of ``folder`` (a file holds one object or a List)."""
    objects: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        objects += data["items"] if data.get("kind", "").endswith("List") else [data]
    return objects


async def _serve(args: argparse.Namespace) -> None:
    fake = FakeApiserver(port=args.port, token=args.token)
    if args.bench:
        from bench.kubernetes import generated_cluster

        nodes, pods = (int(n) for n in args.bench.split(","))
        for path, raws in generated_cluster(nodes, pods):
            fake.load_quietly(path, raws)
    for folder in args.folders:
        fake.load(read_objects(Path(folder)))
    await fake.start()
    print(f"listening on {fake.url}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", default=None)
    parser.add_argument("--bench", default="", help="NODES,PODS: a generated cluster")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main(sys.argv[1:])
