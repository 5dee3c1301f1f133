"""A Django project (tests/integration/test_django.py): `celery -A tests.django_project.proj`
finds `app` here, as Celery's Django guide has it."""

from tests.django_project.proj.celery import app

__all__ = ["app"]
