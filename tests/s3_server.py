"""An S3-compatible server for the object-store tests: moto's server mode (PyPI `moto[server]`), on a free port in
this process. Clients reach it exactly as they would reach S3: s3fs with the standard AWS_* environment."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """Yields the environment a client needs (credentials, endpoint, region)."""
    moto_server = pytest.importorskip("moto.server", reason="the object-store tests need moto[server]")
    pytest.importorskip("s3fs", reason="the object-store tests need s3fs")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_REGION": "us-east-1"}
    finally:
        server.stop()


def use_server(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, bucket: str) -> None:
    """Point this process's clients at the server (s3fs caches clients per arguments: start fresh) and create
    `bucket`."""
    import s3fs

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if not fs.exists(bucket):
        fs.mkdir(bucket)
