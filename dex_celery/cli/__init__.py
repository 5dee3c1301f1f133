"""The `dex-celery` command: one module per group of subcommands, `main.py` registers them."""

from dex_celery.cli.main import main

__all__ = ["main"]
