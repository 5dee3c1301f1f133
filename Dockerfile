# The one image of the reference deployment: worker, beat, Flower, the web app and
# `dex-celery db upgrade`.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY dex_celery ./dex_celery
# The compose file's `-A config.celery_app`: a thin module over the order desk example in the
# package. Not installed; found in the working directory, as `celery -A` does.
COPY config ./config
RUN pip install ".[postgres,flower,web,otel]" \
    && useradd --create-home --uid 10001 dex

# Celery refuses to be comfortable as root, and nothing here needs it.
USER dex
CMD ["celery", "-A", "config.celery_app", "worker", "-P", "prefork", "-l", "info"]
