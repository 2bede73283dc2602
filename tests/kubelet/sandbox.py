"""How the process kubelet applies a container's security context, as a runtime does: the process runs as
`runAsUser`/`runAsGroup` (else the image's user) with `fsGroup` and `supplementalGroups`, `runAsNonRoot` refuses
a root user with the kubelet's own messages, and `readOnlyRootFilesystem` leaves only the declared volume mounts
(and /dev, /dev/shm, the termination message file) writable. Each node has its own host memory: the kubelet's
folder for the node is bind-mounted over /dev/shm in every container's namespace (a container with no security
context to apply gets only that), so workers on two nodes never see each other's /dev/shm, as on a cluster.

It uses util-linux, present on every Debian system (no extra package): `unshare --mount` gives the container a
private mount namespace in which each writable volume's mountPath is bind-mounted onto itself (a mount of its own
stays writable) before `/` is remounted read-only, then `setpriv` drops to the pod's user and groups (a root user
with `capabilities.drop: [ALL]` loses its capabilities through the bounding set) and exec's the container's argv.
The process keeps its pid (unshare and sh exec), so signals, `pid_of` and the cgroup-like kill work as before.

Volumes are not copied: a mountPath is the host path of that name, created when missing (emptyDirs are made
world-writable as a kubelet makes them; a PVC gets the pod's `fsGroup`), as the rest of the test cluster assumes.
A non-root process keeps one capability, CAP_DAC_READ_SEARCH (ambient, so torch's ranks inherit it): it must read
the interpreter (e.g. a pyenv under /root), the checkout and its volumes below 0700 directories such as pytest's
temp dirs, where a real container reads its own image. It reads and walks past permissions; it never writes where
its user may not."""

from __future__ import annotations

import dataclasses
import os
import shlex
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kubelet import images
from tests.kubelet.podenv import ConfigError

FIELDS_FROM_POD = ("runAsUser", "runAsGroup", "runAsNonRoot")
READ_ANYWHERE = "dac_read_search"  # the capability a non-root process keeps (see above)


@dataclass(frozen=True)
class Sandbox:
    """What the runtime applies to one container's process."""
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    read_only_root: bool = False
    drop_all_capabilities: bool = False
    added_capabilities: tuple[str, ...] = ()  # kept by a root process that drops ALL (e.g. IPC_LOCK for RDMA)
    no_new_privs: bool = False
    writable: tuple[str, ...] = ()  # mountPaths that stay writable under a read-only root
    read_only: tuple[str, ...] = ()  # volume mounts declared readOnly
    overlays: tuple[tuple[str, str], ...] = ()  # (host file, path it is bind-mounted over), e.g. /etc/passwd
    shm: str = ""  # the node's own host memory, bind-mounted over /dev/shm ("": the machine's, shared)

    @property
    def needed(self) -> bool:
        """A root process on a writable root with its capabilities runs as the kubelet's own child, as before."""
        return self.uid != 0 or self.read_only_root or self.drop_all_capabilities or bool(self.read_only)

    @property
    def namespaced(self) -> bool:
        """Whether the process needs a mount namespace of its own: a sandbox, or only its node's /dev/shm."""
        return self.needed or bool(self.shm)


def pod_ref(pod: dict[str, Any]) -> str:
    """The kubelet's format.Pod: `name_namespace(uid)`."""
    meta = pod["metadata"]
    return f"{meta['name']}_{meta['namespace']}({meta['uid']})"


def effective_context(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The container's securityContext over the pod's, field by field (the pod's holds only the shared fields)."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    merged = {k: pod_context[k] for k in FIELDS_FROM_POD if k in pod_context}
    merged.update(container.get("securityContext") or {})
    return merged


def identity(pod: dict[str, Any], container: dict[str, Any]) -> tuple[int, int]:
    """(uid, gid) the container runs as; ConfigError with the kubelet's message when runAsNonRoot forbids it."""
    context = effective_context(pod, container)
    image_uid, image_gid = images.image_user(str(container.get("image", "")))
    uid = int(context["runAsUser"]) if context.get("runAsUser") is not None else image_uid
    gid = int(context["runAsGroup"]) if context.get("runAsGroup") is not None else \
        image_gid if context.get("runAsUser") is None else 0
    if context.get("runAsNonRoot") and uid == 0:
        where = f"(pod: {pod_ref(pod)!r}, container: {container.get('name', '')})".replace("'", '"')
        if context.get("runAsUser") is not None:
            raise ConfigError(f"container's runAsUser breaks non-root policy {where}")
        raise ConfigError(f"container has runAsNonRoot and image will run as root {where}")
    return uid, gid


def volume_mounts(pod: dict[str, Any], container: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(volumeMount, volume) pairs of the container, in mount order (parents before children)."""
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    pairs = [(m, volumes.get(m.get("name"), {})) for m in container.get("volumeMounts") or []]
    return sorted(pairs, key=lambda pair: len(Path(str(pair[0].get("mountPath", "/"))).parts))


def plan(pod: dict[str, Any], container: dict[str, Any], extra_writable: Iterable[str] = ()) -> Sandbox:
    uid, gid = identity(pod, container)
    context = effective_context(pod, container)
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    groups = [int(g) for g in pod_context.get("supplementalGroups") or []]
    if pod_context.get("fsGroup") is not None:
        groups.insert(0, int(pod_context["fsGroup"]))
    mounts = volume_mounts(pod, container)
    writable = [str(m["mountPath"]) for m, _ in mounts if not m.get("readOnly")]
    capabilities = context.get("capabilities") or {}
    dropped = [str(c).upper() for c in capabilities.get("drop") or []]
    added = tuple(str(c).lower().removeprefix("cap_") for c in capabilities.get("add") or [])
    return Sandbox(uid=uid, gid=gid, groups=tuple(dict.fromkeys(groups)),
                   read_only_root=bool(context.get("readOnlyRootFilesystem")),
                   drop_all_capabilities="ALL" in dropped, added_capabilities=added,
                   no_new_privs=context.get("allowPrivilegeEscalation") is False,
                   writable=tuple(writable) + tuple(extra_writable),
                   read_only=tuple(str(m["mountPath"]) for m, _ in mounts if m.get("readOnly")))


def wrap(argv: list[str], box: Sandbox) -> list[str]:
    """The argv that runs `argv` inside the sandbox (unshare + sh + setpriv, all exec'ing in turn)."""
    lines = ["set -e"]
    if box.shm:  # first: a volume mounted below /dev/shm stays visible above it
        lines.append(f"mount --bind {shlex.quote(box.shm)} /dev/shm")
    mounts = sorted([(p, False) for p in box.writable] + [(p, True) for p in box.read_only],
                    key=lambda mount: len(Path(mount[0]).parts))  # a parent first, or it would hide its child
    for path, read_only in mounts:
        quoted = shlex.quote(path)
        lines.append(f"mount --bind {quoted} {quoted}")
        if read_only:
            lines.append(f"mount -o remount,bind,ro {quoted}")
    lines += [f"mount --bind {shlex.quote(host)} {shlex.quote(path)}" for host, path in box.overlays]
    if box.read_only_root:
        lines.append("mount -o remount,bind,ro /")
    priv = ["setpriv"]
    if box.uid != 0 or box.gid != 0 or box.groups:
        priv += [f"--reuid={box.uid}", f"--regid={box.gid}"]
        priv += [f"--groups={','.join(map(str, box.groups))}"] if box.groups else ["--clear-groups"]
    if box.uid != 0:
        priv += [f"--inh-caps=-all,+{READ_ANYWHERE}", f"--ambient-caps=+{READ_ANYWHERE}",
                 f"--bounding-set=-all,+{READ_ANYWHERE}"]
    elif box.drop_all_capabilities:
        priv += ["--inh-caps=-all", "--bounding-set=" + ",".join(["-all", *(f"+{c}" for c in box.added_capabilities)])]
    if box.no_new_privs:
        priv.append("--no-new-privs")
    lines.append(f'exec {" ".join(priv)} -- "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", "\n".join(lines),
            "sandbox", *argv]


def image_accounts(box: Sandbox, image: str, directory: Path) -> Sandbox:
    """The image's own users and groups over the host's /etc/passwd and /etc/group (files in `directory`), so the
    project image's uid 10001 has a name as in the image (kopf asks `getpass.getuser()`)."""
    passwd, group = images.image_accounts(image)
    if not passwd:
        return box
    overlays = []
    for name, extra in (("passwd", passwd), ("group", group)):
        path = directory / name
        path.write_text(Path(f"/etc/{name}").read_text() + extra)
        overlays.append((str(path), f"/etc/{name}"))
    return dataclasses.replace(box, overlays=(*box.overlays, *overlays))


def prepare_host(pod: dict[str, Any], container: dict[str, Any]) -> None:
    """Create the mountPaths and give the pod's user its volumes (emptyDir: world-writable; PVC: the fsGroup)."""
    fs_group = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    for mount, volume in volume_mounts(pod, container):
        target = Path(str(mount["mountPath"]))
        target.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in volume:
            os.chmod(target, stat.S_IMODE(target.stat().st_mode) | 0o777)
        elif "persistentVolumeClaim" in volume and fs_group is not None:
            os.chown(target, -1, int(fs_group))
            os.chmod(target, stat.S_IMODE(target.stat().st_mode) | 0o2070)
