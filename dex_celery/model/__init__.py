"""Pure values every other part shares: ids, policies, outcomes, records, event types, texts.

Nothing here does I/O or imports another part of dex-celery except `errors` and `settings`.
"""
