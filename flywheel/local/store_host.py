"""The c10d rendezvous store `flywheel run` hosts for its workers' agents, started beside them rather than before.

The store is a torch TCPStore, and importing torch for it took the CLI 1-2 s (more on a loaded machine) before any
worker could start. The listening socket is bound here at once, so its port goes into the workers' environment
straight away, and a background thread imports torch and serves the store on that socket (TCPStore's
`master_listen_fd`); an agent that connects sooner waits in the socket's backlog until the store accepts it. The
workers' own start-up (their agents import torch too) then overlaps the CLI's import instead of following it.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

HOST = "127.0.0.1"


class StoreHost:
    """A listening socket now, the store on it from a background thread; `store()` waits for it."""

    def __init__(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((HOST, 0))
        listener.listen(1024)  # agents that connect before the store is up wait here
        self.port: int = listener.getsockname()[1]
        self._store: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, args=(listener,), name="rendezvous-store", daemon=True)
        self._thread.start()

    def _serve(self, listener: socket.socket) -> None:
        try:
            import torch.distributed as dist  # the slow part: off the CLI's path to its first worker

            # TCPStore, which torch.distributed re-exports without declaring it, takes over the socket (detach: its
            # descriptor is closed once, by the store). multi_tenant: agents share it; they connect with is_host=False.
            self._store = getattr(dist, "TCPStore")(HOST, self.port, is_master=True, wait_for_workers=False,
                                                    multi_tenant=True, master_listen_fd=listener.detach())
        except BaseException as err:  # noqa: BLE001 - handed to whoever needs the store
            listener.close()
            self._error = err

    def store(self) -> Any:
        """The TCPStore, once it serves (it raises what hosting it raised)."""
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"cannot host the rendezvous store on {HOST}:{self.port}: {self._error}"
                               ) from self._error
        return self._store

    def close(self) -> None:
        """Stops serving once the store is up (dropping the last reference closes its socket)."""
        self._thread.join()
        self._store = None
