"""The Redis attempt ledger."""
