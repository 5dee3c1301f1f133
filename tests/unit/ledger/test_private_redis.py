"""The look at a bound private Redis (`ledger/private_redis.py`, docs/ledger.md, "One database,
one ledger"): only a `host:port/db` address that no longer holds the bound ledger is gone."""

from __future__ import annotations

import pytest

from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.private_redis import bound_ledger_answers
from dex_celery.processes.localstack import free_port


@pytest.mark.parametrize(
    "location",
    [
        "sentinel master mymaster dex",
        "cluster 127.0.0.1:7000 dex",
        "/run/redis/redis.sock dex",
    ],
)
def test_an_address_the_look_cannot_judge_counts_as_answering(location: str) -> None:
    """A socket, a Sentinel or a cluster is never a private Redis: never judged gone."""
    assert bound_ledger_answers(location, "ledger-1", KeySpace(prefix="dex"))


def test_nothing_listening_at_the_bound_address_is_gone() -> None:
    port = free_port()
    assert not bound_ledger_answers(f"127.0.0.1:{port}/0 dex", "ledger-1", KeySpace(prefix="dex"))
