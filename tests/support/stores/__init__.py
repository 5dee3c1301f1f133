"""The SQL databases and ledgers the tests run on, and the rigs that drive them directly."""
