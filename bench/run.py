"""Service Agent benchmarks (targets: bench/README.md), beside django-q2 and Celery in the same run.

    python bench/run.py [--quick] [--only lateness,drain,capacity,submission,flow,neighbour,list] [--big] [--keep]
                        [--database sqlite|postgres]

Sets itself up in a fresh temporary DATA_DIR (SQLite, or with --database postgres a scratch
PostgreSQL database at BENCH_POSTGRES_URL, dropped at the end), starts a local HTTP target,
then each system in turn (the agent's `manage.py qcluster`, a Celery worker on Redis, a stock
django-q2 cluster), one at a time, and prints one table. The agent's drain also delivers its
events to two webhook receivers (bench/receiver.py) and, when it answers at BENCH_NATS_URL,
NATS JetStream; on PostgreSQL the drain runs again with two clusters. The POST benchmark is
read against a floor view (bench/floor.py) loaded the same way. Results also go to
bench/results/. See bench/README.md for how to read them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import agent, capacity, flow, neighbour, peers, submission  # noqa: E402
from bench.common import (  # noqa: E402
    NATS_URL,
    PYTHON,
    ROOT,
    Child,
    Children,
    Profiler,
    agent_env,
    cpu_seconds,
    group_pids,
    log,
    pid_holding,
)
from bench.database import ScratchPostgres  # noqa: E402

METRICS = ("lateness", "drain", "capacity", "submission", "flow", "neighbour", "list")
DATABASES = ("sqlite", "postgres")
# The POST target against its floor (bench/floor.py), both measured in the same run.
POST_FLOOR_SHARE = 0.60
POST_RATE = 300
POST_RATE_FLOOR_ABOVE = 500
# The Celery worker's processes for the same work as the agent's burst (bench/peer_work.py).
SAME_WORK_CONCURRENCY = 8
# The burst against the better of Celery's two same-work designs: its rate at least this many
# times theirs, its CPU per call at most this share of theirs.
SAME_WORK_RATE = 1.5
SAME_WORK_CPU = 0.8

FULL = {
    "lateness": 1000,
    "lateness_lead": 3.0,
    "lateness_spread": 10.0,
    "celery_lateness": 1000,
    "djq_lateness": 100,
    "djq_wait": 75.0,
    "drain": 2000,
    "drain_lead": 5.0,
    "steady": 200,
    "steady_spread": 10.0,
    "celery_drain": 2000,
    "djq_drain": 500,
    "bare": 2000,
    "submit": 3000,
    "submit_threads": 16,
    "wrk_seconds": 10,
    "list_calls": 200_000,
    "list_tenants": 100,
    "list_queries": 500,
    "flow_calls": 300,
    "flow_backlog": 1000,
    "flow_spread": 5.0,
    "neighbour_calls": 100,
    "neighbour_spread": 4.0,
    "idle_seconds": 10.0,
    "capacity_seconds": 60.0,
    "capacity_rates": capacity.RATES,
}
QUICK = {
    **FULL,
    "lateness": 200,
    "lateness_lead": 2.0,
    "lateness_spread": 3.0,
    "celery_lateness": 200,
    "djq_lateness": 0,
    "drain": 300,
    "drain_lead": 2.0,
    "steady": 60,
    "steady_spread": 3.0,
    "celery_drain": 300,
    "djq_drain": 100,
    "bare": 300,
    "submit": 300,
    "submit_threads": 8,
    "wrk_seconds": 3,
    "list_calls": 10_000,
    "list_tenants": 20,
    "list_queries": 50,
    "flow_calls": 100,
    "flow_backlog": 300,
    "flow_spread": 3.0,
    "neighbour_calls": 40,
    "idle_seconds": 3.0,
    "neighbour_spread": 3.0,
    "capacity_seconds": 5.0,
    "capacity_rates": capacity.QUICK_RATES,
}
BIG = {"list_calls": 1_000_000}


class Interrupted(Exception):
    pass


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()),
        "nice": os.nice(0),
    }


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sizes = {**(QUICK if args.quick else FULL), **(BIG if args.big else {})}
        self.only = set(args.only)
        self.data_dir = Path(tempfile.mkdtemp(prefix="bench-run-"))
        self.children = Children(log_dir=self.data_dir)
        self.postgres = ScratchPostgres() if args.database == "postgres" else None
        extra = {"DATABASE_URL": self.postgres.url} if self.postgres is not None else {}
        self.env = agent_env(self.data_dir, **extra)
        self.results: dict[str, Any] = {
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "mode": "quick" if args.quick else ("big" if args.big else "default"),
            "database": {"engine": args.database},
            "only": sorted(self.only),
            "sizes": self.sizes,
            "machine": machine(),
            "agent": {},
            "djq": {},
            "celery": {},
            "capacity": {},
            "bare": {},
            "floor": {},
            "list": {},
            "skipped": {},
            "errors": {},
        }
        self.target_url = ""
        self.stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.used_redis = False
        self.delivery: agent.Delivery | None = None

    # -- phases -----------------------------------------------------------------------------
    def phase(self, name: str, body: Callable[[], None]) -> None:
        """Run one phase; a failure is recorded and the other phases still run."""
        try:
            body()
        except (Interrupted, KeyboardInterrupt):
            raise
        except Exception as exc:
            log(f"{name} failed: {type(exc).__name__}: {exc}")
            self.results["errors"][name] = "".join(traceback.format_exception(exc))[-4000:]

    def setup(self) -> None:
        if self.postgres is not None:
            self.postgres.create()
            self.results["database"].update(name=self.postgres.name, server_version=self.postgres.server_version)
            log(f"data dir {self.data_dir}; migrating the scratch PostgreSQL database {self.postgres.name}")
        else:
            log(f"data dir {self.data_dir}; migrating a fresh SQLite database")
        subprocess.run([PYTHON, "manage.py", "migrate", "-v0"], cwd=ROOT, env=self.env, check=True, timeout=300)
        os.environ.update(self.env)
        import django

        django.setup()
        if self.postgres is not None:
            # The new tables analysed now, not by autovacuum during the idle figures, whose
            # transactions the database would count as the cluster's.
            self.postgres.vacuum_analyze()
        target = self.children.start(
            "target", [PYTHON, str(ROOT / "bench" / "target.py")], env=self.env, stdout_pipe=True
        )
        port = int(target.proc.stdout.readline().strip())
        self.target_url = f"http://127.0.0.1:{port}/ok"
        log(f"target on {self.target_url}")

    def bare(self) -> None:
        n = self.sizes["bare"]
        log(f"bare requests: {n} GETs from one requests.Session")
        self.results["bare"]["drain"] = agent.bare_requests(url=self.target_url, count=n)

    @contextmanager
    def profiled(self, name: str, *clusters: Child) -> Iterator[None]:
        """CPU time of the agent's worker processes (of every cluster given) during one phase;
        with --py-spy, the stacks of the first cluster's timer home and events home (collapsed,
        one line per stack) in bench/results/."""
        pids = [pid for cluster in clusters for pid in group_pids(cluster.proc.pid)]
        cpu_before = cpu_seconds(pids)
        profilers = []
        if self.args.py_spy:
            py_spy = shutil.which("py-spy", path=str(Path(PYTHON).parent)) or shutil.which("py-spy")
            # The timer home (engine lock) and the events home (events lock) of the first cluster.
            for role in ("engine", "events"):
                pid = pid_holding(clusters[0].proc.pid, str(self.data_dir / f"{role}-"))
                if pid and py_spy:
                    out = ROOT / "bench" / "results" / f"{self.stamp}-{name}-{role}.folded.txt"
                    out.parent.mkdir(exist_ok=True)
                    profilers.append(Profiler(pid, out, seconds=600, executable=py_spy))
                    self.results.setdefault("profiles", {})[f"{name}-{role}"] = str(out.relative_to(ROOT))
                else:
                    log(f"--py-spy: no {role} profile for {name} (pid {pid}, py-spy {py_spy})")
        try:
            yield
        finally:
            for profiler in profilers:
                profiler.stop()
            self.results["agent"].setdefault("cpu_seconds", {})[name] = cpu_seconds(pids) - cpu_before
            # A worker process replaced during the window (django-q2 respawns one that died) takes
            # its CPU time along, and its replacement's is not counted: the figure is too low.
            now = {pid for cluster in clusters for pid in group_pids(cluster.proc.pid)}
            if set(pids) != now:
                gone, new = sorted(set(pids) - now), sorted(now - set(pids))
                log(f"{name}: worker processes changed during the window (gone {gone}, new {new})")
                self.results["agent"].setdefault("replaced_processes", {})[name] = {"gone": gone, "new": new}

    def agent_phase(self) -> None:
        try:
            env = self.env
            if self.only & {"drain", "capacity"} and not self.args.no_delivery:
                # The drain's and the capacity steps' events go to two webhook receivers and, when
                # it answers, NATS.
                self.delivery = agent.Delivery(self.children, self.env, NATS_URL)
                env = {**self.env, **self.delivery.start()}
            self.agent_workers(env)
        finally:
            if self.delivery is not None:
                if self.delivery.nats_skipped:
                    self.results["skipped"]["nats"] = self.delivery.nats_skipped
                self.delivery.close()

    def agent_workers(self, env: dict[str, str]) -> None:
        s = self.sizes
        workers = agent.start_workers(self.children, env)
        try:
            self.results["agent"]["idle"] = agent.idle_figures(workers, seconds=s["idle_seconds"])
            if "lateness" in self.only:
                self.results["agent"]["lateness"] = agent.lateness(
                    url=self.target_url,
                    count=s["lateness"],
                    lead=s["lateness_lead"],
                    spread=s["lateness_spread"],
                    window=lambda: self.profiled("lateness", workers),
                )
            if "drain" in self.only and self.delivery is not None:
                self.phase("steady", self.steady_delivery)
            if "drain" in self.only:
                self.results["agent"]["drain"] = agent.drain(
                    url=self.target_url,
                    count=s["drain"],
                    lead=s["drain_lead"],
                    window=lambda: self.profiled("drain", workers),
                    delivery=self.delivery,
                )
                if self.delivery is not None:
                    self.phase("drain_plain", lambda: self.drain_without_subscribers(workers))
                if self.postgres is not None:
                    self.phase("drain_two", lambda: self.drain_two_clusters(workers, env))
            if "submission" in self.only:
                with self.profiled("submission", workers):
                    self.phase("submission", self.submission_phase)
            if "flow" in self.only:
                self.results["agent"]["flow"] = flow.flow_isolation(
                    url=self.target_url,
                    count=s["flow_calls"],
                    backlog=s["flow_backlog"],
                    spread=s["flow_spread"],
                    lead=s["lateness_lead"],
                )
            if "capacity" in self.only:  # after the phases whose figures its load would sway
                with self.profiled("capacity", workers):
                    self.phase("capacity", self.agent_capacity)
            if "neighbour" in self.only:  # last: its neighbour's slow calls stay out for 20 s
                self.results["agent"]["neighbour"] = neighbour.noisy_neighbour(
                    children=self.children,
                    env=self.env,
                    url=self.target_url,
                    count=s["neighbour_calls"],
                    spread=s["neighbour_spread"],
                )
        finally:
            self.children.stop(workers)

    def agent_capacity(self) -> None:
        """The agent's calls at rising steady rates (bench/capacity.py), each with its deliveries."""
        if self.delivery is None:
            self.results["skipped"]["capacity"] = "--no-delivery: each capacity step delivers its calls' events"
            return
        s = self.sizes
        self.results["capacity"]["agent"] = capacity.sweep(
            "agent",
            lambda rate: capacity.agent_step(
                rate, seconds=s["capacity_seconds"], url=self.target_url, delivery=self.delivery
            ),
            s["capacity_rates"],
        )

    def steady_delivery(self) -> None:
        """Before the burst: the drain's subscribers receive the events of calls due at an even
        pace (an ordinary day's load), for another tenant."""
        self.results["agent"]["steady"] = agent.steady(
            url=self.target_url,
            count=self.sizes["steady"],
            spread=self.sizes["steady_spread"],
            lead=self.sizes["drain_lead"],
            delivery=self.delivery,
        )

    def drain_without_subscribers(self, workers: Child) -> None:
        """The same drain for a tenant nobody subscribes to: the calls' own cost and rate, as
        the drain was measured before it delivered events (the targets' reference)."""
        self.results["agent"]["drain_plain"] = agent.drain(
            url=self.target_url,
            count=self.sizes["drain"],
            lead=self.sizes["drain_lead"],
            window=lambda: self.profiled("drain_plain", workers),
            tenant=agent.DRAIN_TENANT + "-plain",
        )

    def drain_two_clusters(self, first: Child, env: dict[str, str]) -> None:
        """The same drain, another tenant, with a second `manage.py qcluster` (Q_WORKERS=2 as
        the first) on the same database: both clusters' engines take the burst."""
        second = agent.start_workers(self.children, env, name="agent-qcluster-2")
        try:
            self.results["agent"]["drain_two"] = agent.drain(
                url=self.target_url,
                count=self.sizes["drain"],
                lead=self.sizes["drain_lead"],
                window=lambda: self.profiled("drain_two", first, second),
                delivery=self.delivery,
                tenant=agent.DRAIN_TENANT + "-two",
            )
        finally:
            self.children.stop(second)

    def submission_phase(self) -> None:
        """The product's POST and the floor view's (bench/floor.py), each under its own gunicorn
        with the same command line, loaded by the same clients; interleaved per client, and the
        product's events published before the next measurement starts."""
        from bench import floor

        s = self.sizes
        floor.create_table()
        web, port = submission.start_web(self.children, self.env)
        floor_web, floor_port = submission.start_web(
            self.children, self.env, name="gunicorn-floor", settings=submission.FLOOR_SETTINGS
        )
        try:
            key = submission.api_key()

            servers = {port: web, floor_port: floor_web}

            def python_client(port: int, path: str) -> dict:
                with submission.split_watched(servers[port], port) as split:
                    result = submission.python_client(
                        port=port,
                        key=key,
                        target=self.target_url,
                        total=s["submit"],
                        threads=s["submit_threads"],
                        env=self.env,
                        path=path,
                    )
                return {**result, "connections_per_worker": split}

            def wrk_client(port: int, path: str) -> dict | None:
                with submission.split_watched(servers[port], port) as split:
                    result = submission.wrk_client(
                        port=port,
                        key=key,
                        target=self.target_url,
                        seconds=s["wrk_seconds"],
                        connections=s["submit_threads"],
                        path=path,
                    )
                return None if result is None else {**result, "connections_per_worker": split}

            before = submission.accepted_rows()
            result = python_client(port, submission.API_PATH)
            result["rows_stored"] = submission.accepted_rows() - before
            self.results["agent"]["submission"] = result
            agent._wait_published(submission.SUBMIT_TENANT, timeout=30)
            before = floor.rows(submission.SUBMIT_TENANT)
            result = python_client(floor_port, submission.FLOOR_PATH)
            result["rows_stored"] = floor.rows(submission.SUBMIT_TENANT) - before
            self.results["floor"]["submission"] = result
            wrk = wrk_client(port, submission.API_PATH)
            if wrk is None:
                self.results["skipped"]["submission_wrk"] = "wrk is not installed (apt-get install wrk)"
                return
            self.results["agent"]["submission_wrk"] = wrk
            agent._wait_published(submission.SUBMIT_TENANT, timeout=30)
            self.results["floor"]["submission_wrk"] = wrk_client(floor_port, submission.FLOOR_PATH)
        finally:
            self.children.stop(floor_web)
            self.children.stop(web)

    def celery_phase(self) -> None:
        s = self.sizes
        reason = peers.redis_unreachable_reason()
        if reason:
            log(f"Celery skipped: {reason}")
            self.results["skipped"]["celery"] = reason
            return
        self.used_redis = True
        worker = peers.start_celery(self.children, self.env)
        try:
            if "drain" in self.only:
                self.results["celery"]["drain"] = peers.celery_drain(count=s["celery_drain"])
            if "lateness" in self.only:
                self.results["celery"]["lateness"] = peers.celery_lateness(
                    count=s["celery_lateness"], lead=s["lateness_lead"], spread=s["lateness_spread"]
                )
        finally:
            self.children.stop(worker)
            peers.celery_reset()
        if "drain" in self.only and not self.args.no_delivery:
            self.phase("celery_same_work", self.celery_same_work)
        if "capacity" in self.only and not self.args.no_delivery:
            self.phase("celery_capacity", self.celery_capacity)

    def celery_capacity(self) -> None:
        """Celery's two same-work designs at the agent's rising rates (bench/capacity.py), each
        design on a worker of its own, each rate with receivers and a stream of its own."""
        s = self.sizes

        def step(rate: int, inline: bool) -> dict:
            delivery = agent.Delivery(self.children, self.env, NATS_URL)
            try:
                delivery.start_receivers()
                delivery.make_stream()
                return capacity.celery_step(
                    rate, seconds=s["capacity_seconds"], url=self.target_url, delivery=delivery, inline=inline
                )
            finally:
                delivery.close()

        for key, inline in (("celery_tasks", False), ("celery_inline", True)):
            worker = peers.start_celery(self.children, self.env, concurrency=SAME_WORK_CONCURRENCY)
            try:
                self.results["capacity"][key] = capacity.sweep(
                    key, lambda rate, inline=inline: step(rate, inline), s["capacity_rates"]
                )
            finally:
                self.children.stop(worker)
                peers.celery_reset()  # an ETA task a failed rate left behind runs in no later step

    def celery_same_work(self) -> None:
        """Celery doing the burst's work (bench/peer_work.py), with a task per delivery and with
        the deliveries inline; each its own receivers and stream. Its worker has
        SAME_WORK_CONCURRENCY processes, as a Celery user would give tasks that mostly wait on the
        network (the no-op peer has one per core)."""
        worker = peers.start_celery(self.children, self.env, concurrency=SAME_WORK_CONCURRENCY)
        try:
            for key, inline in (("same_work", False), ("same_work_inline", True)):
                delivery = agent.Delivery(self.children, self.env, NATS_URL)
                try:
                    delivery.start_receivers()
                    delivery.make_stream()
                    result = peers.celery_same_work(
                        count=self.sizes["drain"],  # the agent's burst
                        url=self.target_url,
                        delivery=delivery,
                        worker=worker,
                        inline=inline,
                    )
                    self.results["celery"][key] = {**result, "concurrency": SAME_WORK_CONCURRENCY}
                finally:
                    delivery.close()
        finally:
            self.children.stop(worker)
            peers.celery_reset()

    def djq_phase(self) -> None:
        s = self.sizes
        cluster = peers.start_djq(self.children, self.env)
        try:
            if "drain" in self.only:
                self.results["djq"]["drain"] = peers.djq_drain(count=s["djq_drain"])
            if "lateness" in self.only:
                if s["djq_lateness"]:
                    self.results["djq"]["lateness"] = peers.djq_lateness(
                        count=s["djq_lateness"],
                        lead=s["lateness_lead"],
                        spread=s["lateness_spread"],
                        wait=s["djq_wait"],
                    )
                else:
                    self.results["skipped"]["djq_lateness"] = "skipped in --quick (its scheduler wakes every ~30 s)"
        finally:
            self.children.stop(cluster)

    def list_phase(self) -> None:
        s = self.sizes
        log(f"list: bench/list_query.py --calls {s['list_calls']} --tenants {s['list_tenants']}")
        done = subprocess.run(
            [
                PYTHON,
                str(ROOT / "bench" / "list_query.py"),
                "--calls",
                str(s["list_calls"]),
                "--tenants",
                str(s["list_tenants"]),
                "--queries",
                str(s["list_queries"]),
            ],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"list_query.py failed:\n{done.stderr[-3000:]}")
        self.results["list"] = json.loads(done.stdout.strip().splitlines()[-1])

    def execute(self) -> None:
        self.setup()
        if "drain" in self.only:
            self.phase("bare", self.bare)
        if self.only & {"lateness", "drain", "capacity", "submission", "flow", "neighbour"}:
            self.phase("agent", self.agent_phase)
        if self.only & {"lateness", "drain", "capacity"} and not self.args.skip_peers:
            self.phase("celery", self.celery_phase)
            self.phase("django-q2", self.djq_phase)
        if "list" in self.only:
            if self.postgres is not None:
                self.results["skipped"]["list"] = (
                    "the list benchmark is SQLite-specific (its own scratch SQLite database, "
                    "EXPLAIN QUERY PLAN); not run with --database postgres"
                )
            else:
                self.phase("list", self.list_phase)

    def close(self) -> None:
        if self.delivery is not None:
            self.delivery.close()  # the NATS stream, if an interruption left it
        self.children.stop_all()
        if self.postgres is not None:
            self.postgres.drop()
        if self.used_redis:
            try:
                peers.celery_reset()
            except Exception:
                pass
        if self.args.keep:
            log(f"kept {self.data_dir}")
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)


# --- the table --------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def get(data: dict, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def verdict(ok: bool | None, text: str) -> str:
    if ok is None:
        return f"{text} (not measured)"
    return f"{text}: {'met' if ok else 'MISSED'}"


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def post_verdict(rate: float | None, floor_rate: float | None) -> str:
    """POST service-calls: ≥ 60 % of the floor's rate in the same run with the same client, and
    ≥ 300 req/s where the floor is above 500 req/s."""
    share = f"≥ {POST_FLOOR_SHARE * 100:.0f} % of floor"
    if rate is None or floor_rate is None:
        return verdict(None, share)
    if floor_rate > POST_RATE_FLOOR_ABOVE:
        ok = rate >= POST_FLOOR_SHARE * floor_rate and rate >= POST_RATE
        return verdict(ok, f"{share} and ≥ {POST_RATE}/s (floor > {POST_RATE_FLOOR_ABOVE}/s)")
    return verdict(rate >= POST_FLOOR_SHARE * floor_rate, f"{share} (floor ≤ {POST_RATE_FLOOR_ABOVE}/s)")


def _p50_p99(summary: dict) -> str:
    return f"{fmt(summary.get('p50'))} / {fmt(summary.get('p99'))}"


def rows(results: dict) -> list[tuple[str, str, str, str, str, str]]:
    a, q, c, b, lst = results["agent"], results["djq"], results["celery"], results["bare"], results["list"]
    fl = results.get("floor") or {}
    table = []

    def add(
        metric: str,
        agent_value: Any = None,
        djq: Any = None,
        celery: Any = None,
        bare: Any = None,
        target: str = "",
        digits: int = 1,
    ) -> None:
        table.append(
            (metric, fmt(agent_value, digits), fmt(djq, digits), fmt(celery, digits), fmt(bare, digits), target)
        )

    cpu = a.get("cpu_seconds") or {}
    idle = a.get("idle") or {}
    if idle:
        add(
            "agent workers' CPU while idle (% of one core)",
            idle["cpu_percent"],
            target=verdict(idle["cpu_percent"] <= 1, "≤ 1 %"),
            digits=2,
        )
    if idle.get("transactions_per_second") is not None:
        add(
            "idle cluster: database transactions per second",
            idle["transactions_per_second"],
            target=verdict(idle["transactions_per_second"] <= 5, "≤ 5"),
        )
        add("idle cluster: connections open", idle["connections"], digits=0)
    if a.get("lateness") or q.get("lateness") or c.get("lateness"):
        add(
            "timers measured (n)",
            get(a, "lateness", "lateness_ms", "n"),
            get(q, "lateness", "lateness_ms", "n"),
            get(c, "lateness", "lateness_ms", "n"),
        )
        for stat, limit in (("p50", 10), ("p95", None), ("p99", 50), ("max", None)):
            value = get(a, "lateness", "lateness_ms", stat)
            target = ""
            if limit is not None:
                target = verdict(None if value is None else value <= limit, f"≤ {limit} ms")
            celery_p99 = get(c, "lateness", "lateness_ms", "p99")
            if stat == "p99" and celery_p99 is not None:
                # The relative target: within twice Celery's in-memory ETA, measured in the same run.
                ok = None if value is None else value <= limit and value <= 2 * celery_p99
                target = verdict(ok, f"≤ {limit} ms and ≤ 2× Celery ({2 * celery_p99:.1f} ms)")
            add(
                f"timer lateness {stat} (ms)",
                value,
                get(q, "lateness", "lateness_ms", stat),
                get(c, "lateness", "lateness_ms", stat),
                None,
                target,
            )
        if "lateness" in cpu and a.get("lateness"):
            add("agent workers' CPU per timer call (ms)", cpu["lateness"] * 1000 / a["lateness"]["calls"], digits=2)
    if a.get("drain") or q.get("drain") or c.get("drain") or b.get("drain"):
        celery_rate = get(c, "drain", "rate")
        rate = get(a, "drain", "rate_terminal")
        full = get(a, "drain", "rate_bookkeeping")

        def versus(value: float | None) -> str:
            if celery_rate is None:
                return "≥ Celery (not measured)"
            return verdict(None if value is None else value >= celery_rate, f"≥ Celery ({celery_rate:,.0f}/s)")

        add(
            "drain: jobs (n)",
            get(a, "drain", "calls"),
            get(q, "drain", "tasks"),
            get(c, "drain", "tasks"),
            get(b, "drain", "requests"),
        )
        # With subscribers the burst does far more than Celery's no-op tasks: a yardstick, no verdict
        # (the same-work rows below carry the targets).
        add(
            "drain rate, all terminal (/s)",
            rate,
            get(q, "drain", "rate"),
            celery_rate,
            get(b, "drain", "rate"),
            digits=0,
        )
        add("drain rate, bookkeeping done (/s)", full, digits=0)
        add("drain: last start after due (s)", get(a, "drain", "last_start_after_due_s"), digits=2)
        add(
            "drain: all terminal after due (s)",
            get(a, "drain", "terminal_after_due_s"),
            get(q, "drain", "seconds"),
            get(c, "drain", "seconds"),
            get(b, "drain", "seconds"),
            digits=2,
        )
        add("drain: all events published after due (s)", get(a, "drain", "bookkeeping_after_due_s"), digits=2)
        per_call = cpu["drain"] * 1000 / a["drain"]["calls"] if "drain" in cpu and a.get("drain") else None
        per_request = get(b, "drain", "cpu_per_request_ms")
        if per_call is not None or per_request is not None:
            # Reported beside its floor; its target is the same-work ratio below.
            add("CPU per drained call (ms; bare: per request)", per_call, bare=per_request, digits=2)
        lag99 = get(a, "drain", "outbox_lag_ms", "p99")
        add("outbox lag p50 (ms)", get(a, "drain", "outbox_lag_ms", "p50"))
        add("outbox lag p99 (ms)", lag99, target=verdict(None if lag99 is None else lag99 <= 1000, "≤ 1000 ms"))
        delivery = get(a, "drain", "delivery")
        if delivery:
            add("delivery: burst events × subscribers (n)", f"{delivery['events']} × {len(delivery['subscribers'])}")
            # No verdict of its own: 2,000 calls due at one instant are no steady rate, their lag
            # is how long the whole burst takes (the same-work rows compare that); the target of
            # a 1 s lag is read at a steady rate, in the capacity row.
            for key, label in (("webhooks", "webhooks"), ("nats", "NATS")):
                p50, p99 = get(delivery, key, "lag_ms", "p50"), get(delivery, key, "lag_ms", "p99")
                measured = p99 is not None and not math.isnan(p99)
                add(f"delivery lag p50 / p99, {label} (ms)", f"{fmt(p50)} / {fmt(p99)}" if measured else None)
            add("deliveries per second, webhooks (/s)", get(delivery, "webhooks", "rate"), digits=0)
            missing = delivery["missing"]
            scope = "" if delivery.get("nats") else " (webhooks only)"
            add(
                "every event reached every subscriber",
                ("yes" if missing == 0 else f"NO ({missing:,} missing)") + scope,
                target=verdict(missing == 0, "all of them"),
            )
        steady = get(a, "steady", "delivery")
        if steady:
            pace = a["steady"]["calls"] / a["steady"]["spread_s"]
            add(
                f"steady {pace:.0f} calls/s: events × subscribers (n)",
                f"{steady['events']} × {len(steady['subscribers'])}",
            )
            for key, label in (("webhooks", "webhooks"), ("nats", "NATS")):
                p50, p99 = get(steady, key, "lag_ms", "p50"), get(steady, key, "lag_ms", "p99")
                measured = p99 is not None and not math.isnan(p99)
                add(f"steady: delivery lag p50 / p99, {label} (ms)", f"{fmt(p50)} / {fmt(p99)}" if measured else None)
            missing = steady["missing"]
            add("steady: every event reached every subscriber", "yes" if missing == 0 else f"NO ({missing:,} missing)")
        # Celery doing a drained call's network work (bench/peer_work.py), beside the agent's
        # burst; the targets against the better of its two designs follow.
        for key, how in (("same_work", "a task per delivery"), ("same_work_inline", "deliveries inline")):
            same = c.get(key)
            if not same:
                continue
            figures = same["delivery"]
            add(f"same work, Celery {how}: calls (n)", get(a, "drain", "calls"), celery=same["calls"])
            add(f"same work, Celery {how}: rate, all calls done (/s)", rate, celery=same["rate"], digits=0)
            add(f"same work, Celery {how}: CPU per call (ms)", per_call, celery=same["cpu_ms_per_call"], digits=2)
            for kind, label in (("webhooks", "webhooks"), ("nats", "NATS")):
                p50, p99 = get(delivery, kind, "lag_ms", "p50"), get(delivery, kind, "lag_ms", "p99")
                c50, c99 = get(figures, kind, "lag_ms", "p50"), get(figures, kind, "lag_ms", "p99")
                add(
                    f"same work, Celery {how}: delivery lag p50 / p99, {label} (ms)",
                    f"{fmt(p50)} / {fmt(p99)}" if p99 is not None else None,
                    celery=f"{fmt(c50)} / {fmt(c99)}" if c99 is not None else None,
                )
            add(
                f"same work, Celery {how}: first event made → last received (s)",
                get(delivery, "webhooks", "first_created_to_last_received_s"),
                celery=get(figures, "webhooks", "first_created_to_last_received_s"),
                digits=2,
            )
            lost = same["events_expected"] * len(figures["subscribers"]) - sum(
                part["received"] for part in figures["per_subscriber"].values()
            )
            add(
                f"same work, Celery {how}: every event reached every subscriber",
                celery=("yes" if same["all_delivered"] and lost == 0 else f"NO ({lost:,} missing)")
                + ("" if figures.get("nats") else " (webhooks only)"),
            )
        same_work_targets(add, rate, per_call, delivery, c)
        plain = a.get("drain_plain")
        if plain:
            rate_plain = plain.get("rate_terminal")
            add("drain without subscribers: rate all terminal (/s)", rate_plain, target=versus(rate_plain), digits=0)
            if "drain_plain" in cpu:
                per_plain = cpu["drain_plain"] * 1000 / plain["calls"]
                add("CPU per drained call without subscribers (ms)", per_plain, bare=per_request, digits=2)
            add("outbox lag p99 without subscribers (ms)", get(plain, "outbox_lag_ms", "p99"))
    two = a.get("drain_two")
    if two:
        one = a.get("drain") or {}
        add("drain, two clusters: rate all terminal (/s)", two.get("rate_terminal"), digits=0)
        add("drain, two clusters: rate bookkeeping done (/s)", two.get("rate_bookkeeping"), digits=0)
        add("drain, two clusters: last start after due (s)", two.get("last_start_after_due_s"), digits=2)
        up_terminal = ratio(two.get("rate_terminal"), one.get("rate_terminal"))
        up_bookkeeping = ratio(two.get("rate_bookkeeping"), one.get("rate_bookkeeping"))
        add(
            "drain scaling, two clusters / one: terminal / bookkeeping (×)",
            f"{fmt(up_terminal, 2)} / {fmt(up_bookkeeping, 2)}",
        )
        if "drain_two" in cpu:
            add("CPU per drained call, two clusters (ms)", cpu["drain_two"] * 1000 / two["calls"], digits=2)
        add(
            "outbox lag p50 / p99, two clusters (ms)",
            f"{fmt(get(two, 'outbox_lag_ms', 'p50'))} / {fmt(get(two, 'outbox_lag_ms', 'p99'))}",
        )
        webhooks = get(two, "delivery", "webhooks", "lag_ms")
        if webhooks:
            add(
                "delivery lag p50 / p99, webhooks, two clusters (ms)",
                f"{fmt(webhooks['p50'])} / {fmt(webhooks['p99'])}",
            )
        missing = get(two, "delivery", "missing")
        if missing is not None:
            add(
                "every event reached every subscriber, two clusters",
                "yes" if missing == 0 else f"NO ({missing:,} missing)",
                target=verdict(missing == 0, "all of them"),
            )

    def latency(result: dict | None) -> str | None:
        if not result:
            return None
        return f"{fmt(result.get('p50_ms'))} / {fmt(result.get('p99_ms'))}"

    def split_of(result: dict | None) -> str | None:
        split = (result or {}).get("connections_per_worker")
        return " / ".join(str(n) for n in split) if split else None

    for key, suffix in (("submission", ""), ("submission_wrk", ", wrk")):
        product, floor_result = a.get(key), fl.get(key)
        if not product and not floor_result:
            continue
        client = (product or floor_result)["client"]
        rate, floor_rate = get(a, key, "rate"), get(fl, key, "rate")
        add(f"POST service-calls ({client}) req/s", rate, digits=0)
        add(f"POST service-calls p50 / p99 (ms){suffix}", latency(product))
        add(f"POST floor view ({client}) req/s", bare=floor_rate, digits=0)
        add(f"POST floor view p50 / p99 (ms){suffix}", bare=latency(floor_result))
        add(
            f"POST connections per web worker{suffix}",
            split_of(product),
            bare=split_of(floor_result),
        )
        share = ratio(rate, floor_rate)
        add(
            f"POST service-calls / floor{suffix} (%)",
            None if share is None else share * 100,
            target=post_verdict(rate, floor_rate),
            digits=0,
        )
    if a.get("flow"):
        f = a["flow"]
        add(
            "flow: other tenant's lateness p50 / p99, alone (ms)",
            f"{fmt(get(f, 'alone_ms', 'p50'))} / {fmt(get(f, 'alone_ms', 'p99'))}",
        )
        beside = get(f, "beside_ms", "p99")
        alone = get(f, "alone_ms", "p99")
        add(
            f"flow: … beside {f['backlog']:,} calls held by flow control (ms)",
            f"{fmt(get(f, 'beside_ms', 'p50'))} / {fmt(beside)}",
            target=verdict(
                None if beside is None or alone is None else beside <= alone + 100, "p99 within 100 ms of alone"
            ),
        )
        add(
            f"flow: limited tenant's starts/s (limit {f['limits']['ratePerSecond']}/s)",
            get(f, "limited_starts_per_second"),
        )
    if a.get("neighbour"):
        nn = a["neighbour"]
        for figure, label in (("lateness_ms", "lateness"), ("delivery_lag_ms", "delivery lag")):
            alone, beside = get(nn, "alone", figure, "p99"), get(nn, "beside", figure, "p99")
            add(f"noisy neighbour: quiet tenant's {label} p50 / p99, alone (ms)", _p50_p99(nn["alone"][figure]))
            add(
                "noisy neighbour: … beside a tenant filling its share (ms)",
                _p50_p99(nn["beside"][figure]),
                target=verdict(
                    None if beside is None or alone is None else beside <= alone + 100, "p99 within 100 ms of alone"
                ),
            )
    capacity.rows(add, results.get("capacity") or {}, verdict)
    if lst:
        calls = lst["calls"]
        labels = {"one_tag": "1 tag", "two_tags": "2 tags", "favorite": "favorite", "status": "status"}
        for kind, label in labels.items():
            r = lst["results"].get(kind)
            if not r:
                continue
            target = ""
            if kind in ("one_tag", "two_tags"):
                ok = r["p95"] <= 50
                target = f"p95 ≤ 50 ms{'' if calls >= 1_000_000 else ' (at 1M)'}: {'met' if ok else 'MISSED'}"
            add(f"list {label}, {calls:,} calls: p50 / p95 (ms)", f"{fmt(r['p50'])} / {fmt(r['p95'])}", target=target)
        tag_plans = [lst["results"][k]["plan_ok"] for k in ("one_tag", "two_tags", "favorite") if k in lst["results"]]
        add(
            "list plan: tag index, no SCAN of service_calls",
            "yes" if all(tag_plans) else "NO",
            target=verdict(all(tag_plans), "index-only plan"),
        )
    return table


def same_work_targets(add: Callable[..., None], rate: Any, per_call: Any, delivery: Any, c: dict) -> None:
    """The burst against Celery doing the same work: drain ≥ 1.5× its better design, CPU per call
    ≤ 0.8× its better one, the whole burst delivered no later than its inline design."""
    designs = [c[key] for key in ("same_work", "same_work_inline") if c.get(key)]
    if not designs:
        return
    best_rate = max(design["rate"] for design in designs)
    add(
        "same work: drain / Celery's better design (×)",
        ratio(rate, best_rate),
        celery=best_rate,
        target=verdict(None if rate is None else rate >= SAME_WORK_RATE * best_rate, f"≥ {SAME_WORK_RATE}×"),
        digits=2,
    )
    cpus = [design["cpu_ms_per_call"] for design in designs if design.get("cpu_ms_per_call")]
    if cpus:
        add(
            "same work: CPU per call / Celery's better design (×)",
            ratio(per_call, min(cpus)),
            celery=min(cpus),
            target=verdict(None if per_call is None else per_call <= SAME_WORK_CPU * min(cpus), f"≤ {SAME_WORK_CPU}×"),
            digits=2,
        )
    inline = get(c, "same_work_inline", "delivery", "webhooks", "first_created_to_last_received_s")
    whole = get(delivery, "webhooks", "first_created_to_last_received_s")
    if inline is not None:
        add(
            "same work: whole burst delivered, first made → last received (s)",
            whole,
            celery=inline,
            target=verdict(None if whole is None else whole <= inline, "≤ Celery inline's"),
            digits=2,
        )


def render(results: dict) -> str:
    header = ("metric", "Service Agent", "django-q2", "Celery (Redis)", "bare / floor", "target")
    body = rows(results)
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]

    def line(row: tuple) -> str:
        cells = [
            str(cell).ljust(widths[i]) if i == 0 or i == 5 else str(cell).rjust(widths[i]) for i, cell in enumerate(row)
        ]
        return "| " + " | ".join(cells) + " |"

    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(row) for row in body)
    notes = []
    if results["mode"] == "quick":
        notes.append("--quick: counts are far below a full run's; the verdicts are only indicative")
    database = results.get("database") or {"engine": "sqlite"}
    if database["engine"] == "postgres":
        users = "the agent" + (" and django-q2's ORM broker" if results["djq"] else "")
        two = (
            "; the drain also ran with two qcluster processes (Q_WORKERS=2 each, another tenant) on it"
            if results["agent"].get("drain_two")
            else ""
        )
        notes.append(
            f"database: PostgreSQL {database.get('server_version', '?')}, scratch database "
            f"{database.get('name', '?')} (dropped at the end) for {users}{two}"
        )
    else:
        notes.append("database: SQLite, a fresh file in the run's DATA_DIR")
    if get(results, "bare", "drain", "cpu_per_request_ms") is not None:
        notes.append(
            "CPU per drained call: the agent's = CPU of all its qcluster processes in the drain window / calls "
            "(includes event delivery); bare = the loop's own process CPU / requests (client side only)"
        )
    if get(results, "celery", "same_work") or get(results, "celery", "same_work_inline"):
        notes.append(
            f"same work: Celery ({SAME_WORK_CONCURRENCY} worker processes) doing a drained call's network work (bench/peer_work.py): "
            "the GET, then each of its two events to the two webhook receivers (signed) and NATS (acknowledged), "
            "by a task per delivery or inline in the call's task; no database. Its CPU per call counts the worker's "
            "processes and the local Redis server's; lag = received - the event's making (its UUIDv7 id). "
            "The targets compare with its better design; Celery's no-op drain is a yardstick"
        )
    if results.get("floor"):
        notes.append(
            "POST floor: bench/floor.py, a plain Django view under the same gunicorn command line and settings "
            "(URLconf bench.floor): the API's own API-key authentication, one INSERT, 202 with a tiny JSON body; "
            "rates count 202 answers"
        )
    lateness = results["agent"].get("lateness")
    if lateness:
        notes.append(
            f"agent lateness: {lateness['calls']} calls submitted in {lateness['submission']['seconds']:.1f}s "
            f"({lateness['submission']['per_call_ms']:.1f} ms each), first due {lateness['lead_s']:.1f}s "
            f"after the submissions began; Celery and django-q2 timers are due from "
            f"+{results['sizes']['lateness_lead']:.0f}s, over the same {results['sizes']['lateness_spread']:.0f}s"
        )
    if results["djq"].get("lateness"):
        notes.append(
            "django-q2 lateness: when its no-op task ran (Task.stopped) - due; Task.started is set "
            "when its scheduler enqueues the task"
        )
    flow_result = results["agent"].get("flow")
    if flow_result:
        notes.append(
            f"flow: {flow_result['calls']} calls of one tenant due over {results['sizes']['flow_spread']:.0f}s, alone, "
            f"then while another tenant limited to {flow_result['limits']} has {flow_result['backlog']} calls due at "
            f"once ({flow_result['held_at_window_end']} still held when the window ended)"
        )
    nn = results["agent"].get("neighbour")
    if nn:
        notes.append(
            f"noisy neighbour: {nn['calls']} calls of a quiet tenant, each with its four events to a webhook, "
            f"alone, then beside a tenant with {nn['noisy_calls']} calls to a 20 s target and eight subscriptions "
            f"to a 14 s receiver, pinged (bench/neighbour.py)"
        )
    delivery = get(results, "agent", "drain", "delivery")
    if delivery:
        notes.append(
            f"delivery: the drain ran with {', '.join(delivery['subscribers'])} subscribed to its tenant "
            f"(made after the submissions, before the due instant), so its events are the burst's "
            f"(Running, Succeeded/Failed); lag = received - outbox created_at; the drain rows include "
            f"this work, not comparable with runs before delivery"
        )
    for key, label in (("drain", "drain"), ("drain_two", "drain, two clusters")):
        burst = get(results, "agent", key, "delivery")
        if burst and burst.get("all_succeeded_in_db") is False:
            open_states = {state: n for state, n in (burst.get("notifications") or {}).items() if state != "SUCCEEDED"}
            notes.append(
                f"{label}: not every delivery succeeded within {agent.DELIVERY_TIMEOUT:.0f}s of the events' "
                f"publication (notifications {open_states}); its window, and so its CPU per drained call, "
                f"ran until that timeout"
            )
    for name, change in (get(results, "agent", "replaced_processes") or {}).items():
        notes.append(
            f"{name}: worker processes changed during its window (gone {change['gone']}, new {change['new']}): "
            "its CPU figures count only the processes there from start to end"
        )
    for name, reason in results["skipped"].items():
        notes.append(f"skipped {name}: {reason}")
    for name, error in results["errors"].items():
        notes.append(f"ERROR in {name}: {error.strip().splitlines()[-1]}")
    m = results["machine"]
    notes.append(
        f"machine: {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}, nice {m.get('nice', 0)}, "
        f"load average at start {m['load_average'][0]:.2f}, at end "
        f"{results.get('load_average_end', [math.nan])[0]:.2f}"
    )
    return "\n".join(out + [""] + notes)


def plans(results: dict) -> str:
    lst = results.get("list") or {}
    out = []
    for kind, r in (lst.get("results") or {}).items():
        out.append(f"EXPLAIN QUERY PLAN, {kind} {json.dumps(r['plan_example'])}:\n  " + r["plan"].replace("\n", "\n  "))
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run of about a minute")
    parser.add_argument(
        "--only",
        default=",".join(METRICS),
        help=f"comma-separated subset of {','.join(METRICS)} (outbox lag and event delivery come with drain)",
    )
    parser.add_argument("--big", action="store_true", help="the list at 1,000,000 calls (takes a few minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary DATA_DIR and the child logs")
    parser.add_argument("--skip-peers", action="store_true", help="measure the agent only (no Celery, no django-q2)")
    parser.add_argument(
        "--no-delivery",
        action="store_true",
        help="drain without subscribers (no event delivery rows): the calls' own cost, as before delivery existed",
    )
    parser.add_argument(
        "--py-spy", action="store_true", help="record flame graphs of the engine processes (needs py-spy in the venv)"
    )
    parser.add_argument(
        "--database",
        choices=DATABASES,
        default="sqlite",
        help="postgres: a scratch database at BENCH_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/), "
        "dropped at the end; the drain also runs with two clusters; no list benchmark",
    )
    args = parser.parse_args()
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(args.only) - set(METRICS)
    if unknown:
        parser.error(f"unknown metric(s): {', '.join(sorted(unknown))}; choose from {', '.join(METRICS)}")
    if args.database == "postgres":
        reason = ScratchPostgres().unreachable_reason()
        if reason:
            print(f"--database postgres: {reason}", file=sys.stderr)
            return 2

    def on_term(signum, frame) -> None:
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    # Also when started in the background, where the shell leaves SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    run = Run(args)
    started = time.monotonic()
    status = 0
    try:
        run.execute()
    except (Interrupted, KeyboardInterrupt) as exc:
        log(f"interrupted ({type(exc).__name__}); stopping everything this run started")
        run.results["errors"]["run"] = "interrupted"
        status = 130
    except Exception as exc:
        log(f"the run failed: {type(exc).__name__}: {exc}")
        run.results["errors"]["run"] = "".join(traceback.format_exception(exc))[-4000:]
        status = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the clean-up
        run.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    run.results["seconds"] = time.monotonic() - started
    run.results["load_average_end"] = list(os.getloadavg())
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    suffix = "" if args.database == "sqlite" else f"-{args.database}"
    out_path = out_dir / f"{run.stamp}-{run.results['mode']}{suffix}.json"
    if any(run.results["capacity"].values()):
        try:
            plot = capacity.plot(run.results["capacity"], out_path.with_suffix(".capacity.png"))
            run.results["capacity"]["plot"] = str(plot.relative_to(ROOT))
        except ImportError as exc:  # matplotlib comes with requirements-bench.txt
            run.results["skipped"]["capacity plot"] = f"{exc}: pip install -r requirements-bench.txt"
    out_path.write_text(json.dumps(run.results, indent=2, default=str))
    print()
    print(render(run.results))
    if run.results.get("list"):
        print()
        print(plans(run.results))
    print()
    plot_note = (
        f", the capacity plot in {run.results['capacity']['plot']}" if run.results["capacity"].get("plot") else ""
    )
    log(f"done in {run.results['seconds']:.0f}s; results in {out_path.relative_to(ROOT)}{plot_note}")
    if run.results["errors"] and not status:
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
