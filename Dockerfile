# Runwatch server image: the dashboard (gunicorn), and with another command the Celery worker and
# beat. docker-compose.yml runs all three from it. The source tree stays at /app and is first on
# PYTHONPATH, so templates/ and static/ are found beside the packages, as in a checkout.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 --user-group runwatch
WORKDIR /app

COPY . .
RUN pip install '.[server]' \
    && python manage.py collectstatic --noinput -v 0 \
    && mkdir -p var \
    && chown runwatch:runwatch var

USER runwatch
EXPOSE 8000
CMD ["gunicorn", "dashboard.wsgi", "-b", "0.0.0.0:8000", "--workers", "3", "--threads", "4"]
