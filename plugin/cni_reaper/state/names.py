"""Record files' names and size limit, apart from the store (which the hot path of a wrapped DEL does not
import before the real plugin runs): one file per attachment, named by a hash of its key (network, container
ID, ifname), so that no input becomes a path."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Container

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


def attachment_name(network: str, container_id: str, ifname: str) -> str:
    """libcni's name of an attachment: its cache entry's file name (`<cacheDir>/results/<this>`)."""
    return f"{network}-{container_id}-{ifname}"


class Attached:
    """The records of a state directory as libcni names attachments (Index.attached): their attachment names,
    the networks they are of, and the record files' names (whether a key has a record: `holds`)."""

    __slots__ = ("names", "networks", "records")

    def __init__(self, names: set[str], networks: set[str], records: Container[str]) -> None:
        self.names, self.networks, self.records = names, networks, records

    def holds(self, network: str, container_id: str, ifname: str) -> bool:
        return record_name(network, container_id, ifname) in self.records


def is_record_name(name: str) -> bool:
    return name.startswith(RECORD_PREFIX) and name.endswith(RECORD_SUFFIX)


def others_in(found: dict[str, int], known: dict[str, int] | None = None) -> list[str]:
    """The names of a directory's entries (`found`) that are no record files. With `known` (the index's
    record names), only the names it does not hold are looked at: on a busy client all but a few of the
    directory's entries are its records (1,000 names tested one by one cost a call 0.15 ms)."""
    pool = found if known is None else found.keys() - known.keys()
    return [n for n in pool if not (n.startswith(RECORD_PREFIX) and n.endswith(RECORD_SUFFIX))]


def all_record_names(names: list[str]) -> bool:
    """Whether every one of `names` is a record file's name, told in C (joined by newlines: none inside any,
    each one after a newline starting with the prefix, each one before a newline ending with the suffix)."""
    n = len(names)
    if not n:
        return True
    joined = "\n" + "\n".join(names) + "\n"  # a TypeError for what is no string
    return (joined.count("\n") == n + 1 and joined.count("\n" + RECORD_PREFIX) == n
            and joined.count(RECORD_SUFFIX + "\n") == n)
