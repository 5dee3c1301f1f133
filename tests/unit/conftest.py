"""The ledger rig fixture (fakeredis and a real redis-server) for every unit test of scripts."""

from tests.support.stores.ledger_rig import rig  # noqa: F401  (a fixture, used by name)
