"""Record files' names and size limit, apart from the store (which the hot path of a wrapped DEL does not
import before the real plugin runs): one file per attachment, named by a hash of its key (network, container
ID, ifname), so that no input becomes a path."""

from __future__ import annotations

RECORD_PREFIX = "r-"
RECORD_SUFFIX = ".json"
# Larger than any record the builders can make with the limits of state/record.py (every string escaped to
# \uXXXX):
MAX_RECORD_BYTES = 8 << 20

try:  # the builtin digest module: hashlib would load OpenSSL, a few ms on every invocation
    from _sha256 import sha256
except ImportError:  # Python 3.12+
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256


def record_name(network: str, container_id: str, ifname: str) -> str:
    digest = sha256(f"{network}\0{container_id}\0{ifname}".encode("utf-8", "surrogatepass")).hexdigest()[:40]
    return f"{RECORD_PREFIX}{digest}{RECORD_SUFFIX}"


def is_record_name(name: str) -> bool:
    return name.startswith(RECORD_PREFIX) and name.endswith(RECORD_SUFFIX)
