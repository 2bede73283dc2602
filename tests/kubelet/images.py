"""Images on the test cluster: the process kubelet pulls nothing (pods run the repository's Python), but it reports
the two image failures a real kubelet does, so the operator's handling of them can be tested:

- a name that is not a valid image reference (the distribution reference grammar: lowercase repository path,
  optional registry host[:port], `:tag`, `@digest`), e.g. `Flywheel:latest` -> waiting `InvalidImageName`, for good;
- an image from a registry under the reserved `.invalid` top-level domain (RFC 2606: it never resolves, so a real
  kubelet fails the same way), e.g. `registry.invalid/flywheel:latest` -> waiting `ErrImagePull`, then
  `ImagePullBackOff` while it backs off, retried for as long as the pod lives.

Every other image "pulls" at once. The project's own image (repository name `flywheel`, from any registry) has the
ENTRYPOINT and CMD of the repository's Dockerfile, so a container with only `args` runs `flywheel <args>`, and its
USER (10001:10001); every other image runs as root (uid 0), as most public and NGC images do.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from enum import Enum

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(rf"(?:(?P<domain>{_DOMAIN})/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
                        rf"(?::[\w][\w.-]{{0,127}})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:"
                        rf"[0-9a-fA-F]{{32,}})?")
UNPULLABLE_TLD = ".invalid"
BACKOFF_START_SECONDS, BACKOFF_MAX_SECONDS = 1.0, 10.0  # a real kubelet: 10 s doubling to 300 s


class Pull(str, Enum):
    OK = "ok"
    INVALID = "InvalidImageName"
    UNPULLABLE = "ErrImagePull"


# The Dockerfile's ENTRYPOINT and CMD, by the last component of the repository path.
ENTRYPOINTS: dict[str, tuple[list[str], list[str]]] = {"flywheel": (["flywheel"], ["--help"])}


# The Dockerfile's USER (uid, gid), by the same name; any other image runs as root.
USERS: dict[str, tuple[int, int]] = {"flywheel": (10001, 10001)}
# The accounts the Dockerfile adds to /etc/passwd and /etc/group, and its ENV that the kubelet's environment lacks.
ACCOUNTS: dict[str, tuple[str, str]] = {
    "flywheel": ("flywheel:x:10001:10001::/home/flywheel:/usr/sbin/nologin\n", "flywheel:x:10001:\n")}
IMAGE_ENV: dict[str, dict[str, str]] = {"flywheel": {"HOME": "/home/flywheel"}}


def _repository_name(image: str) -> str:
    return image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


def entrypoint(image: str) -> tuple[list[str], list[str]] | None:
    """(ENTRYPOINT, CMD) of a known image, else None."""
    known = ENTRYPOINTS.get(_repository_name(image))
    return (list(known[0]), list(known[1])) if known else None


def image_user(image: str) -> tuple[int, int]:
    """(uid, gid) the image runs as when the security context names no user."""
    return USERS.get(_repository_name(image), (0, 0))


def image_accounts(image: str) -> tuple[str, str]:
    """(/etc/passwd lines, /etc/group lines) the image adds to the host's, e.g. for `getpass.getuser()`."""
    return ACCOUNTS.get(_repository_name(image), ("", ""))


def image_env(image: str) -> dict[str, str]:
    return dict(IMAGE_ENV.get(_repository_name(image), {}))


def _registry(image: str) -> str:
    """The registry host of a reference, as Docker tells it from a first path component (a dot, a port or
    localhost); "" for Docker Hub."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first.split(":", 1)[0]
    return ""


def pull(image: str) -> Pull:
    if len(image) > 255 or not _REFERENCE.fullmatch(image):
        return Pull.INVALID
    return Pull.UNPULLABLE if _registry(image).endswith(UNPULLABLE_TLD) else Pull.OK


def invalid_message(image: str) -> str:
    return (f'Failed to apply default image tag "{image}": couldn\'t parse image name "{image}": '
            "invalid reference format")


def pull_error_message(image: str) -> str:
    return (f'Failed to pull image "{image}": failed to resolve reference "{image}": dial tcp: lookup '
            f"{_registry(image)}: no such host")


def backoff_message(image: str) -> str:
    return f'Back-off pulling image "{image}"'


def backoff_seconds(attempt: int) -> float:
    return min(BACKOFF_START_SECONDS * 2 ** attempt, BACKOFF_MAX_SECONDS)


async def _sleep(seconds: float, stopped: Callable[[], bool]) -> None:
    end = asyncio.get_running_loop().time() + seconds
    while not stopped() and asyncio.get_running_loop().time() < end:
        await asyncio.sleep(0.1)


async def pull_image(image: str, waiting: Callable[[str, str], Awaitable[None]],
                     stopped: Callable[[], bool]) -> bool:
    """The kubelet's image pull for one pod: True once the image is there (at once for a pullable one). Otherwise
    report the container waiting -- `waiting(reason, message)` also posts the kubelet's Warning event -- until the
    pod is deleted (`stopped()`): InvalidImageName once; ErrImagePull and ImagePullBackOff in turn, with a growing
    back-off between attempts. Returns False then."""
    outcome = pull(image)
    if outcome is Pull.OK:
        return True
    if outcome is Pull.INVALID:
        await waiting(Pull.INVALID.value, invalid_message(image))
        await _sleep(float("inf"), stopped)
        return False
    attempt = 0
    while not stopped():
        await waiting(Pull.UNPULLABLE.value, pull_error_message(image))
        await _sleep(1.0, stopped)  # until the kubelet's next sync shows the back-off
        if stopped():
            break
        await waiting("ImagePullBackOff", backoff_message(image))
        await _sleep(backoff_seconds(attempt), stopped)
        attempt += 1
    return False
