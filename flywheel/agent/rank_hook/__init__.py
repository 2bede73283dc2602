"""Put on a user command's PYTHONPATH by `flywheel launch` (see sitecustomize.py); never imported by Flywheel."""
