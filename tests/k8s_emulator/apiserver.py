"""The HTTP face of the emulator (aiohttp): discovery, OpenAPI v3, CRUD + watch on every served resource,
status/scale/log subresources, Table output for kubectl, and /_flywheel/* fault-injection endpoints."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.k8s_emulator import eviction, listing, openapi, patches, protobuf, tables
from tests.k8s_emulator.controllers import ControlPlane
from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.requestlog import RequestRecorder, bearer
from tests.k8s_emulator.resources import ResourceType
from tests.k8s_emulator.selectors import field_selector, label_selector
from tests.k8s_emulator.store import Store

VERSION_INFO = {"major": "1", "minor": "33", "gitVersion": "v1.33.0-flywheel", "gitCommit": "emulator",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
                "compiler": "gc", "platform": "linux/amd64"}
ACCESS_LOG = os.environ.get("FLYWHEEL_CLUSTER_ACCESS_LOG") == "1"  # one stderr line per request, for debugging
PUBLIC_PATHS = ("healthz", "readyz", "livez", "version")  # open to everyone (system:public-info-viewer)
# Tokens the emulated cluster mints itself (httpclient.py's kubelet, podenv.py's service accounts): always valid.
MINTED_TOKEN_PREFIXES = ("system:node:", "system:serviceaccount:")
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
               "application/strategic-merge-patch+json", "application/apply-patch+yaml")


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")), status=status,
                        content_type="application/json")


def _dig(obj: Any, dotted: str) -> Any:
    for part in dotted.strip(".").split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _set(obj: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.strip(".").split(".")
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


class ApiServer:
    def __init__(self, store: Store, control_plane: ControlPlane, pod_log_dir: Path | None = None,
                 bookmark_interval: float = 30.0, default_watch_timeout: float = 1800.0) -> None:
        self.store, self.registry = store, store.registry
        self.control_plane = control_plane
        self.pod_log_dir = pod_log_dir
        self.bookmark_interval, self.default_watch_timeout = bookmark_interval, default_watch_timeout
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.admin_handlers: dict[str, Any] = {}  # extra /_flywheel/<name> handlers (the kubelet adds its own)
        self.recorder: RequestRecorder | None = None  # per-caller RBAC view of each request (requestlog.py); off
        # Bearer tokens accepted from users; None (the default) = no authentication. With a set, a request without
        # one of them (or a minted token) gets 401 with the Status body a real API server sends.
        self.accepted_tokens: frozenset[str] | None = None
        self.app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self.dispatch)

    # ---- fault hooks ---------------------------------------------------------------------------------------
    def pause(self) -> None:
        """Hold every API request (admin endpoints excepted) until `resume()`."""
        self.resumed.clear()

    def resume(self) -> None:
        self.resumed.set()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if ACCESS_LOG:
            print(f"api: {request.method} {request.path_qs} ct={request.content_type} "
                  f"accept={request.headers.get('Accept', '')}", file=sys.stderr, flush=True)
        if not request.path.startswith("/_flywheel/"):
            if not self.authenticated(request):
                return _json(StatusError(401, "Unauthorized", "Unauthorized").status(), 401)
            await self.resumed.wait()
            if self.recorder is not None:
                self.recorder.record(request.method, request.path, request.query, request.headers)
        try:
            return await handler(request)
        except StatusError as err:
            response = _json(err.status(), err.code)
            response.headers.update(err.headers())
            return response

    def authenticated(self, request: web.Request) -> bool:
        if self.accepted_tokens is None or request.path.strip("/").split("/")[0] in PUBLIC_PATHS:
            return True
        token = bearer(request.headers)
        return token in self.accepted_tokens or token.startswith(MINTED_TOKEN_PREFIXES)

    # ---- routing -------------------------------------------------------------------------------------------
    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if not parts:
            return _json({"paths": ["/api", "/api/v1", "/apis", "/openapi/v3", "/version", "/healthz"]})
        head = parts[0]
        if head in ("healthz", "readyz", "livez"):
            return web.Response(text="ok")
        if head == "version":
            return _json(VERSION_INFO)
        if head == "_flywheel":
            return await self.admin(request, parts[1:])
        if head == "openapi" and len(parts) >= 2 and parts[1] == "v3":
            return self.openapi(parts[2:])
        if head == "api":
            if len(parts) == 1:
                host = request.host
                return _json({"kind": "APIVersions", "versions": ["v1"],
                              "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]})
            group, version, rest = "", parts[1], parts[2:]
        elif head == "apis":
            if len(parts) == 1:
                return _json(self.registry.api_group_list())
            if len(parts) == 2:
                return self._found(self.registry.api_group(parts[1]))
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            return self._found(self.registry.resource_list(group, version))
        return await self.resource(request, group, version, rest)

    @staticmethod
    def _found(body: dict[str, Any] | None) -> web.Response:
        if body is None:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        return _json(body)

    def openapi(self, rest: list[str]) -> web.Response:
        if not rest:
            return _json(openapi.root_document(self.registry))
        group, version = ("", rest[1]) if rest[0] == "api" else (rest[1], rest[2]) if len(rest) >= 3 else ("", "")
        return self._found(openapi.group_version_document(self.registry, group, version))

    async def resource(self, request: web.Request, group: str, version: str, rest: list[str]) -> web.StreamResponse:
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        plural, name = rest[0], rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        rt = self.registry.lookup(group, version, plural)
        if rt is None or len(rest) > 3 or (namespace and not rt.namespaced) or (
                rt.namespaced and name is not None and not namespace):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if subresource is not None and not (
                (subresource == "status" and rt.status_subresource) or (subresource == "scale" and rt.scale)
                or subresource in rt.extra_subresources):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        query = request.query
        dry_run = query.get("dryRun") == "All"
        strict = query.get("fieldValidation", "").lower() == "strict"
        method = request.method
        if name is None:
            if method == "GET":
                if query.get("watch") in ("true", "1"):
                    return await self.watch(request, rt, version, namespace)
                return self.list(request, rt, version, namespace)
            if method == "POST":
                body = await self._body(request)
                self._check_kind(rt, version, body)
                created = self.store.create(rt, namespace, body, dry_run, strict)
                return _json(self._versioned(created, rt, version), 201)
            if method == "DELETE":
                return self.delete_collection(request, rt, version, namespace)
        elif subresource == "scale":
            return await self.scale(request, rt, namespace, name, dry_run)
        elif subresource == "log":
            return self.pod_log(rt, namespace, name, query)
        elif subresource == "eviction":  # create only
            if method != "POST":
                raise StatusError(405, "MethodNotAllowed", "the server does not allow this method on the "
                                  "requested resource")
            return _json(eviction.evict(self.store, rt, namespace, name, await self._body(request), dry_run), 201)
        elif method == "GET":
            obj = self.store.get(rt, namespace, name)
            return self._respond_object(request, rt, version, obj)
        elif method == "PUT":
            body = await self._body(request)
            self._check_kind(rt, version, body)
            updated = self.store.update(rt, namespace, name, body, subresource, dry_run, strict, require_rv=True)
            return _json(self._versioned(updated, rt, version))
        elif method == "PATCH":
            return await self.patch(request, rt, version, namespace, name, subresource, dry_run, strict)
        elif method == "DELETE":
            options = await self._body(request, allow_empty=True)
            grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            propagation = query.get("propagationPolicy", options.get("propagationPolicy"))
            if options.get("orphanDependents") is True:
                propagation = "Orphan"
            deleted = self.store.delete(rt, namespace, name, None if grace is None else int(grace), propagation,
                                        options.get("preconditions"), dry_run)
            still_there = self.store.peek(rt.key, namespace, name) is not None
            return _json(self._versioned(deleted, rt, version), 202 if still_there else 200)
        raise StatusError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    # ---- helpers -------------------------------------------------------------------------------------------
    @staticmethod
    async def _body(request: web.Request, allow_empty: bool = False) -> dict[str, Any]:
        raw = await request.read()
        if "protobuf" in request.content_type:
            try:
                return protobuf.decode(raw)
            except (protobuf.UnsupportedProtobuf, IndexError, UnicodeDecodeError) as err:
                raise StatusError(415, "UnsupportedMediaType", f"the emulator decodes protobuf only for "
                               f"{', '.join(protobuf.KINDS)}; send JSON ({err})") from None
        if not raw and allow_empty:
            return {}
        try:
            if "yaml" in request.content_type:
                body = yaml.safe_load(raw)
            else:
                body = json.loads(raw)
        except (ValueError, yaml.YAMLError) as err:
            raise StatusError.bad_request(f"invalid request body: {err}") from None
        if not isinstance(body, (dict, list)):
            raise StatusError.bad_request("request body must be an object")
        return body

    @staticmethod
    def _check_kind(rt: ResourceType, version: str, body: dict[str, Any]) -> None:
        body.setdefault("apiVersion", rt.api_version(version))
        body.setdefault("kind", rt.kind)
        if body["kind"] != rt.kind:
            raise StatusError.bad_request(f"the kind {body['kind']!r} does not match the resource {rt.plural!r}")

    @staticmethod
    def _versioned(obj: dict[str, Any], rt: ResourceType, version: str) -> dict[str, Any]:
        obj["apiVersion"] = rt.api_version(version)  # one storage version, served under every version
        return obj

    @staticmethod
    def _wants_table(request: web.Request) -> bool:
        return "as=Table" in request.headers.get("Accept", "")

    def _respond_object(self, request: web.Request, rt: ResourceType, version: str,
                        obj: dict[str, Any]) -> web.Response:
        if self._wants_table(request):
            include = request.query.get("includeObject", "Metadata")
            return _json(tables.to_table(rt, version, [obj], obj["metadata"]["resourceVersion"], include))
        return _json(self._versioned(obj, rt, version))

    def _predicate(self, request: web.Request):
        by_label = label_selector(request.query.get("labelSelector"))
        by_field = field_selector(request.query.get("fieldSelector"))
        return lambda obj: by_label(obj) and by_field(obj)

    def list(self, request: web.Request, rt: ResourceType, version: str, namespace: str) -> web.Response:
        query = request.query
        page = listing.list_page(self.store, rt, namespace, self._predicate(request), query,
                                 bool(query.get("labelSelector") or query.get("fieldSelector")))
        items = [self._versioned(o, rt, version) for o in page.items]
        if self._wants_table(request):
            table = tables.to_table(rt, version, items, page.resource_version, query.get("includeObject", "Metadata"))
            table["metadata"] = page.list_meta()
            return _json(table)
        return _json({"kind": f"{rt.kind}List", "apiVersion": rt.api_version(version), "metadata": page.list_meta(),
                      "items": items})

    def delete_collection(self, request: web.Request, rt: ResourceType, version: str,
                          namespace: str) -> web.Response:
        items = self.store.list(rt, namespace, self._predicate(request))
        for item in items:
            meta = item["metadata"]
            try:
                self.store.delete(rt, meta.get("namespace", ""), meta["name"])
            except StatusError as err:
                if err.code != 404:
                    raise
        return _json({"kind": f"{rt.kind}List", "apiVersion": rt.api_version(version),
                      "metadata": {"resourceVersion": str(self.store.rv)},
                      "items": [self._versioned(i, rt, version) for i in items]})

    async def watch(self, request: web.Request, rt: ResourceType, version: str, namespace: str) -> web.StreamResponse:
        query = request.query
        watcher = self.store.watch(rt, namespace, self._predicate(request), query.get("resourceVersion"))
        if query.get("sendInitialEvents") == "true":  # a streaming list (client-go's WatchListClient, kubectl 1.37)
            watcher.send("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version(version), "metadata": {
                "resourceVersion": str(self.store.rv), "annotations": {"k8s.io/initial-events-end": "true"}}})
        timeout = float(query.get("timeoutSeconds") or self.default_watch_timeout)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        as_table = self._wants_table(request)
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                wait = min(remaining, self.bookmark_interval) if bookmarks else remaining
                try:
                    async with asyncio.timeout(wait):  # not wait_for, which can lose a cancellation (deployments.py)
                        item = await watcher.queue.get()
                except TimeoutError:
                    if bookmarks and deadline - loop.time() > 0:
                        item = ("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version(version),
                                             "metadata": {"resourceVersion": str(self.store.rv)}})
                    else:
                        continue
                if item is None:
                    break
                kind, obj = item
                if kind not in ("ERROR", "BOOKMARK"):
                    obj = self._versioned(copy.deepcopy(obj), rt, version)
                    if as_table:
                        obj = tables.to_table(rt, version, [obj], obj["metadata"]["resourceVersion"],
                                              query.get("includeObject", "Metadata"))
                await response.write(json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()
                                     + b"\n")
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; a cancelled handler (client disconnect) also lands in `finally`
        finally:
            watcher.close()
            self.store.watchers.discard(watcher)
        return response

    async def patch(self, request: web.Request, rt: ResourceType, version: str, namespace: str, name: str,
                    subresource: str | None, dry_run: bool, strict: bool) -> web.Response:
        content_type = request.content_type
        if content_type not in PATCH_TYPES:
            raise StatusError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                           f"accepted media types include: {', '.join(PATCH_TYPES)}")
        body = await self._body(request)
        if content_type == "application/apply-patch+yaml" and self.store.peek(rt.key, namespace, name) is None:
            self._check_kind(rt, version, body)
            created = self.store.create(rt, namespace, body, dry_run, strict)
            return _json(self._versioned(created, rt, version), 201)
        current = self.store.get(rt, namespace, name)
        patched = self._apply_patch(rt, content_type, current, body)
        if not isinstance(patched, dict):
            raise StatusError(422, "Invalid", "the patch did not produce an object")
        sent_rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        patched.setdefault("metadata", {})["resourceVersion"] = sent_rv or current["metadata"]["resourceVersion"]
        updated = self.store.update(rt, namespace, name, patched, subresource, dry_run, strict)
        return _json(self._versioned(updated, rt, version))

    @staticmethod
    def _apply_patch(rt: ResourceType, content_type: str, current: Any, body: Any) -> Any:
        if content_type == "application/json-patch+json":
            return patches.json_patch(current, body)
        if content_type == "application/strategic-merge-patch+json":
            if rt.custom:
                raise StatusError(415, "UnsupportedMediaType", "strategic merge patch is not supported for custom "
                               "resources; use a merge or JSON patch")
            return patches.strategic_merge(current, body)
        return patches.merge_patch(current, body)  # merge patch, and apply patch as a simplified merge

    def _scale_of(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        assert rt.scale is not None
        meta = obj["metadata"]
        status: dict[str, Any] = {"replicas": _dig(obj, rt.scale.get("statusReplicasPath", "")) or 0}
        if rt.scale.get("labelSelectorPath"):
            selector = _dig(obj, rt.scale["labelSelectorPath"])
            if selector is not None:
                status["selector"] = selector
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                  "creationTimestamp") if k in meta},
                "spec": {"replicas": _dig(obj, rt.scale["specReplicasPath"]) or 0}, "status": status}

    async def scale(self, request: web.Request, rt: ResourceType, namespace: str, name: str,
                    dry_run: bool) -> web.Response:
        current = self.store.get(rt, namespace, name)
        if request.method == "GET":
            return _json(self._scale_of(rt, current))
        if request.method not in ("PUT", "PATCH"):
            raise StatusError(405, "MethodNotAllowed", "scale supports get, update and patch")
        body = await self._body(request)
        scale = self._scale_of(rt, current)
        sent_rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        if request.method == "PUT":
            scale = body
        else:
            scale = self._apply_patch(rt, request.content_type, scale, body)
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise StatusError.invalid("Scale", name, [f"spec.replicas: Invalid value: {replicas!r}: must be greater "
                                                   "than or equal to 0"])
        updated = copy.deepcopy(current)
        _set(updated, rt.scale["specReplicasPath"], replicas)
        updated["metadata"]["resourceVersion"] = sent_rv or current["metadata"]["resourceVersion"]
        stored = self.store.update(rt, namespace, name, updated, None, dry_run)
        return _json(self._scale_of(rt, stored))

    def pod_log(self, rt: ResourceType, namespace: str, name: str, query: Any) -> web.Response:
        pod = self.store.get(rt, namespace, name)
        spec = pod.get("spec") or {}
        inits = [c.get("name") for c in spec.get("initContainers") or []]
        mains = [c.get("name") for c in spec.get("containers") or []]
        wanted = query.get("container") or mains[0]
        if wanted not in inits + mains:
            raise StatusError.bad_request(f"container {wanted} is not valid for pod {name}")
        base = f"{namespace}_{name}_{pod['metadata']['uid']}" + (f".{wanted}" if wanted in inits else "")
        path = (self.pod_log_dir or Path("/nonexistent")) / f"{base}.log"
        if not path.exists():
            why = "PodInitializing" if wanted in mains and inits else "no log yet"
            raise StatusError(400, "BadRequest", f'container "{wanted}" in pod "{name}" is waiting to start: {why}')
        text = path.read_text(errors="replace")
        if query.get("tailLines"):
            text = "".join(text.splitlines(keepends=True)[-int(query["tailLines"]):])
        return web.Response(text=text, content_type="text/plain")

    # ---- /_flywheel admin endpoints ------------------------------------------------------------------------
    async def admin(self, request: web.Request, parts: list[str]) -> web.Response:
        action, query = (parts[0] if parts else ""), request.query
        if action == "drop-watches":
            return _json({"dropped": self.store.drop_watches()})
        if action == "compact":
            return _json({"compacted": self.store.compact()})
        if action == "conflict":
            rt = self.registry.get((query.get("group", ""), query["resource"]))
            if rt is None:
                raise StatusError(404, "NotFound", f"no resource {query['resource']!r}")
            self.store.force_conflict(rt.key, query.get("namespace", ""), query["name"], int(query.get("count", 1)))
            return _json({"ok": True})
        if action == "pause":
            self.pause()
            if query.get("seconds"):
                asyncio.get_running_loop().call_later(float(query["seconds"]), self.resume)
            return _json({"paused": True})
        if action == "resume":
            self.resume()
            return _json({"paused": False})
        if action in ("record-requests", "recorded-requests"):  # requestlog.py; recording starts fresh
            if action == "record-requests":
                self.recorder = RequestRecorder() if query.get("on", "true") == "true" else None
            return _json(self.recorder.as_json(query.get("counts") == "true") if self.recorder is not None else {})
        if action in self.admin_handlers:
            return _json(await self.admin_handlers[action](parts[1:], dict(query)))
        raise StatusError(404, "NotFound", f"unknown admin action {action!r}")
