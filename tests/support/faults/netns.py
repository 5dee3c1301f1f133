"""A private network namespace joined to the host by a veth pair, so a test can reach a server
from an address that is not loopback (`ip netns`, iproute2; needs root). Skips the test, with
the reason, where namespaces cannot be made."""

from __future__ import annotations

import contextlib
import random
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


@dataclass(frozen=True)
class Namespace:
    """`name`, reached from the host at `ns_ip`; the host is `host_ip` from inside."""

    name: str
    host_if: str
    host_ip: str
    ns_ip: str

    def popen(self, argv: Sequence[str], **options: object) -> subprocess.Popen[str]:
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            ["ip", "netns", "exec", self.name, *argv], text=True, **options
        )

    def run(self, argv: Sequence[str], timeout: float = 120, **options: object) -> str:
        done = subprocess.run(  # type: ignore[call-overload]
            ["ip", "netns", "exec", self.name, *argv],
            capture_output=True, text=True, timeout=timeout, **options,
        )  # fmt: skip
        assert done.returncode == 0, f"{argv} in {self.name}: {done.stderr[-3000:]}"
        return str(done.stdout)


def _free_subnet() -> int:
    used = _ip("-4", "-o", "addr").stdout
    for _ in range(100):
        octet = random.randint(1, 254)
        if f"10.213.{octet}." not in used:
            return octet
    raise RuntimeError("no free 10.213.x.0/30 subnet")


@contextlib.contextmanager
def namespace() -> Iterator[Namespace]:
    suffix = uuid.uuid4().hex[:6]
    name, host_if, ns_if = f"dex-{suffix}", f"dxh{suffix}", f"dxn{suffix}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace here ({made.stderr.strip()})")
    try:
        octet = _free_subnet()
        host_ip, ns_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", name)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for args in (
            ("addr", "add", f"{ns_ip}/30", "dev", ns_if),
            ("link", "set", ns_if, "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("netns", "exec", name, "ip", *args)
        yield Namespace(name, host_if, host_ip, ns_ip)
    finally:
        _ip("link", "del", host_if, check=False)
        _ip("netns", "del", name, check=False)
