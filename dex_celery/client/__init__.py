"""What an agent loop uses: the sync and async clients and the tool-call loop helpers."""

from dex_celery.client.dex_client import AsyncDexClient, DexClient

__all__ = ["AsyncDexClient", "DexClient"]
