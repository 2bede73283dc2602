"""The images the real nodes hold (real_node.py): a containerd root kept in the cache (~/.cache/flywheel/
containerd-images/<containerd release>), into which a containerd of its own imports the sandbox image (built here
from tests/k8s/pause, oci.py) and the podman images the tests name, each only when podman's copy changed since
(`podman save` then `ctr images import`: minutes for the project's 5.8 GB image, then nothing while it stays the
same); each node's containerd root hard-links its files. No registry is reachable here, so nothing is pulled."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.cluster import binary, oci
from tests.cluster.real_node import containerd_config

IMPORT_TIMEOUT_S = 1500.0


def sandbox_reference() -> str:
    return f"localhost/flywheel-pause:{binary.PAUSE.cache_key()}"


def template_root(images: tuple[str, ...], log: Path) -> Path:
    """A containerd root holding the sandbox image and `images` (podman's current copies), imported as needed."""
    cache = binary.cache_root().parent / "containerd-images" / binary.containerd_version()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / "root"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be importing
        wanted = {sandbox_reference(): "", **{image: _podman_id(image) for image in images}}
        if all(_marker(cache, ref).exists() and _marker(cache, ref).read_text() == digest
               for ref, digest in wanted.items()):
            return root
        with _Importer(root, log) as importer:
            for ref, digest in wanted.items():
                marker = _marker(cache, ref)
                if marker.exists() and marker.read_text() == digest:
                    continue
                if ref == sandbox_reference():
                    importer.sandbox(ref)
                else:
                    importer.podman_image(ref)
                marker.write_text(digest)
    return root


def _marker(cache: Path, ref: str) -> Path:
    folder = cache / "imported"
    folder.mkdir(exist_ok=True)
    return folder / re.sub(r"[^A-Za-z0-9_.-]", "_", ref)


def _podman_id(image: str) -> str:
    result = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True,
                            text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"podman has no image {image} for the real nodes: {result.stderr.strip()}")
    return result.stdout.strip()


class _Importer:
    """A containerd of its own on the template root for the time of the imports."""

    def __init__(self, root: Path, log: Path) -> None:
        self.root, self.log = root, log
        self.state = Path(tempfile.mkdtemp(prefix="fw-ctrd-", dir="/run"))
        self.socket = self.state / "containerd.sock"
        self.tools = binary.ensure_containerd()
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _Importer:
        config = self.state / "config.toml"
        config.write_text(containerd_config(self.root, self.state, self.socket, sandbox_reference(),
                                            Path("/usr/sbin/runc"), self.state))
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([str(self.tools / "containerd"), "--config", str(config)], stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while self.ctr("version").returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the image importer's containerd did not start (log: {self.log})")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)
        shutil.rmtree(self.state, ignore_errors=True)

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.tools / "ctr"), "--address", str(self.socket), "--namespace", "k8s.io",
                               *args], capture_output=True, text=True, timeout=timeout)

    def _import(self, archive: Path, ref: str) -> None:
        result = self.ctr("images", "import", str(archive), timeout=IMPORT_TIMEOUT_S)
        if result.returncode != 0 or ref not in self.ctr("images", "ls", "--quiet").stdout.split():
            raise RuntimeError(f"ctr images import of {ref} failed: {result.stderr[-2000:]}")

    def sandbox(self, ref: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            archive = oci.write_image_archive(Path(tmp) / "pause.tar", ref,
                                              {"pause": (binary.ensure_pause(), 0o755)}, ["/pause"])
            self._import(archive, ref)

    def podman_image(self, ref: str) -> None:
        with tempfile.TemporaryDirectory(dir=self.root.parent) as tmp:
            archive = Path(tmp) / "image.tar"
            saved = subprocess.run(["podman", "save", "--format", "oci-archive", "-o", str(archive), ref],
                                   capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, env={**os.environ})
            if saved.returncode != 0:
                raise RuntimeError(f"podman save {ref} failed: {saved.stderr[-2000:]}")
            self._import(archive, ref)
