"""Wait for rank 0's store before joining the process group.

Under `env://` rank 0 hosts the TCPStore the group forms through, and every other rank connects to it. A rank that
starts before rank 0 listens is refused and torch's client backs off before it tries again: 0.2-0.3 s for two local
ranks started 80 ms apart, ~0.5 s for four on a loaded machine, on every restart (the ranks of a restarted group
start within a few hundred ms of each other, in any order). Probing the port every few milliseconds first lets
`init_process_group` connect on its first try; the probe sends nothing and the store drops it.

Not needed where the agent hosts the store (TORCHELASTIC_USE_AGENT_STORE): it listens before any rank starts.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)

PROBE_INTERVAL_SECONDS = 0.005


def store_host(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """Where rank 0's store listens, for a rank that must connect to it; None when there is nothing to wait for
    (rank 0 itself, the agent's store, no env:// rendezvous)."""
    if environ.get("RANK", "0") == "0" or environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return None
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT", "")
    if not addr or not port.isdigit():
        return None
    return addr, int(port)


def wait_for_store(environ: Mapping[str, str], timeout_s: float) -> float:
    """Until rank 0's store accepts a connection, at most `timeout_s` (then init_process_group reports what it
    finds, as it would have). Returns the seconds waited."""
    host = store_host(environ)
    began = time.monotonic()
    if host is None:
        return 0.0
    deadline = began + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(host, timeout=max(0.05, min(1.0, deadline - time.monotonic()))):
                return time.monotonic() - began
        except OSError:  # refused (not listening yet), or the name not resolvable yet: try again shortly
            time.sleep(PROBE_INTERVAL_SECONDS)
    log.warning("rank 0's store at %s:%d did not accept a connection within %.0f s", *host, timeout_s)
    return time.monotonic() - began
