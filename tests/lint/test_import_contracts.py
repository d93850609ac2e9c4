"""The import-linter contracts in pyproject.toml (run by `make lint`) hold on the tree, and fail when a
layer imports upward: checked on a copy of the sources with one violating import added."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
LINT = [str(Path(sys.executable).with_name("lint-imports")), "--config", "pyproject.toml", "--no-cache"]


def sources_copy(root: Path) -> Path:
    """The Python sources of `omnistage` and `tests` (what the contracts read), and pyproject.toml."""
    only_python = shutil.ignore_patterns("__pycache__", "*.pyc", "assets", "build", "reference*")
    for package in ("omnistage", "tests"):
        shutil.copytree(REPO / package, root / package, ignore=only_python)
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(LINT, cwd=root, env={"PYTHONPATH": str(root)}, capture_output=True, text=True)


def test_the_tree_keeps_every_contract() -> None:
    done = subprocess.run(LINT, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


def test_an_engine_that_imports_serving_breaks_the_layers(tmp_path: Path) -> None:
    root = sources_copy(tmp_path)
    assert lint(root).returncode == 0
    engine = root / "omnistage" / "stages" / "base.py"
    late_import = "\n\ndef _late() -> None:\n    from omnistage.serving import app  # noqa\n"
    engine.write_text(engine.read_text() + late_import)
    done = lint(root)
    assert done.returncode == 1
    assert "omnistage.stages is not allowed to import omnistage.serving" in done.stdout
    assert "omnistage.stages.base -> omnistage.serving.app" in done.stdout  # found inside a function too
