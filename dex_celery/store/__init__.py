"""The SQL system of record."""
