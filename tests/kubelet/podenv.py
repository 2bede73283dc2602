"""How the process kubelet builds a container's environment and argv: env values, valueFrom (fieldRef,
configMapKeyRef, secretKeyRef), envFrom, and $(VAR) expansion in env, command and args, as the kubelet does; the
image's entrypoint when a container has no command; and the pod's service account credentials."""

from __future__ import annotations

import base64
import os
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from tests.kubelet import images

POD_IP = "127.0.0.1"
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
_INDEXED = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")

Fetch = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]  # (plural, namespace, name) -> object


class ConfigError(Exception):
    """The container's config cannot be resolved (CreateContainerConfigError)."""


def expand(text: str, env: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REF.sub(replace, text)


def field_ref(pod: dict[str, Any], path: str) -> str:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    indexed = _INDEXED.match(path)
    if indexed:
        return (meta.get(indexed.group(1)) or {}).get(indexed.group(2), "")
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"), "status.podIP": POD_IP,
              "status.hostIP": POD_IP, "status.podIPs": POD_IP, "status.hostIPs": POD_IP}
    if path in ("metadata.labels", "metadata.annotations"):
        return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get(path.split(".")[1]) or {}).items()))
    if path not in simple:
        raise ConfigError(f"unsupported fieldRef {path!r}")
    return str(simple[path] or "")


async def _key_ref(ref: dict[str, Any], plural: str, namespace: str, fetch: Fetch) -> str | None:
    obj = await fetch(plural, namespace, ref["name"])
    optional = bool(ref.get("optional"))
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{plural[:-1]} "{ref["name"]}" not found')
    if plural == "secrets":
        data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        data.update(obj.get("stringData") or {})
    else:
        data = dict(obj.get("data") or {})
    if ref["key"] not in data:
        if optional:
            return None
        raise ConfigError(f'couldn\'t find key {ref["key"]} in {plural[:-1]} {namespace}/{ref["name"]}')
    return data[ref["key"]]


def service_account_token(namespace: str, name: str) -> str:
    """The bearer token of a service account: its user name, so the API's request log (requestlog.py) keys each
    pod's requests by the identity RBAC would see (a real token is a signed JWT; the emulator checks none)."""
    return f"system:serviceaccount:{namespace}:{name}"


async def automounts_token(pod: dict[str, Any], fetch: Fetch) -> bool:
    """`automountServiceAccountToken` of the pod, else of its ServiceAccount, else true."""
    spec = pod.get("spec") or {}
    if spec.get("automountServiceAccountToken") is not None:
        return bool(spec["automountServiceAccountToken"])
    account = await fetch("serviceaccounts", pod["metadata"]["namespace"], spec.get("serviceAccountName") or "default")
    return (account or {}).get("automountServiceAccountToken") is not False


def write_service_account(directory: Path, pod: dict[str, Any], api_url: str, token: str | None = None,
                          ca_pem: str | None = None) -> dict[str, str]:
    """What a kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount -- `token`, `namespace` and, over
    TLS, `ca.crt` -- written to `directory`, plus a kubeconfig over them: the pods cannot see a fixed absolute path
    of their own, so in-cluster clients are pointed at it with $KUBECONFIG (returned as env). `token`: a bound
    token from the TokenRequest API (a real API server); else the emulator's unsigned stand-in."""
    namespace = pod["metadata"]["namespace"]
    account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    token = token or service_account_token(namespace, account)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    (directory / "namespace").write_text(namespace)
    cluster: dict[str, Any] = {"server": api_url}
    if ca_pem is not None:
        (directory / "ca.crt").write_text(ca_pem)
        cluster["certificate-authority"] = str(directory / "ca.crt")
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "in-cluster",
              "clusters": [{"name": "in-cluster", "cluster": cluster}],
              "users": [{"name": account, "user": {"token": token}}],
              "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": account,
                                                              "namespace": namespace}}]}
    (directory / "kubeconfig").write_text(yaml.safe_dump(config, sort_keys=False))
    return {"KUBECONFIG": str(directory / "kubeconfig")}


async def container_env(pod: dict[str, Any], container: dict[str, Any], api_host: str, api_port: int,
                        fetch: Fetch, mounted: dict[str, str] | None = None) -> dict[str, str]:
    """The process environment: the kubelet's own (so local tools are found), then what the kubelet gives every
    pod (`mounted`: the service account's $KUBECONFIG), then the pod's."""
    namespace = pod["metadata"]["namespace"]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env.update(HOSTNAME=(pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"],
               KUBERNETES_SERVICE_HOST=api_host, KUBERNETES_SERVICE_PORT=str(api_port))
    env.update(mounted or {})
    pod_env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, plural in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            if kind in source:
                obj = await fetch(plural, namespace, source[kind]["name"])
                if obj is None and not source[kind].get("optional"):
                    raise ConfigError(f'{plural[:-1]} "{source[kind]["name"]}" not found')
                data = (obj or {}).get("data") or {}
                if plural == "secrets":
                    data = {k: base64.b64decode(v).decode() for k, v in data.items()}
                pod_env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        name, value_from = item["name"], item.get("valueFrom")
        if value_from is None:
            pod_env[name] = expand(str(item.get("value", "")), {**env, **pod_env})
        elif "fieldRef" in value_from:
            pod_env[name] = field_ref(pod, value_from["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in value_from:
            value = await _key_ref(value_from["configMapKeyRef"], "configmaps", namespace, fetch)
            if value is not None:
                pod_env[name] = value
        elif "secretKeyRef" in value_from:
            value = await _key_ref(value_from["secretKeyRef"], "secrets", namespace, fetch)
            if value is not None:
                pod_env[name] = value
        elif "resourceFieldRef" in value_from:
            resource = value_from["resourceFieldRef"].get("resource", "")
            pod_env[name] = str(os.cpu_count() or 1) if resource.endswith("cpu") else "0"
    env.update(pod_env)
    return env


def container_argv(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """command + args with $(VAR) expanded, as a runtime combines them with the image's ENTRYPOINT and CMD
    (`command` replaces both; `args` alone follow the ENTRYPOINT). `python`/`python3` mean the interpreter running
    the kubelet, and `flywheel` (the project image's ENTRYPOINT, a console script) `<that interpreter> -m
    flywheel.cli`."""
    command, args = list(container.get("command") or []), list(container.get("args") or [])
    if not command:
        known = images.entrypoint(str(container.get("image", "")))
        if known is None and not args:
            raise ConfigError("the process kubelet needs a command or args (the image's entrypoint is unknown)")
        if known is not None:
            command, args = known[0], args or known[1]
    argv = [expand(str(part), env) for part in command + args]
    if not argv:
        raise ConfigError("the process kubelet needs a command or args")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    elif argv[0] == "flywheel":
        argv[:1] = [sys.executable, "-m", "flywheel.cli"]
    return argv
