"""The index of the state directory: per record file, what deciding "is anything stale" takes (its key, what
proves its current life alive or dead, its tombstone, whether it has earlier lives, its addresses), so that
with nothing stale a verb reads one small file instead of every record (docs/performance.md).

It is a cache: `.index` (written whole) plus `.index-journal` (one JSON line per change since, each entry
checked field by field), checked against one scan of the directory (names and inodes: no stat, no read);
anything that does not agree, does not parse or is not an entry of this version makes it anew from the
records, with a log line. Every save and removal under the lock keeps it current.

Its entries' fields are named in the file: the first part's `fields` lists, by name, what each position of an
entry (and of a journal line) holds: FIELDS below, declared once, in order. An index whose names are not this
release's is another release's, made anew from the records as one of another version is: adding, removing or
moving a field of FIELDS needs no version written by hand. The journal's first line names the index it extends
(its seal: the first part's length and both CRCs), so that its lines are applied to that index alone: not to
one written by a call cut before it removed the journal, nor by another release beside it; and a call that
cannot write the index whole removes it and journals nothing. (Each entry is a list under those names rather than
an object: 1,000 objects would repeat 16 keys 1,000 times in a file every call reads.)

`.index` is read by every call, 1,000 entries on a busy client: a magic line, a CRC-32 of the rest, the
length of its first part, then two JSON documents (parsed by the C scanner, linear in its size whatever it
holds: `marshal` was faster, but a few crafted bytes make it allocate gigabytes). The first, read by every
call, holds what nothing stale takes: the record files' names and inodes, and the entries the quick
judgement can judge as flat lists by host (their netns paths as runs of one directory and the names in it,
so that each is looked at relative to one open directory: a `stat` that does not walk the whole path again;
their namespaces' dev, ino and ctime as one string of decimals, and the digest of them all that the
judgement compares with what it sees: 3,000 integers are a third of the JSON scanner's time), every other
entry whole; the second, read only when
one of those quick entries must be read in full (it was not seen live, or the index is written whole),
holds their fields. Entries are compact lists into tables of the
hosts and netns directories, made an Entry only when asked for (unchecked: the CRC says the file is whole,
as cni-reaper wrote it; an entry that still cannot be made removes the file, and the next call makes it
anew). Only cni-reaper writes there (the directory is root's, 0700).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.state.record import Record
    from cni_reaper.state.safedir import SafeDir

    # the netns paths of a quick group: runs of (directory, how many of the group's paths are in it), and the
    # names in those directories, in the group's order
    Runs = tuple[list[tuple[str, int]], list[str]]

from cni_reaper import jsonio, log
from cni_reaper.state.names import all_record_names, attachment_name, is_record_name, others_in
from cni_reaper.state.record import SCHEMA, DirId, HostId, NetnsId, Veth, parse_time
from cni_reaper.values import Key

INDEX_NAME = ".index"
JOURNAL_NAME = ".index-journal"
JOURNAL_MAX = 64  # lines, before the index is written whole again
VERSION = 10
MAGIC = b"cni-reaper index 10\n"
HEAD = len(MAGIC) + 12  # the magic line, the length of the first part, the CRC-32 of each part
MAX_BYTES = 64 << 20


class Damaged(ValueError):
    """An entry of the index cannot be made (the file is then removed: the next call makes it anew)."""


# -- an entry's fields, declared once ---------------------------------------------------------------------
# An entry on disk is a list of its fields in this order (a journal line, and the whole index, where `dir` and
# `host` are positions in the index's tables of directories and hosts). Each field: the Entry attribute, the
# check of its JSON value (a journal line is checked field by field; `type(x) is int`: an int and no bool, for
# what JSON gives), and how a value that is not None is made from JSON and written to it.
def _int(x: Any) -> bool:
    return type(x) is int


def _str(x: Any) -> bool:
    return type(x) is str


def _bool(x: Any) -> bool:
    return x is True or x is False


def _ns(x: Any) -> bool:
    return type(x) is list and len(x) == 3 and _int(x[0]) and _int(x[1]) and (x[2] is None or _int(x[2]))


def _dir(x: Any) -> bool:
    if type(x) is not list or len(x) != 3 or type(x[2]) is not list:
        return False
    return _int(x[0]) and _int(x[1]) and all(type(g) is int for g in x[2])


def _host(x: Any) -> bool:
    return type(x) is list and len(x) == 4 and _str(x[0]) and _str(x[1]) and _int(x[2]) and _int(x[3])


def _veth(x: Any) -> bool:
    return type(x) is list and len(x) == 2 and _str(x[0]) and _int(x[1])


def _time(x: Any) -> bool:
    return type(x) is int or type(x) is float


def _left(x: Any) -> bool:
    return _bool(x) or ((type(x) is float or type(x) is int) and 0 <= x < 1 << 40)  # NaN, inf: no


def _strs(x: Any) -> bool:
    return type(x) is list and all(type(i) is str for i in x)


def _optional(check: Any) -> Any:
    return lambda x: x is None or check(x)


def _dir_value(x: Any) -> tuple:
    return (x[0], x[1], tuple(x[2]))


def _dir_json(d: tuple) -> list[Any]:
    return [d[0], d[1], list(d[2])]


FIELDS: tuple[tuple[str, Any, Any, Any], ...] = (  # (attribute, check: a type it is exactly or a test, from JSON, to JSON)
    ("ino", int, None, None),
    ("network", str, None, None),
    ("cid", str, None, None),
    ("ifname", str, None, None),
    ("netns", str, None, None),
    ("ns", _optional(_ns), tuple, list),  # (dev, ino, ctime)
    ("dir", _optional(_dir), _dir_value, _dir_json),  # (dev, ino, peer groups)
    ("host", _optional(_host), tuple, list),  # (boot, machine, netns, mnt)
    ("veth", _optional(_veth), tuple, list),  # (name, ifindex)
    ("deleted_at", _optional(_time), None, None),
    ("cached", _optional(_bool), None, None),
    ("verify", _bool, None, None),
    ("earlier", _bool, None, None),
    ("ips", _strs, None, None),
    ("cache_dir", _optional(_str), None, None),
    ("left", _left, None, None),
)
AT = {f[0]: i for i, f in enumerate(FIELDS)}
_CHECKS = tuple(f[1] for f in FIELDS)
_LOADS = tuple((i, f[2]) for i, f in enumerate(FIELDS) if f[2] is not None)
_DUMPS = tuple((i, f[3]) for i, f in enumerate(FIELDS) if f[3] is not None)
_ATTRS = tuple(f[0] for f in FIELDS)
NAMED = list(_ATTRS)  # the first part's "fields": what each position of an entry holds, by name
NETNS, NS, DIR, HOST, DELETED_AT, EARLIER = (AT[a] for a in ("netns", "ns", "dir", "host", "deleted_at", "earlier"))


def _values(v: list[Any]) -> list[Any]:
    """An entry's values (Entry's arguments, in order) from its fields as JSON holds them (`v` is changed)."""
    for i, load in _LOADS:
        if v[i] is not None:
            v[i] = load(v[i])
    return v


def _is_quick(v: list[Any]) -> bool:
    """quick_of's rule, on a compact list: no tombstone, no earlier lives, a pinned namespace, a known host."""
    ns = v[NS]
    return v[DELETED_AT] is None and not v[EARLIER] and bool(ns) and ns[2] is not None and v[HOST] >= 0


def encode(entries: dict[str, Entry], raw: dict[str, list[Any]], hosts: list[Any], dirs: list[Any]) -> bytes:
    """The bytes of `.index`: `entries` made (and `raw`: entries read and not made, as compact lists into
    `hosts` and `dirs`) as compact lists, with each record file's inode."""
    host_at: dict[Any, int] = {}
    dir_at: dict[Any, int] = {}
    out_hosts: list[Any] = []
    out_dirs: list[Any] = []

    def at(table: dict[Any, int], out: list[Any], value: Any, as_json: Any) -> int:
        if value is None:
            return -1
        if value not in table:
            table[value] = len(out)
            out.append(as_json)
        return table[value]

    body: dict[str, list[Any]] = {}
    for n, v in raw.items():  # read, never made: its host and directory looked up in the tables it came with
        h = hosts[v[HOST]] if v[HOST] >= 0 else None
        d = dirs[v[DIR]] if v[DIR] >= 0 else None
        body[n] = list(v)
        body[n][DIR] = at(dir_at, out_dirs, _dir_value(d) if d is not None else None, d)
        body[n][HOST] = at(host_at, out_hosts, tuple(h) if h is not None else None, h)
    for n, e in entries.items():
        body[n] = e.to_list()
        body[n][DIR] = at(dir_at, out_dirs, e.dir, body[n][DIR])
        body[n][HOST] = at(host_at, out_hosts, e.host, body[n][HOST])
    return _laid_out(body, out_hosts, out_dirs)


def _laid_out(body: dict[str, list[Any]], hosts: list[Any], dirs: list[Any]) -> bytes:
    """The file: the quick entries' names first, by host and netns directory, with their flat lists; their
    compact lists apart."""
    groups: dict[int, list[str]] = {}
    others = []
    for n, v in body.items():
        if _is_quick(v):
            groups.setdefault(v[HOST], []).append(n)
        else:
            others.append(n)
    names: list[str] = []
    quick = []
    for h, members in groups.items():
        members.sort(key=lambda n: _dir_of(body[n][NETNS]))  # a directory's paths side by side
        start = len(names)
        names += members
        ints = [x for n in members for x in body[n][NS]]
        runs, bases = split_paths([body[n][NETNS] for n in members])
        quick.append([hosts[h], start, len(names), [list(r) for r in runs], bases, ",".join(map(str, ints)),
                      digest(ints)])
    cold = [body[n] for n in names]
    names += others
    net, cid, ifname = AT["network"], AT["cid"], AT["ifname"]
    hot = {"fields": NAMED, "names": names, "inos": [body[n][AT["ino"]] for n in names],
           "attached": [attachment_name(body[n][net], body[n][cid], body[n][ifname]) for n in names],
           "quick": quick, "raw": [body[n] for n in others], "hosts": hosts, "dirs": dirs}
    return seal(jsonio.dumps(hot).encode(), jsonio.dumps(cold).encode())


def _dir_of(path: str) -> str:
    """The directory a path's name is in: the part before its last slash ("/" right under the root; "" for a
    path with no slash, a directory that cannot be opened)."""
    d = path.rpartition("/")[0]
    return d or ("/" if path.startswith("/") else "")


def split_paths(paths: list[str]) -> Runs:
    """Paths as runs of one directory (the part before the last slash; "/" for a path right under the root)
    and the names in it. What is no absolute path in a directory (no slash, a trailing one) keeps a run
    whose directory cannot be opened or a name that cannot be found there: judged in full, as a path that
    holds no namespace is."""
    runs: list[tuple[str, int]] = []
    bases: list[str] = []
    for path in paths:
        d, base = _dir_of(path), path.rpartition("/")[2]
        if runs and runs[-1][0] == d:
            runs[-1] = (d, runs[-1][1] + 1)
        else:
            runs.append((d, 1))
        bases.append(base)
    return runs, bases


def digest(ints: list[int]) -> int:
    """What the quick judgement compares a group's dev/ino/ctime triples by, all at once: Python's hash of
    them as one tuple (ints and tuples of ints hash alike in every process and build of CPython 3.8 and later;
    another build's differing hash only sends the group to the comparison one by one)."""
    return hash(tuple(ints))


def seal(first: bytes, second: bytes) -> bytes:
    """The file around its two parts: the magic line, the first one's length, a CRC-32 of each (the second
    one's checked only when it is read)."""
    import zlib

    return (MAGIC + len(first).to_bytes(4, "big") + zlib.crc32(first).to_bytes(4, "big")
            + zlib.crc32(second).to_bytes(4, "big") + first + second)


def sealed_by(data: bytes) -> bytes:
    """What tells one index file from another: its first part's length and its parts' CRC-32s."""
    return data[len(MAGIC):HEAD]


def _journal_head(seal: bytes) -> bytes:
    """The journal's first line: the index it extends (its seal)."""
    return b'["index", "' + seal.hex().encode() + b'"]'


def decode(data: bytes) -> tuple[dict[str, Any], bytes] | str | None:
    """(the first part, the second part's CRC and bytes) of `.index`; or why it cannot be used (None: it is of
    another version)."""
    import zlib

    if not data.startswith(MAGIC):
        return None
    m = len(MAGIC)
    end = HEAD + int.from_bytes(data[m:m + 4], "big")
    if len(data) < HEAD or end > len(data):
        return "its parts are cut"
    if zlib.crc32(memoryview(data)[HEAD:end]) != int.from_bytes(data[m + 4:m + 8], "big"):
        return "its checksum does not match (cut or damaged)"
    try:
        hot = jsonio.loads(data[HEAD:end])
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        return f"it does not parse: {str(exc)[:100]}"
    if not (type(hot) is dict and all(type(hot.get(k)) is list for k in _PARTS)):
        return "it holds no entries"
    if hot.get("fields") != NAMED:  # its entries hold other fields (another release's): made anew, as of another version
        return None
    return hot, data[m + 8:m + 12] + data[end:]


_PARTS = ("names", "inos", "attached", "quick", "raw", "hosts", "dirs")


def second_part(sealed: bytes) -> Any:
    """The second part as decode() gives it (its CRC, then it), parsed (ValueError when damaged)."""
    import zlib

    if len(sealed) < 4 or zlib.crc32(memoryview(sealed)[4:]) != int.from_bytes(sealed[:4], "big"):
        raise ValueError("its second part's checksum does not match (cut or damaged)")
    return jsonio.loads(sealed[4:])


def decode_all(data: bytes) -> tuple[dict[str, list[Any]], list[Any], list[Any]]:
    """Every entry of `.index` as a compact list (name -> list), with its tables (for tests and tools; a
    ValueError when it is not one)."""
    whole = decode(data)
    if not isinstance(whole, tuple):
        raise ValueError(whole or "another version")
    hot, cold = whole
    quick = second_part(cold)
    names = hot["names"]
    q = len(names) - len(hot["raw"])
    if type(quick) is not list or len(quick) != q:
        raise ValueError("its second part does not match its first")
    return dict(zip(names, quick + hot["raw"])), hot["hosts"], hot["dirs"]


def first_part(hot: dict[str, Any]) -> tuple[dict[str, int], list[str], list[tuple[tuple, int, int, Runs, str, int]],
                                              dict[str, list[Any]]]:
    """(name -> inode, the names, the quick entries' flat lists by host, the other entries' compact lists) of
    the first part of `.index`, its shape checked (ValueError, TypeError, IndexError when it is not one)."""
    names, inos, raw = hot["names"], hot["inos"], hot["raw"]
    by_name = dict(zip(names, inos))  # inodes of another type never equal the directory's (Index.load)
    if len(by_name) != len(names) or len(inos) != len(names) or len(hot["attached"]) != len(names):
        raise ValueError("a name twice, or a name without an inode or an attachment")
    "".join(hot["attached"])  # a TypeError for what is no string
    if not all_record_names(names):  # what Index.load takes for the directory's other files depends on it
        raise ValueError("a name that is no record file's")
    flat, at = [], 0
    for group in hot["quick"]:
        host, start, end, runs, bases, ints, dig = group
        host = tuple(host)
        if start != at or not _group_ok(host, end - start if type(end) is int else -1, runs, bases, ints, dig):
            raise ValueError("a group of quick entries is not one")
        flat.append((host, start, end, ([(d, k) for d, k in runs], bases), ints, dig))
        at = end
    if at + len(raw) != len(names):
        raise ValueError("the entries do not match the names")
    return by_name, names, flat, dict(zip(names[at:], raw))


def _group_ok(host: tuple, count: int, runs: Any, bases: Any, ints: Any, dig: Any) -> bool:
    """Whether a group of `count` quick entries has the shape first_part reads."""
    return (count >= 0 and len(host) == 4 and type(host[0]) is str and type(host[1]) is str
            and type(bases) is list and len(bases) == count and type(ints) is str and type(dig) is int
            and _runs_of(runs, count))


def _runs_of(runs: Any, count: int) -> bool:
    """Whether `runs` are runs of directories that cover `count` paths."""
    if type(runs) is not list:
        return False
    total = 0
    for run in runs:
        if type(run) is not list or len(run) != 2 or type(run[0]) is not str or type(run[1]) is not int or run[1] < 1:
            return False
        total += run[1]
    return total == count


def make(v: list[Any], hosts: list[Any], dirs: list[Any]) -> Entry:
    """The entry a compact list of a whole index holds (TypeError, ValueError or IndexError when it is not one)."""
    if len(v) != len(FIELDS):
        raise ValueError("an entry of another length")
    v = list(v)
    v[DIR] = dirs[v[DIR]] if v[DIR] >= 0 else None
    v[HOST] = hosts[v[HOST]] if v[HOST] >= 0 else None
    return Entry(*_values(v))


def quick_of(e: Entry) -> tuple | None:
    """(its host, (netns path, its namespace's (dev, ino, ctime))) of an entry for which LIVE, seen at its
    path, means nothing to do (no tombstone, no earlier lives, a pinned namespace recorded in a known host);
    None for the others (judged in full)."""
    if e.deleted_at is not None or e.earlier or e.ns is None or e.ns[2] is None or e.host is None:
        return None
    return e.host, (e.netns, e.ns)


class Entry:
    """One record's entry (a slotted class: `dataclasses` costs milliseconds to import on the hot path). Its
    parts are tuples: `ns` (dev, ino, ctime), `dir` (dev, ino, peer groups), `host` (boot, machine, netns, mnt),
    `veth` (name, ifindex)."""

    __slots__ = ("cache_dir", "cached", "cid", "deleted_at", "dir", "earlier", "host", "host_id", "ifname", "ino",
                 "ips", "key", "left", "netns", "netns_dir", "netns_id", "network", "ns", "verify", "veth", "veth_id")

    def __init__(self, ino: int, network: str, cid: str, ifname: str, netns: str, ns: tuple | None, dir_: tuple | None,
                 host: tuple | None, veth: tuple | None, deleted_at: float | None, cached: bool | None, verify: bool,
                 earlier: bool, ips: list[str], cache_dir: str | None, left: bool | float = False) -> None:
        self.ino, self.network, self.cid, self.ifname, self.netns = ino, network, cid, ifname, netns
        self.ns, self.dir, self.host, self.veth = ns, dir_, host, veth
        self.deleted_at, self.cached, self.verify, self.earlier = deleted_at, cached, verify, earlier
        self.ips, self.cache_dir = ips, cache_dir
        # record.left_mark: its leftovers wait for the runtime's DEL or GC (True), or something not ours holds
        # one and a sweep looks again after this time (a number)
        self.left = left
        # what the judgement reads, made once (an entry is made only when asked for): its key, and its evidence
        # as the record's own typed parts (evidence.Facts.of_entry reads them as it reads a record's life)
        self.key = Key(network, cid, ifname)
        self.netns_id = NetnsId(*ns) if ns else None
        self.netns_dir = DirId(*dir_) if dir_ else None
        self.host_id = HostId(*host) if host else None
        self.veth_id = Veth(*veth) if veth else None

    @classmethod
    def of_record(cls, record: Record, ino: int) -> Entry:
        cur, dead, s = record.current, record.deleted, record.settings
        n, d, h, v = cur.netns_id, cur.netns_dir, cur.host, cur.veth
        return cls(ino, record.network, record.container_id, record.ifname, cur.netns,
                   (n.dev, n.ino, n.ctime) if n else None, (d.dev, d.ino, d.groups) if d else None,
                   (h.boot, h.machine, h.netns, h.mnt) if h else None, (v.name, v.ifindex) if v else None,
                   parse_time(dead.at) if dead is not None else None,
                   dead.cached if dead is not None else None, dead.verify if dead is not None else False,
                   bool(record.earlier), sorted(ip.address for ip in cur.ips),
                   s.cni_cache_dir if s else None, True if record.schema > SCHEMA else record.left_mark)

    def to_list(self) -> list[Any]:
        """Its fields as JSON holds them (a journal line), in FIELDS' order."""
        out = [getattr(self, a) for a in _ATTRS]
        for i, dump in _DUMPS:
            if out[i] is not None:
                out[i] = dump(out[i])
        return out

    @classmethod
    def of_list(cls, v: Any) -> Entry | None:
        """The entry a journal line holds, or None when it is not one (each field checked as FIELDS says)."""
        if type(v) is not list or len(v) != len(FIELDS):
            return None
        for check, x in zip(_CHECKS, v):
            if not (type(x) is check if type(check) is type else check(x)):
                return None
        return cls(*_values(list(v)))



def _journal_changes(lines: list[bytes]) -> list[tuple[str, Entry | None]] | None:
    """The index journal's changes (record name, its entry or None: removed); None when a line cannot be used
    (the index is then made anew)."""
    out: list[tuple[str, Entry | None]] = []
    try:
        # one parse for all of its lines (a line cut or damaged fails it all, as it would alone)
        changes = jsonio.loads(b"[" + b",".join(lines) + b"]") if lines else []
        if len(changes) != len(lines):  # a line holding two documents
            raise ValueError("a journal line is not one change")
        for name, v in changes:
            e = None if v is None else Entry.of_list(v)
            if (v is not None and e is None) or not isinstance(name, str) or not is_record_name(name):
                log.warn("index journal line unusable; index made anew from the records", record=str(name)[:80])
                return None
            out.append((name, e))
    except (ValueError, TypeError, RecursionError, UnicodeDecodeError):
        log.warn("index journal does not parse; index made anew from the records")
        return None
    return out

class QuickGroup:
    """One host's entries that the quick judgement can judge, as `.index` holds them: their record file names,
    their netns paths as runs of one directory (`dirs`: (directory, how many)) and the names in it (`bases`),
    their namespaces' (dev, ino, ctime) as decimals joined by commas (`ints`) and the digest of them all."""

    __slots__ = ("bases", "boot", "digest", "dirs", "ints", "machine", "names")

    def __init__(self, host: tuple, names: list[str], runs: Runs, ints: str, digest: int) -> None:
        self.boot, self.machine, self.names = host[0], host[1], names
        self.dirs, self.bases = runs
        self.ints, self.digest = ints, digest


class QuickSaved:
    """One host's entries that the quick judgement can judge, saved since the index was read: their record
    file names, netns paths, and their namespaces' (dev, ino, ctime) one after another (`ints`)."""

    __slots__ = ("boot", "ints", "machine", "names", "paths")

    def __init__(self, host: tuple, group: dict[str, tuple]) -> None:
        self.boot, self.machine, self.names = host[0], host[1], list(group)
        self.paths = [path for path, _ in group.values()]
        self.ints = [x for _, ident in group.values() for x in ident]


class QuickView:
    """What the quick judgement reads (evidence.live_at_path): the groups as read, those saved since, and the
    names whose groups as read are void (saved or removed since)."""

    __slots__ = ("groups", "saved", "void")

    def __init__(self, groups: list[QuickGroup], saved: list[QuickSaved], void: set[str]) -> None:
        self.groups, self.saved, self.void = groups, saved, void


class IndexJournal:
    """`.index-journal`: the changes since `.index` was written whole, one JSON line each, after a head line that
    names the index they extend (its seal), so that they are applied to that index alone: not to one written by
    a call cut before it removed the journal, nor to another release's beside it."""

    def __init__(self, sd: SafeDir) -> None:
        self.sd = sd
        self.lines = 0  # its lines, the head included, as far as this call knows
        self.seal: bytes | None = None  # the index on disk it extends (None: none of ours; nothing is journaled)
        self.pending: list[bytes] = []  # lines of a batch of removals, written at flush()

    def changes(self, seal: bytes) -> list[tuple[str, Entry | None]] | None:
        """The changes written beside the index of `seal` (None: the journal cannot be used, and the index is
        made anew from the records)."""
        self.seal = seal
        journal, _ = self.sd.read(JOURNAL_NAME, MAX_BYTES)
        lines = (journal or b"").splitlines()
        self.lines = len(lines)
        if lines and lines[0] != _journal_head(seal):  # written beside another index: its lines may hold other fields
            log.warn("index journal is not this index's; index made anew from the records")
            return None
        return _journal_changes(lines[1:])

    def too_long(self, more: int = 0) -> bool:
        return self.lines + more > JOURNAL_MAX

    def append(self, lines: bytes, count: int) -> bool:
        """`count` lines appended; False when the index is to be written whole instead (too long, or the append
        failed). With no index of ours on disk, nothing is written (the next call makes the index anew)."""
        if self.seal is None:
            return True
        if self.too_long(count):
            return False
        if self.lines == 0:  # a journal begins with the index it extends
            lines, count = _journal_head(self.seal) + b"\n" + lines, count + 1
        try:
            self.sd.append(JOURNAL_NAME, lines)
        except OSError:
            return False
        self.lines += count
        return True

    def emptied(self, seal: bytes) -> OSError | None:
        """The journal removed once the index of `seal` is written whole (the error when it cannot be)."""
        self.seal = seal
        kept = self.sd.unlink_or_error(JOURNAL_NAME)
        if kept is None:
            self.lines = 0
        return kept


class Index:
    """The index of one state directory, valid while its lock is held. `inos` names every record file;
    `quick_view()` is what the quick judgement reads (evidence.live_at_path); `entries` makes every entry."""

    def __init__(self, sd: SafeDir) -> None:
        self.sd = sd
        self.inos: dict[str, int] = {}  # record file name -> inode
        # host -> {record file name -> quick_of(its entry)[1]}, for entries saved since the index was read
        self.quick: dict[tuple, dict[str, tuple]] = {}
        self._raw: dict[str, list[Any]] = {}  # entries read and not made yet: name -> compact list
        self._hosts: list[Any] = []  # the tables the compact lists point into
        self._dirs: list[Any] = []
        self._made: dict[str, Entry] = {}
        # as `.index` holds them: every name (the quick entries first, by host), the quick entries' flat lists
        # by host (host, start, end, netns paths as runs, dev/ino/ctime triples), the quick entries' compact lists
        # (its second part, parsed when one is asked for), the names changed since (whose flat lists are void)
        self._names: list[str] = []
        self._attached: list[str] = []  # libcni's name of each of `_names`' attachments (Index.attached)
        self._flat: list[tuple[tuple, int, int, Runs, str, int]] = []
        self._cold: bytes | None = None
        self._changed: set[str] = set()
        self.journal = IndexJournal(sd)
        self.others: list[str] | None = None  # load(): the directory's names that are no record files

    @property
    def entries(self) -> dict[str, Entry]:
        """Every entry (record file name -> entry), made now if not yet."""
        self._read_cold()
        self._make(list(self._raw))
        return self._made

    def attached(self) -> set[str]:
        """libcni's names of every record's attachment (state/names.attachment_name), from the first part
        and the entries changed since it was written: no entry is made, the second part is not read (an ADD
        that maps host ports asks it when libcni caches anything; making 1,000 entries costs ~5 ms)."""
        changed, made = self._changed, self._made
        out = {a for n, a in zip(self._names, self._attached) if n not in changed}
        out.update(attachment_name(*made[n].key) for n in changed if n in made)
        return out

    def entries_but(self, names: set[str]) -> dict[str, Entry]:
        """The entries of every record file but `names`."""
        made = self._made
        want = [n for n in self.inos if n not in names and n not in made]
        if want and self._cold is not None and any(n not in self._raw for n in want):
            self._read_cold()
        self._make(want)
        return {n: e for n, e in made.items() if n not in names}

    def quick_view(self) -> QuickView:
        """What the quick judgement reads (QuickView)."""
        names = self._names
        return QuickView([QuickGroup(h, names[a:b], p, i, d) for h, a, b, p, i, d in self._flat],
                         [QuickSaved(h, group) for h, group in self.quick.items() if group], self._changed)

    def _make(self, names: list[str]) -> None:
        for n in names:
            try:
                self._made[n] = make(self._raw.pop(n), self._hosts, self._dirs)
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                self._unusable()
                raise Damaged(f"index entry {n[:80]} cannot be read ({type(exc).__name__}): the index is made anew "
                              "by the next call") from None

    def _read_cold(self) -> None:
        """The quick entries' compact lists, from the second part of `.index` (once)."""
        if self._cold is None:
            return
        cold, self._cold = self._cold, None
        try:
            lists = second_part(cold)
            if type(lists) is not list or len(lists) != (self._flat[-1][2] if self._flat else 0):
                raise ValueError("its second part does not match its first")
        except (ValueError, RecursionError, UnicodeDecodeError) as exc:
            self._unusable()
            raise Damaged(f"the index cannot be read ({str(exc)[:80]}): it is made anew by the next call") from None
        changed, raw = self._changed, self._raw
        for n, v in zip(self._names, lists):
            if n not in changed:
                raw[n] = v

    def _unusable(self) -> None:
        self.journal.seal = None
        if not self.sd.read_only:
            try:
                self.sd.unlink(INDEX_NAME)
            except OSError:
                pass

    def _reset(self) -> None:
        self.inos, self.quick, self._raw, self._made = {}, {}, {}, {}
        self._names, self._attached, self._flat, self._cold, self._changed = [], [], [], None, set()

    def load(self, found: dict[str, int]) -> bool:
        """Take the index on disk if it agrees with `found` (the directory's entries: name -> inode); False when
        it must be made anew (then the caller rebuilds it from the records). `others` is then the names of
        `found` that are no record files, when the index could be read (None otherwise)."""
        if not self._read():
            self._reset()
            return False
        self.others = others_in(found, self.inos)
        if len(found) - len(self.others) != len(self.inos) or not self.inos.items() <= found.items():
            self._reset()
            return False
        if self.journal.too_long():
            self.write_whole()
        return True

    def _read(self) -> bool:
        data, why = self.sd.read(INDEX_NAME, MAX_BYTES)
        whole = decode(data) if data is not None else why
        if whole is None or isinstance(whole, str):
            if whole:
                log.warn("index unusable; made anew from the records", problem=whole)
            return False
        try:
            self._take(*whole)
        except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
            log.warn("index unusable; made anew from the records", problem=f"an entry is not one ({type(exc).__name__})")
            return False
        assert data is not None
        changes = self.journal.changes(sealed_by(data))
        for name, e in changes or []:
            self.put(name, e)
        return changes is not None

    def _take(self, hot: dict[str, Any], cold: bytes) -> None:
        self.inos, self._names, self._flat, self._raw = first_part(hot)
        self._attached = hot["attached"]
        self._cold, self._hosts, self._dirs = cold, hot["hosts"], hot["dirs"]

    def put(self, name: str, entry: Entry | None) -> None:
        """The index in memory: a record's entry, or its removal (None)."""
        self._raw.pop(name, None)
        self._changed.add(name)
        for group in self.quick.values():
            group.pop(name, None)
        if entry is None:
            self._made.pop(name, None)
            self.inos.pop(name, None)
            return
        self._made[name] = entry
        self.inos[name] = entry.ino
        q = quick_of(entry)
        if q is not None:
            self.quick.setdefault(q[0], {})[name] = q[1]

    def set(self, name: str, entry: Entry | None, write: bool = True) -> None:
        """One record saved (entry) or removed (None): the index in memory, and one journal line (an ADD
        writes a line, not the whole index). With write=False, flush() writes the lines later."""
        self.put(name, entry)
        line = jsonio.dumps([name, entry.to_list() if entry else None]).encode() + b"\n"
        if write:
            self._append(line, 1)
        else:
            self.journal.pending.append(line)

    def drop(self, name: str) -> None:
        """Forget a record that was moved aside (the next write of the index has it right)."""
        if name in self.inos:
            self.put(name, None)
            self.write_whole()

    def flush(self) -> None:
        pending = self.journal.pending
        if pending:
            self._append(b"".join(pending), len(pending))
        self.journal.pending = []

    def _append(self, lines: bytes, count: int) -> None:
        if not self.journal.append(lines, count):
            self.write_whole()

    def write_whole(self) -> None:
        """The index written whole, and the journal emptied. Not fsynced: a lost or stale index is found out
        and made anew (load())."""
        try:
            self._read_cold()
            data = encode(self._made, self._raw, self._hosts, self._dirs)
        except (ValueError, TypeError, IndexError, KeyError) as exc:  # an entry read that is not one
            log.warn("index unusable; made anew by the next call", problem=type(exc).__name__)
            self._unusable()
            return
        try:
            self.sd.write(INDEX_NAME, data)
        except OSError:  # the index on disk is not this one (another's, or stale): the next call makes it anew
            self._unusable()
            return
        kept = self.journal.emptied(sealed_by(data))
        if kept is not None:  # something not ours holds the journal's name: the index is made anew by each call
            log.warn("index journal cannot be replaced", problem=kept.strerror, fix=f"remove {self.sd.root}/{JOURNAL_NAME}")
            self._unusable()
