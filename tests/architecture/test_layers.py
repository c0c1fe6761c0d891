"""The layers of docs/architecture.md hold, and the import-linter contract that guards them
fails on a back-edge (it is run by scripts/test too)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _contract_packages() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["root_packages"]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy_project(to: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", to / "pyproject.toml")
    for package in _contract_packages():
        shutil.copytree(ROOT / package, to / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def test_every_app_is_in_the_contract():
    apps = {path.parent.name for path in ROOT.glob("*/apps.py")}
    assert apps <= set(_contract_packages()), (
        f"apps missing from the layers contract: {apps - set(_contract_packages())}"
    )


def test_the_layers_contract_holds():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_contract_fails_on_a_back_edge(tmp_path):
    _copy_project(tmp_path)
    # A function-level import counts as much as a module-level one.
    (tmp_path / "core" / "backedge.py").write_text("def f():\n    from orchestration import services\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "core.backedge -> orchestration.services" in result.stdout


def test_the_contract_fails_when_two_leaf_apps_import_each_other(tmp_path):
    _copy_project(tmp_path)
    (tmp_path / "timer" / "sideways.py").write_text("import outbox.models\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "timer.sideways -> outbox.models" in result.stdout


def test_the_contract_covers_the_modules_of_a_package(tmp_path):
    _copy_project(tmp_path)
    # core.db and orchestration.services are packages: their modules are held to the layers too.
    (tmp_path / "core" / "db" / "backedge.py").write_text(
        "from orchestration.services.submit import service_call_submit\n"
    )

    result = _lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "core.db.backedge -> orchestration.services.submit" in result.stdout


def test_the_contract_fails_when_orchestration_and_delivery_import_each_other(tmp_path):
    _copy_project(tmp_path)
    # A call with its deliveries is the edge's (eventservice.representation), not orchestration's.
    (tmp_path / "orchestration" / "deliveries.py").write_text("import delivery.selectors\n")
    (tmp_path / "delivery" / "calls.py").write_text("import orchestration.selectors\n")

    result = _lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "orchestration.deliveries -> delivery.selectors" in result.stdout
    assert "delivery.calls -> orchestration.selectors" in result.stdout
