"""Development tools shared by the tests and the benchmarks: real redis-server and Celery
processes, a private PostgreSQL schema, the tool app both drive. Not part of the installed
package (`pyproject.toml` ships `dex_celery*` only); `bench/` imports these, never `tests`."""
