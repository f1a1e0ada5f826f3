"""A per-token rate limit on ingest: at most N batches per window of S seconds
(RUNWATCH_INGEST_RATE_LIMIT="N/S", "off" to disable), counted in the `ingest_rate` cache (Redis in
production, so every gunicorn worker shares one count).

The default, 6000 batches per 10 s, is three times what a 200-rank job sending one batch per second
per rank needs, so a legitimate job is never throttled; a throttled sender gets 429 with
Retry-After, keeps the batch and sends it again (trainer_plugin treats 429 as "not now").
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

log = logging.getLogger(__name__)

CACHE_ALIAS = "ingest_rate"


@dataclass(frozen=True)
class RateLimit:
    batches: int
    window_s: int


@functools.lru_cache(maxsize=8)
def parse(value: str) -> RateLimit | None:
    """'6000/10' → 6000 batches per 10 s; 'off', '0' or '' → no limit."""
    value = value.strip().lower()
    if value in ("", "0", "off", "none"):
        return None
    count, _, window = value.partition("/")
    try:
        limit = RateLimit(int(count), int(window or 1))
    except ValueError:
        limit = None
    if limit is None or limit.batches < 1 or limit.window_s < 1:
        raise ImproperlyConfigured(
            f"RUNWATCH_INGEST_RATE_LIMIT={value!r}: write BATCHES/SECONDS (e.g. 6000/10) or off")
    return limit


def retry_after(token: str) -> int | None:
    """Counts one batch for ``token``; the seconds to wait when it is over the limit, else None.

    Fails open: when the counter's store is unreachable, ingest is not refused for it (the queue
    shares that Redis, and a refused enqueue already answers 503)."""
    limit = parse(settings.RUNWATCH_INGEST_RATE_LIMIT)
    if limit is None:
        return None
    now = time.time()
    window = int(now // limit.window_s)
    # Keyed on the token's hash: the secret itself never reaches the cache.
    key = f"ingest:{hashlib.sha256(token.encode()).hexdigest()[:32]}:{window}"
    cache = caches[CACHE_ALIAS]
    try:
        if cache.add(key, 1, timeout=limit.window_s + 1):
            count = 1
        else:
            count = cache.incr(key)
    except ValueError:  # expired between add and incr: this batch opens the next count
        return None
    except Exception:
        log.exception("ingest rate limit not checked: its cache is unreachable")
        return None
    if count <= limit.batches:
        return None
    return max(1, math.ceil((window + 1) * limit.window_s - now))
