"""The package is typed (``py.typed``): mypy finds every function annotated and no type error, with
torch present or not (pyproject.toml's [tool.mypy] settings; the generated stubs are left out)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]


def test_mypy_passes_on_the_package():
    pytest.importorskip("mypy", reason="mypy is in requirements-dev.txt")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "vserve_client"],
        cwd=PKG,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-4000:]


def test_the_package_ships_its_marker():
    import vserve_client

    assert (Path(vserve_client.__file__).parent / "py.typed").exists()
