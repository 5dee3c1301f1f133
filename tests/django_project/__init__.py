"""A minimal Django project configuring Celery and dex-celery from its settings (docs/django.md)."""
