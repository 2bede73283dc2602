"""A one-layer OCI image archive written from files on this machine, for what no registry can serve here: the real
nodes' sandbox (pause) image, imported into containerd with `ctr images import` (real_node.py)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _blob(out: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    _add(out, f"blobs/sha256/{digest}", data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _add(out: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    out.addfile(info, io.BytesIO(data))


def _layer(files: dict[str, tuple[Path, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for name, (source, mode) in sorted(files.items()):
            _add(layer, name, source.read_bytes(), mode)
    return buffer.getvalue()


def write_image_archive(target: Path, reference: str, files: dict[str, tuple[Path, int]],
                        entrypoint: list[str], user: str = "65535:65535") -> Path:
    """Write `target`: an OCI image layout archive of one image named `reference` whose single layer holds `files`
    (path in the image -> (source file, mode)) and whose process is `entrypoint`."""
    layer = _layer(files)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": entrypoint, "User": user, "WorkingDir": "/"},
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]}}
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as out:
        layer_desc = _blob(out, layer, LAYER)
        config_desc = _blob(out, json.dumps(config, sort_keys=True).encode(), CONFIG)
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": config_desc, "layers": [layer_desc]}
        manifest_desc = _blob(out, json.dumps(manifest, sort_keys=True).encode(), MANIFEST)
        tag = reference.rsplit(":", 1)[1] if ":" in reference.rsplit("/", 1)[-1] else "latest"
        manifest_desc["annotations"] = {"io.containerd.image.name": reference,
                                        "org.opencontainers.image.ref.name": tag}
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [manifest_desc]}
        _add(out, "index.json", json.dumps(index, sort_keys=True).encode())
        _add(out, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
    return target
