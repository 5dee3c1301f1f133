"""A real local Redis Cluster for tests and benchmarks: three primaries, one replica each.

Six `redis-server --cluster-enabled yes` processes on free ports, each in its own folder, joined
by `redis-cli --cluster create --cluster-replicas 1`; ready once every node says
`cluster_state:ok`. A failover of one primary (`fail_over`) kills it with SIGKILL and promotes
its replica with `CLUSTER FAILOVER TAKEOVER`, as an operator (or the cluster's own vote) would.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis

from devtools.processes import RedisServer, wait_for

#: A node is declared failing after this long; long, so a loaded machine never fails over by
#: itself: the tests promote replicas themselves.
NODE_TIMEOUT_MS = 30000


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port() -> int:
    """A free port whose cluster bus port (10000 higher) is free too; at most 55535, since the
    bus port must exist."""
    while True:
        port = random.randint(20000, 45000)
        if _bindable(port) and _bindable(port + 10000):
            return port


@dataclass
class RedisClusterNodes:
    """Six nodes on free ports: `primaries` and their `replicas` once `start` has run."""

    directory: Path
    primaries: int = 3
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The ledger's URL: every node, so a client started while one is down finds the rest."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def plain_url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port, decode_responses=True)

    def start(self) -> RedisClusterNodes:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not on the PATH")
        for i in range(self.primaries * 2):
            node = RedisServer(
                self.directory / f"node{i}",
                port=cluster_port(),
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(self.directory / f"node{i}" / "nodes.conf"),
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                    "--repl-diskless-sync-delay",
                    "0",
                ),
            )
            self.nodes.append(node.start())
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        self.wait_ok()
        wait_for(self._replicas_synced, timeout=60, what="every replica in sync")
        return self

    def _info(self, node: RedisServer, section: str) -> dict[str, str]:
        client = redis.Redis(port=node.port, decode_responses=True)
        try:
            if section == "cluster":
                reply = client.execute_command("CLUSTER INFO")
                return {str(k): str(v) for k, v in dict(reply).items()}
            return {str(k): str(v) for k, v in client.info(section).items()}
        except redis.RedisError:
            return {}
        finally:
            client.close()

    def alive(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.process is not None]

    def wait_ok(self, *, timeout: float = 60) -> None:
        """Until every live node says `cluster_state:ok` and the slot map has every slot."""
        wait_for(
            lambda: all(
                self._info(n, "cluster").get("cluster_state") == "ok"
                and self._info(n, "cluster").get("cluster_slots_ok") == "16384"
                for n in self.alive()
            ),
            timeout=timeout,
            what="cluster_state:ok on every node",
        )

    def _replicas_synced(self) -> bool:
        replicas = [n for n in self.alive() if self._info(n, "replication").get("role") == "slave"]
        return len(replicas) == self.primaries and all(
            self._info(n, "replication").get("master_link_status") == "up" for n in replicas
        )

    def primary_of(self, key: str) -> RedisServer:
        """The live node that serves `key`'s slot as a primary."""
        client = self.client()
        try:
            node = client.get_node_from_key(key)
            port = int(node.port)
        finally:
            client.close()
        return next(n for n in self.nodes if n.port == port)

    def replica_of(self, primary: RedisServer) -> RedisServer:
        """The live replica of `primary`."""
        for node in self.alive():
            info = self._info(node, "replication")
            if info.get("role") == "slave" and int(info.get("master_port", "0")) == primary.port:
                return node
        raise AssertionError(f"no replica of the primary on port {primary.port}")

    def fail_over(self, primary: RedisServer) -> RedisServer:
        """SIGKILL `primary`, promote its replica (`CLUSTER FAILOVER TAKEOVER`), wait until the
        cluster is ok again; returns the promoted node."""
        replica = self.replica_of(primary)
        primary.kill()
        client = redis.Redis(port=replica.port, decode_responses=True)
        try:
            client.execute_command("CLUSTER FAILOVER TAKEOVER")
            wait_for(
                lambda: self._info(replica, "replication").get("role") == "master",
                timeout=30,
                what=f"the replica on port {replica.port} promoted",
            )
        finally:
            client.close()
        self.wait_ok()
        return replica

    def cpu(self) -> dict[int, float]:
        """used_cpu_sys + used_cpu_user of each live node, by port (benchmarks)."""
        out: dict[int, float] = {}
        for node in self.alive():
            info = self._info(node, "cpu")
            out[node.port] = float(info.get("used_cpu_sys", 0)) + float(
                info.get("used_cpu_user", 0)
            )
        return out

    def roles(self) -> dict[int, str]:
        return {n.port: self._info(n, "replication").get("role", "") for n in self.alive()}

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()
