"""The registry of the engine's loops: one module per loop, each a small class with its name,
where it runs and one step (workers/loops/base.py; docs/architecture.md, "Adding a loop").

Every engine built after a loop is registered runs it in the worker processes that hold its
role, and the run recorder accepts its runs (workers/services.py, RunRecorder): adding a loop
needs no migration.
"""

from __future__ import annotations

from workers.loops.backlog import BacklogLoop
from workers.loops.base import Loop, Where
from workers.loops.delivery import DeliveryLoop
from workers.loops.dispatch import DispatchLoop
from workers.loops.flow import FlowLoop
from workers.loops.recorder import RecorderLoop
from workers.loops.retention import RetentionLoop
from workers.loops.schedules import SchedulesLoop
from workers.loops.timer import TimerLoop
from workers.loops.watchdog import WatchdogLoop

__all__ = ["Loop", "Where", "loop_names", "register", "registered", "unregister"]

# The longest name worker_loop_runs.loop holds.
NAME_MAX_LENGTH = 16

# In the order an engine starts them (of those its roles run) and the admin lists them.
BUILT_IN: tuple[type[Loop], ...] = (
    TimerLoop,
    RecorderLoop,
    DispatchLoop,
    DeliveryLoop,
    WatchdogLoop,
    RetentionLoop,
    SchedulesLoop,
    FlowLoop,
    BacklogLoop,
)

_loops: dict[str, type[Loop]] = {}
# The names their runs are recorded under (read at every recorded run).
_names: frozenset[str] = frozenset()


def register(loop: type[Loop]) -> type[Loop]:
    """Add a loop class (usable as a decorator). Its name and the name its runs are recorded
    under must be new, and at most NAME_MAX_LENGTH characters."""
    if not isinstance(getattr(loop, "where", None), Where):
        raise ValueError(f"loop {loop.__name__} must say where it runs (a Where)")
    for name in {loop.name, loop.run_name()}:
        if not name or len(name) > NAME_MAX_LENGTH:
            raise ValueError(f"loop name {name!r} must have 1 to {NAME_MAX_LENGTH} characters")
    if loop.name in _loops or loop.run_name() in loop_names():
        raise ValueError(f"a loop named {loop.name!r} is registered already")
    _loops[loop.name] = loop
    _recount()
    return loop


def unregister(name: str) -> None:
    """Remove a registered loop (engines built before keep running it)."""
    del _loops[name]
    _recount()


def registered() -> tuple[type[Loop], ...]:
    """The registered loops, in the order they were registered."""
    return tuple(_loops.values())


def loop_names() -> frozenset[str]:
    """The names loop runs are recorded under (worker_loop_runs.loop)."""
    return _names


def _recount() -> None:
    global _names
    _names = frozenset(loop.run_name() for loop in _loops.values())


for _loop in BUILT_IN:
    register(_loop)
