"""A minimal Django project's settings that configure Celery and dex-celery in one place
(docs/django.md). Celery reads every `CELERY_*` name here (`namespace="CELERY"`), dex-celery's
included: `CELERY_DEX_REDIS_URL` is `Settings.redis_url`, and so on for every field.

The test sets the `DJANGO_EXAMPLE_*` variables to a Redis and a database of its own; a real
project would write its URLs here, or read them from its own environment the same way.
"""

import os

SECRET_KEY = "django-example-not-secret"
DEBUG = False
INSTALLED_APPS: list[str] = []

CELERY_BROKER_URL = os.environ["DJANGO_EXAMPLE_REDIS_URL"]
CELERY_DEX_REDIS_URL = os.environ["DJANGO_EXAMPLE_REDIS_URL"]
CELERY_DEX_DATABASE_URL = os.environ["DJANGO_EXAMPLE_DATABASE_URL"]
CELERY_DEX_KEY_PREFIX = os.environ.get("DJANGO_EXAMPLE_KEY_PREFIX", "dex")
CELERY_DEX_HEARTBEAT_TIMEOUT = 2.5
CELERY_DEX_SWEEP_INTERVAL = 1.0
CELERY_DEX_APPROVAL_TIMEOUT = "2h"  # a duration, written as everywhere (README, "Settings")
