"""A NATS cluster of a test's own (docs/deploy.md, "High availability"): `size` nats-server nodes
on free 127.0.0.1 ports, routed to each other, JetStream on each with a store of its own; never
the shared server. `kill` is the loss of a node's machine: SIGKILL, its store left as it was."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.agent_process import free_port

NATS_SERVER = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/sbin")
START_SECONDS = 20


class Node:
    def __init__(self, base: Path, name: str) -> None:
        self.name = name
        self.port, self.cluster_port = free_port(), free_port()
        self.store = base / name
        self.store.mkdir()
        self.log = base / f"{name}.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, routes: list[str]) -> None:
        command = [
            NATS_SERVER,
            *("-js", "-sd", str(self.store), "-a", "127.0.0.1", "-p", str(self.port), "-n", self.name),
            *("--cluster_name", "service-agent-test", "--cluster", f"nats://127.0.0.1:{self.cluster_port}"),
            *("--routes", ",".join(routes), "-l", str(self.log)),
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
        except OSError:
            return False
        return True

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


class Cluster:
    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes

    @property
    def url(self) -> str:
        """Every node, as NATS_URL names them."""
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)


@contextmanager
def nats_cluster(base: Path, *, size: int = 3) -> Iterator[Cluster]:
    nodes = [Node(base, f"n{i}") for i in range(size)]
    try:
        for node in nodes:
            node.start([f"nats://127.0.0.1:{other.cluster_port}" for other in nodes if other is not node])
        deadline = time.monotonic() + START_SECONDS
        while not all(node.listening() for node in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the NATS cluster did not start:\n" + nodes[0].log.read_text()[-2000:])
            time.sleep(0.05)
        yield Cluster(nodes)
    finally:
        for node in nodes:
            node.kill()
