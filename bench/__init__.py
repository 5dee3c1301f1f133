"""Benchmarks and the chaos run (issue 6); results and commands in docs/benchmarks.md and
docs/reliability.md. Each script runs its own private redis-server and worker processes."""
