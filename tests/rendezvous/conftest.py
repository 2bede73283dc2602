from .etcd_server import etcd_server  # noqa: F401  (the fixture, reusable from other folders)
