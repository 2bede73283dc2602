"""etcd v3 rendezvous for torch elastic: the backend (backend.py), the store (store.py), the handler (handler.py,
whose import registers the `etcd-v3` handler with torch's registry, so `PET_RDZV_BACKEND=etcd-v3` is all a launch
needs), the state watch, a lost agent's expiry (expiry.py, which the operator and the local runner use) and early
regrouping (regroup.py). The torch-free pieces (session, key layout, worker liveness) live in `flywheel.etcd`.
Importing this package imports nothing: the executors read expiry.py without torch elastic's handler."""
