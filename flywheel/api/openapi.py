"""The committed OpenAPI document (docs/api/openapi.json); a test fails when it drifts from the app.
Regenerate with `python -m flywheel.api.openapi`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flywheel.api.app import create_app

DEFAULT_PATH = Path("docs") / "api" / "openapi.json"


def render_openapi() -> str:
    return json.dumps(create_app().openapi(), indent=2, sort_keys=True) + "\n"


def write_openapi(path: str | Path = DEFAULT_PATH) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_openapi())
    return path


if __name__ == "__main__":
    print(f"wrote {write_openapi(*sys.argv[1:2])}")
