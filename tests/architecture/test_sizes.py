"""The house stays easy to pick up (CONTRIBUTING.md): no product module over 500 lines
(migrations aside: split one by concern, as core/db/ and delivery/services/ are), and
bench/README.md short enough to read through (the notebook of runs is bench/HISTORY.md)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("core", "tenants", "timer", "outbox", "execution", "orchestration", "delivery", "schedules", "workers")
MODULE_LINES = 500
BENCH_README_LINES = 300


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_product_module_is_over_500_lines():
    modules = [path for app in (*APPS, "eventservice") for path in (ROOT / app).rglob("*.py")]
    assert len(modules) > 100
    too_long = {
        str(path.relative_to(ROOT)): _lines(path)
        for path in modules
        if "migrations" not in path.parts and _lines(path) > MODULE_LINES
    }
    assert not too_long, too_long


def test_the_bench_readme_stays_a_readme():
    assert _lines(ROOT / "bench" / "README.md") <= BENCH_README_LINES
