"""The order desk: the example deployment behind `dex-celery demo` and the repository's
docker-compose file (whose `config/`, `tasks/` and `reconcile/` modules import from here).

It is never loaded unless named: `dex-celery demo` uses it explicitly, and
`-A dex_celery.examples.orderdesk.app` selects it for other commands.
"""
