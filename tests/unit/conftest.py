"""The ledger rig fixture (fakeredis and a real redis-server) for every unit test of scripts."""

from tests.unit.ledger.test_scripts import rig  # noqa: F401  (a fixture, used by name)
