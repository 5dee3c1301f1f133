"""Real processes a test starts as a person would: workers, `dex-celery dev`, the installed script, Flower, requesters."""
