"""Which user commands start warm, and what their zygote imports first (flywheel/agent/warm_entry.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flywheel.agent.warm_entry import PythonEntry, preload_code, python_entry

PY = sys.executable


@pytest.mark.parametrize(("command", "expected"), [
    ((PY, "-u", "train.py", "--lr", "3"), PythonEntry("train.py", None, ("--lr", "3"), unbuffered=True)),
    ((PY, "train.py"), PythonEntry("train.py", None, ())),
    ((PY, "-m", "train", "-x"), PythonEntry(None, "train", ("-x",))),
    ((PY, "-u", "-m", "pkg.train"), PythonEntry(None, "pkg.train", (), unbuffered=True)),
    ((PY, "-c", "print(1)"), None),  # code on the command line: nothing to run as a file
    ((PY, "-O", "train.py"), None),  # interpreter options the zygote did not start with
    (("/usr/bin/python2", "train.py"), None),  # another interpreter
    (("bash", "-c", "python train.py"), None),  # another program
    ((PY, "-m"), None),
    ((), None),
])
def test_only_this_interpreter_running_a_script_or_module_starts_warm(command, expected):
    assert python_entry(command) == expected


def test_the_zygote_imports_the_entrys_third_party_imports_not_its_own_code(tmp_path: Path):
    (tmp_path / "helpers.py").write_text("RANK = __import__('os').environ['RANK']\n")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "train.py").write_text(
        "from __future__ import annotations\n"
        "import os, json\n"
        "import email.mime.text as text\n"
        "from collections import OrderedDict\n"
        "try:\n    import tomllib\nexcept ImportError:\n    tomllib = None\n"
        "import helpers\n"  # the script's own module: it may read the rank's env at import
        "from mypkg import thing\n"
        "from . import sibling\n"
        "def main():\n    import csv\n"  # runs only when called: not preloaded
        "if __name__ == '__main__':\n    import argparse\n")
    code = preload_code(PythonEntry("train.py", None, ()), str(tmp_path))
    assert code.splitlines() == ["import os, json", "import email.mime.text as text",
                                 "from collections import OrderedDict", "import tomllib"]


def test_an_entry_that_cannot_be_read_preloads_nothing(tmp_path: Path):
    (tmp_path / "broken.py").write_text("import os\ndef (:\n")
    assert preload_code(PythonEntry("broken.py", None, ()), str(tmp_path)) == ""
    assert preload_code(PythonEntry("missing.py", None, ()), str(tmp_path)) == ""
    # A module in a package is found only by importing the package: left to the rank.
    assert preload_code(PythonEntry(None, "pkg.train", ()), str(tmp_path)) == ""


def test_a_top_level_module_entry_preloads_its_imports(tmp_path: Path):
    (tmp_path / "trainmod.py").write_text("import json\nimport trainmod_helpers\n")
    (tmp_path / "trainmod_helpers.py").write_text("")
    assert preload_code(PythonEntry(None, "trainmod", ()), str(tmp_path)) == "import json"
