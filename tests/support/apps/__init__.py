"""Deployments the tests run: small Celery apps and the worker modules beside them."""
