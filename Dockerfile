# The one image of the reference deployment: worker, beat, Flower, the web app and
# `dex-celery db upgrade`.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY dex_celery ./dex_celery
RUN pip install ".[postgres,flower,web,otel]" \
    && useradd --create-home --uid 10001 dex

# Celery refuses to be comfortable as root, and nothing here needs it.
USER dex
CMD ["celery", "-A", "dex_celery.examples.orderdesk.app", "worker", "-P", "prefork", "-l", "info"]
