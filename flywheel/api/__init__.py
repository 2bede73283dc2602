"""The REST status API (FastAPI): `flywheel.api.app:app`; see docs/api.md."""
