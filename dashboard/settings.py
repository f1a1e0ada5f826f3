"""Runwatch settings, read from the environment (every variable is listed in the README).

With nothing set, Runwatch runs embedded: SQLite under var/, Celery tasks executed in-process. In
production set at least DATABASE_URL, CELERY_BROKER_URL, SECRET_KEY and ALLOWED_HOSTS.
"""

from __future__ import annotations

from pathlib import Path

import environ

from trainer_plugin.transports import kombu_redis

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
# The default key is only good for the embedded mode on one's own machine; `check --deploy`
# flags it, and the production compose file refuses to start without SECRET_KEY.
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-runwatch-embedded-mode-only")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_TZ = True
LANGUAGE_CODE = "en-us"
USE_I18N = False

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "collectors",
    "collectors.alerts",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "dashboard.urls"
WSGI_APPLICATION = "dashboard.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'runwatch.sqlite3'}")
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Two training ranks write while the dashboard reads: WAL lets readers run beside the writer,
    # and IMMEDIATE transactions queue writers on the busy timeout instead of failing on upgrade.
    VAR_DIR.mkdir(exist_ok=True)
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # PostgreSQL JIT-compiles a plan whose estimated cost is high, and estimates over the
    # partitioned sample tables often are: 3.3 s of compilation for a runs-list query that runs in
    # 25 ms (bench/README.md, "Dashboard at scale"). Dashboard and ingest queries are short.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("options", "-c jit=off")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "runs"
LOGOUT_REDIRECT_URL = "login"

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # plotly.js comes from the installed plotly package, so the browser and the Python figure
    # builders always agree on the version; no CDN.
    "dashboard.staticfinders.PlotlyJsFinder",
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Compressed but not hashed: pages render with or without a prior collectstatic.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve straight from the finders when nothing was collected (tests, a fresh checkout).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# HTTPS hardening, on for production behind TLS (`check --deploy` expects it). RUNWATCH_HTTPS turns
# it all on; each part can be set on its own (e.g. SECURE_HSTS_PRELOAD=false for a private domain).
_https = env.bool("RUNWATCH_HTTPS", default=False)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=_https)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=_https)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=_https)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000 if _https else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=_https)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=_https)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if _https else None
SESSION_COOKIE_HTTPONLY = True

# --- Celery -------------------------------------------------------------------------------------
# No broker configured means the embedded mode: tasks run in the calling process.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="")
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=not CELERY_BROKER_URL)
if not CELERY_BROKER_URL:
    CELERY_BROKER_URL = "memory://"
CELERY_TASK_EAGER_PROPAGATES = False
# kombu's Redis transport with one client per channel, on which a drain acknowledges its messages
# in one round trip (trainer_plugin/transports/kombu_redis.py); kombu built a client per command.
CELERY_BROKER_TRANSPORT = kombu_redis.transport_for(CELERY_BROKER_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "runwatch"
# Telemetry has its own queue so that a backlog of batches never delays periodic work.
CELERY_TASK_ROUTES = {"collectors.ingest_batch": {"queue": "ingest"}}
# A batch is acknowledged only once written: a worker killed mid-batch means redelivery, and the
# unique batch id makes the second write a no-op.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A worker stores the batches it received together in one transaction (collectors.drain): up to
# RUNWATCH_INGEST_DRAIN_MAX of them, or what came within RUNWATCH_INGEST_DRAIN_WAIT_S of the first.
# 1 stores each batch in a transaction of its own. bench/README.md has the measurements (64 took
# 166k to 177k GPU samples/s against 32, with no more latency).
RUNWATCH_INGEST_DRAIN_MAX = env.int("RUNWATCH_INGEST_DRAIN_MAX", default=64)
RUNWATCH_INGEST_DRAIN_WAIT_S = env.float("RUNWATCH_INGEST_DRAIN_WAIT_S", default=0.25)
# Workers that decode zstd read the ingest.zstd queue too and tell plugins so, which then send
# zstd-compressed batches there (collectors/zstd_ingest.py). False: zlib batches on ingest only.
RUNWATCH_INGEST_ZSTD = env.bool("RUNWATCH_INGEST_ZSTD", default=True)
# Unacknowledged messages a worker may hold, per pool process. Draining needs room for a full
# drain per pool process plus the one being gathered: at least DRAIN_MAX * (1 + 1/concurrency),
# which 128 is for any concurrency with the default DRAIN_MAX.
CELERY_WORKER_PREFETCH_MULTIPLIER = env.int("CELERY_WORKER_PREFETCH_MULTIPLIER", default=128)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Longer than any batch write; an unacked message is redelivered after this.
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=600),
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Without this, Celery's Django fixup closes the database connection before and after every task,
# so each batch paid for a new PostgreSQL session (bench/README.md, "End-to-end ingest"). Workers
# keep their connection instead, and dashboard/celery.py treats each task as Django treats a
# request: the connection is dropped after an error, when older than CONN_MAX_AGE, or when its
# health check fails. 0 brings back a new connection per task.
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)

# --- Runwatch -----------------------------------------------------------------------------------
# A run is shown as "stalled" when nothing arrived from it for this long.
RUNWATCH_STALE_AFTER_S = env.int("RUNWATCH_STALE_AFTER_S", default=120)
# How often the run page asks for fresh chart data.
RUNWATCH_REFRESH_MS = env.int("RUNWATCH_REFRESH_MS", default=3000)
# Ingest batches per token: "BATCHES/SECONDS" or "off" (collectors.ratelimit). The default is 3x
# what a 200-rank job at one batch per second per rank sends. Counted in Redis (the broker's, or
# RUNWATCH_RATE_LIMIT_REDIS_URL) so all web workers share the count; in memory when embedded.
RUNWATCH_INGEST_RATE_LIMIT = env.str("RUNWATCH_INGEST_RATE_LIMIT", default="6000/10")
_rate_redis = env.str("RUNWATCH_RATE_LIMIT_REDIS_URL", default="") or (
    CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else "")
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "ingest_rate": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _rate_redis,
         "KEY_PREFIX": "runwatch-rate"}
        if _rate_redis else
        {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "ingest-rate"}
    ),
}

# --- Stall detection (collectors.stalls) ---------------------------------------------------------
# An attempt with no step and no heartbeat for max(this, 10 x its median step time) gets an
# interruption (a hang or a kill). Beat asks every 30 s, so a silent attempt is seen within about
# a minute of its threshold; the task is idempotent, so an extra tick costs one small query.
RUNWATCH_STALL_AFTER_S = env.int("RUNWATCH_STALL_AFTER_S", default=60)
CELERY_BEAT_SCHEDULE = {
    "detect-stalls": {"task": "collectors.detect_stalls", "schedule": 30.0},
    # Window alert rules (stall, throughput, GPU heat, power, ETTR, checkpoints) and resolutions.
    "evaluate-alert-windows": {"task": "alerts.evaluate_windows", "schedule": 30.0},
    # Day partitions of the sample tables, made days ahead (collectors.partitions).
    "ensure-partitions": {"task": "collectors.ensure_partitions", "schedule": 3600.0},
}

# --- Alerts (collectors.alerts) ------------------------------------------------------------------
# Base of the links in alert messages, e.g. https://runwatch.example.org (no link when empty).
RUNWATCH_PUBLIC_URL = env.str("RUNWATCH_PUBLIC_URL", default="")
# Mail: EMAIL_URL (smtp://user:pass@host:25, smtp+tls://… for STARTTLS) or the EMAIL_* names.
# Without either, embedded mode prints mail to the console instead of sending it.
if env.str("EMAIL_URL", default=""):
    vars().update(env.email_url("EMAIL_URL"))
else:
    EMAIL_HOST = env.str("EMAIL_HOST", default="")
    EMAIL_PORT = env.int("EMAIL_PORT", default=25)
    EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
    EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
    EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
    EMAIL_BACKEND = ("django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST
                     else "django.core.mail.backends.console.EmailBackend")
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="runwatch@localhost")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
