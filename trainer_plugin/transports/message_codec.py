"""How a batch is encoded for the broker: JSON written by orjson where it is installed, compressed
with zlib at level 1, or with zstd at level 1 where the collectors read zstd (see
trainer_plugin.transports.broker). All are what Celery already understands (content type
application/json, compression application/x-gzip or application/zstd), so a worker decodes these
messages as it decodes any other.

Why: a batch is ~35 KB of JSON numbers. The standard library writes it in ~1 ms, orjson in ~0.15;
zlib at level 1 takes ~0.3 ms and leaves about a third, so the message is written to Redis,
read by a worker and copied to Redis's unacked hash with a third of the bytes (on the collector
box the worker's main process spent half its time sending bytes to Redis; bench/README.md).
Level 1 rather than kombu's default 6: 0.3 ms instead of 0.9 ms on the sending side for 15% more
bytes. zstd at level 1 (kombu's default is 3) compresses a batch in 0.09 ms and decompresses it in
0.04, against zlib's 0.24 and 0.10, into 8.7 KB against 10.1 (bench/README.md).
"""

from __future__ import annotations

import functools
import sys
import threading
import zlib
from typing import Any

SERIALIZER = "runwatch-json"
COMPRESSION = "zlib"
ZLIB_LEVEL = 1
ZSTD = "zstd"
ZSTD_LEVEL = 1

_registered = False
_lock = threading.Lock()


def options(zstd: bool = False) -> dict[str, str]:
    """``serializer`` and ``compression`` (zstd when asked and available, zlib otherwise) for
    ``send_task``/``apply_async`` of an ingest message. Registers the codecs with kombu the first
    time."""
    global _registered
    with _lock:
        if not _registered:
            _register()
            _registered = True
    return {"serializer": SERIALIZER,
            "compression": ZSTD if zstd and zstd_module() is not None else COMPRESSION}


@functools.cache
def zstd_module() -> Any:
    """The zstd module kombu decodes with (``compression.zstd`` from Python 3.14, the
    ``backports-zstd`` package before), or None where neither is installed."""
    try:
        if sys.version_info >= (3, 14):
            from compression import zstd
        else:
            from backports import zstd
    except ImportError:
        return None
    return zstd


def _register() -> None:
    from kombu import compression, serialization
    from kombu.utils.json import dumps as kombu_dumps

    try:
        import orjson
    except ImportError:  # the plugin without the broker extra's orjson: the standard library
        orjson = None

    def encode(value: Any) -> bytes | str:
        if orjson is not None:
            try:
                return orjson.dumps(value)
            except TypeError:  # beyond what orjson writes (an int over 64 bits, ...): kombu's way
                pass
        return kombu_dumps(value)

    registry = serialization.registry
    # Encoder only: decoding application/json stays kombu's, and the content type keeps its name.
    name_of_json = registry.type_to_name.get("application/json", "json")
    registry.register(SERIALIZER, encode, None, "application/json", "utf-8")
    registry.type_to_name["application/json"] = name_of_json
    # kombu's zlib encoder compresses at level 6; level 1 is read by the same decoder.
    compression.register(lambda body: zlib.compress(body, ZLIB_LEVEL), zlib.decompress,
                         "application/x-gzip", aliases=["gzip", "zlib"])
    zstd = zstd_module()
    if zstd is not None:  # kombu's own zstd encoder compresses at level 3
        compression.register(lambda body: zstd.compress(body, level=ZSTD_LEVEL), zstd.decompress,
                             "application/zstd", aliases=["zstd", "zstandard"])
