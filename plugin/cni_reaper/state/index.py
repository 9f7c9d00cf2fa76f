"""The index of the state directory: per record file, what deciding "is anything stale" takes (its key, what
proves its current life alive or dead, its tombstone, whether it has earlier lives, its addresses), so that
with nothing stale a verb reads one small file instead of every record (README, Performance).

It is a cache: `.index` (written whole) plus `.index-journal` (one JSON line per change since, each entry
checked field by field), checked against one scan of the directory (names and inodes: no stat, no read);
anything that does not agree, does not parse or is not an entry of this version makes it anew from the
records, with a log line. Every save and removal under the lock keeps it current.

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

    from cni_reaper.state.safedir import SafeDir

    # the netns paths of a quick group: runs of (directory, how many of the group's paths are in it), and the
    # names in those directories, in the group's order
    Runs = tuple[list[tuple[str, int]], list[str]]
    # what the quick judgement reads (Index.quick_view): the flat lists as read, by host (host, names, netns
    # paths as runs, dev/ino/ctime triples as decimals joined by commas, their digest); the entries saved
    # since, by host ({name: (netns path, (dev, ino, ctime))}); the names whose flat lists are void
    QuickView = tuple[list[tuple[tuple, list[str], Runs, str, int]], dict[tuple, dict[str, tuple]], set[str]]

from cni_reaper import jsonio, log
from cni_reaper.state.names import all_record_names, is_record_name, others_in
from cni_reaper.state.record import left_mark, parse_time

INDEX_NAME = ".index"
JOURNAL_NAME = ".index-journal"
JOURNAL_MAX = 64  # lines, before the index is written whole again
VERSION = 8
MAGIC = b"cni-reaper index 8\n"
HEAD = len(MAGIC) + 12  # the magic line, the length of the first part, the CRC-32 of each part
MAX_BYTES = 64 << 20


class Damaged(ValueError):
    """An entry of the index cannot be made (the file is then removed: the next call makes it anew)."""


def _is_quick(v: list[Any]) -> bool:
    """quick_of's rule, on a compact list: no tombstone, no earlier lives, a pinned namespace, a known host."""
    ns = v[5]
    return v[9] is None and not v[12] and bool(ns) and ns[2] is not None and v[7] >= 0


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
        h = hosts[v[7]] if v[7] >= 0 else None
        d = dirs[v[6]] if v[6] >= 0 else None
        hk = tuple(h) if h is not None else None
        dk = (d[0], d[1], tuple(d[2])) if d is not None else None
        body[n] = [*v[:6], at(dir_at, out_dirs, dk, d), at(host_at, out_hosts, hk, h), *v[8:]]
    for n, e in entries.items():
        d = e.dir
        body[n] = [e.ino, e.network, e.cid, e.ifname, e.netns, list(e.ns) if e.ns else None,
                   at(dir_at, out_dirs, d, [d[0], d[1], list(d[2])] if d else None),
                   at(host_at, out_hosts, e.host, list(e.host) if e.host else None),
                   list(e.veth) if e.veth else None, e.deleted_at, e.cached, e.verify, e.earlier, e.ips, e.cache_dir,
                   e.left]
    return _laid_out(body, out_hosts, out_dirs)


def _laid_out(body: dict[str, list[Any]], hosts: list[Any], dirs: list[Any]) -> bytes:
    """The file: the quick entries' names first, by host and netns directory, with their flat lists; their
    compact lists apart."""
    groups: dict[int, list[str]] = {}
    others = []
    for n, v in body.items():
        if _is_quick(v):
            groups.setdefault(v[7], []).append(n)
        else:
            others.append(n)
    names: list[str] = []
    quick = []
    for h, members in groups.items():
        members.sort(key=lambda n: _dir_of(body[n][4]))  # a directory's paths side by side
        start = len(names)
        names += members
        ints = [x for n in members for x in body[n][5]]
        runs, bases = split_paths([body[n][4] for n in members])
        quick.append([hosts[h], start, len(names), [list(r) for r in runs], bases, ",".join(map(str, ints)),
                      digest(ints)])
    cold = [body[n] for n in names]
    names += others
    hot = {"names": names, "inos": [body[n][0] for n in names], "quick": quick, "raw": [body[n] for n in others],
           "hosts": hosts, "dirs": dirs}
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
    if not (type(hot) is dict and all(type(hot.get(k)) is list for k in ("names", "inos", "quick", "raw", "hosts", "dirs"))):
        return "it holds no entries"
    return hot, data[m + 8:m + 12] + data[end:]


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
    if len(by_name) != len(names) or len(inos) != len(names):
        raise ValueError("a name twice, or a name without an inode")
    if not all_record_names(names):  # what Index.load takes for the directory's other files depends on it
        raise ValueError("a name that is no record file's")
    flat, at = [], 0
    for group in hot["quick"]:
        host, start, end, runs, bases, ints, dig = group
        host = tuple(host)
        if (start != at or type(end) is not int or end < start or len(host) != 4 or type(host[0]) is not str
                or type(host[1]) is not str or type(bases) is not list or len(bases) != end - start
                or type(ints) is not str or type(dig) is not int or not _runs_of(runs, end - start)):
            raise ValueError("a group of quick entries is not one")
        flat.append((host, start, end, ([(d, k) for d, k in runs], bases), ints, dig))
        at = end
    if at + len(raw) != len(names):
        raise ValueError("the entries do not match the names")
    return by_name, names, flat, dict(zip(names[at:], raw))


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
    ino, network, cid, ifname, netns, ns, d, h, veth, at, cached, verify, earlier, ips, cache_dir, left = v
    dir_ = dirs[d] if d >= 0 else None
    host = hosts[h] if h >= 0 else None
    return Entry(ino, network, cid, ifname, netns, tuple(ns) if ns else None,
                 (dir_[0], dir_[1], tuple(dir_[2])) if dir_ else None, tuple(host) if host else None,
                 tuple(veth) if veth else None, at, cached, verify, earlier, ips, cache_dir, left)


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

    __slots__ = ("cache_dir", "cached", "cid", "deleted_at", "dir", "earlier", "host", "ifname", "ino", "ips",
                 "left", "netns", "network", "ns", "verify", "veth")

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

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.network, self.cid, self.ifname)

    @classmethod
    def of_record(cls, record: dict[str, Any], ino: int) -> Entry:
        cur, dead, s = record["current"], record["deleted"], record["settings"]
        n, d, h, v = cur["netnsId"], cur["netnsDir"], cur["host"], cur["veth"]
        return cls(ino, record["network"], record["containerID"], record["ifname"], cur["netns"],
                   (n["dev"], n["ino"], n["ctime"]) if n else None, (d["dev"], d["ino"], tuple(d["groups"])) if d else None,
                   (h["boot"], h["machine"], h["netns"], h["mnt"]) if h else None, (v["name"], v["ifindex"]) if v else None,
                   parse_time(dead["at"]) if dead is not None else None,
                   dead["cached"] if dead is not None else None, dead["verify"] if dead is not None else False,
                   bool(record["earlier"]), sorted(ip["address"] for ip in cur["ips"]),
                   s["cniCacheDir"] if s else None, left_mark(record))

    def to_list(self) -> list[Any]:
        """Its fields as JSON holds them (a journal line)."""
        d = self.dir
        return [self.ino, self.network, self.cid, self.ifname, self.netns, list(self.ns) if self.ns else None,
                [d[0], d[1], list(d[2])] if d else None, list(self.host) if self.host else None,
                list(self.veth) if self.veth else None, self.deleted_at, self.cached, self.verify, self.earlier,
                self.ips, self.cache_dir, self.left]

    @classmethod
    def of_list(cls, v: Any) -> Entry | None:
        """The entry a journal line holds, or None when it is not one."""
        try:
            ino, network, cid, ifname, netns, ns, dir_, host, veth, at, cached, verify, earlier, ips, cache_dir, left = v
        except (TypeError, ValueError):
            return None
        # `type(x) is int`: an int and not a bool, for what JSON gives
        i, t, lst = int, str, list
        if not (type(ino) is i and type(network) is t and type(cid) is t and type(ifname) is t and type(netns) is t
                and (ns is None or (type(ns) is lst and len(ns) == 3 and type(ns[0]) is i and type(ns[1]) is i
                                    and (ns[2] is None or type(ns[2]) is i)))
                and (dir_ is None or (type(dir_) is lst and len(dir_) == 3 and type(dir_[0]) is i and type(dir_[1]) is i
                                      and type(dir_[2]) is lst and all(type(g) is i for g in dir_[2])))
                and (host is None or (type(host) is lst and len(host) == 4 and type(host[0]) is t
                                      and type(host[1]) is t and type(host[2]) is i and type(host[3]) is i))
                and (veth is None or (type(veth) is lst and len(veth) == 2 and type(veth[0]) is t
                                      and type(veth[1]) is i))
                and (at is None or type(at) is i or type(at) is float)
                and (cached is None or cached is True or cached is False) and (verify is True or verify is False)
                and (earlier is True or earlier is False)
                and (left is True or left is False
                     or ((type(left) is float or type(left) is int) and 0 <= left < 1 << 40))  # NaN, inf: no
                and type(ips) is lst and all(type(x) is t for x in ips)
                and (cache_dir is None or type(cache_dir) is t)):
            return None
        return cls(ino, network, cid, ifname, netns, tuple(ns) if ns else None,
                   (dir_[0], dir_[1], tuple(dir_[2])) if dir_ else None, tuple(host) if host else None,
                   tuple(veth) if veth else None, at, cached, verify, earlier, ips, cache_dir, left)


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
        self._flat: list[tuple[tuple, int, int, Runs, str, int]] = []
        self._cold: bytes | None = None
        self._changed: set[str] = set()
        self._journal_lines = 0
        self._pending: list[bytes] = []  # journal lines of a batch of removals, written at flush()
        self.others: list[str] | None = None  # load(): the directory's names that are no record files

    @property
    def entries(self) -> dict[str, Entry]:
        """Every entry (record file name -> entry), made now if not yet."""
        self._read_cold()
        self._make(list(self._raw))
        return self._made

    def entries_but(self, names: set[str]) -> dict[str, Entry]:
        """The entries of every record file but `names`."""
        made = self._made
        want = [n for n in self.inos if n not in names and n not in made]
        if want and self._cold is not None and any(n not in self._raw for n in want):
            self._read_cold()
        self._make(want)
        return {n: e for n, e in made.items() if n not in names}

    def quick_view(self) -> QuickView:
        """(the flat lists as read, by host: (host, names, netns paths as runs, dev/ino/ctime triples as
        written, their digest); the entries saved since, by host: {name: (netns path, (dev, ino, ctime))}; the
        names whose flat lists are void)."""
        names = self._names
        return [(h, names[a:b], p, i, d) for h, a, b, p, i, d in self._flat], self.quick, self._changed

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
        if not self.sd.read_only:
            try:
                self.sd.unlink(INDEX_NAME)
            except OSError:
                pass

    def _reset(self) -> None:
        self.inos, self.quick, self._raw, self._made = {}, {}, {}, {}
        self._names, self._flat, self._cold, self._changed = [], [], None, set()

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
        if self._journal_lines > JOURNAL_MAX:
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
        journal, _ = self.sd.read(JOURNAL_NAME, MAX_BYTES)
        lines = (journal or b"").splitlines()
        self._journal_lines = len(lines)
        try:
            # one parse for all of its lines (a line cut or damaged fails it all, as it would alone)
            changes = jsonio.loads(b"[" + b",".join(lines) + b"]") if lines else []
            if len(changes) != len(lines):  # a line holding two documents
                raise ValueError("a journal line is not one change")
            for name, v in changes:
                e = None if v is None else Entry.of_list(v)
                if (v is not None and e is None) or not isinstance(name, str) or not is_record_name(name):
                    log.warn("index journal line unusable; index made anew from the records", record=str(name)[:80])
                    return False
                self.put(name, e)
        except (ValueError, TypeError, RecursionError, UnicodeDecodeError):
            log.warn("index journal does not parse; index made anew from the records")
            return False
        return True

    def _take(self, hot: dict[str, Any], cold: bytes) -> None:
        self.inos, self._names, self._flat, self._raw = first_part(hot)
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
            self._pending.append(line)

    def drop(self, name: str) -> None:
        """Forget a record that was moved aside (the next write of the index has it right)."""
        if name in self.inos:
            self.put(name, None)
            self.write_whole()

    def flush(self) -> None:
        if self._pending:
            self._append(b"".join(self._pending), len(self._pending))
        self._pending = []

    def _append(self, lines: bytes, count: int) -> None:
        if self._journal_lines + count > JOURNAL_MAX:
            self.write_whole()
            return
        try:
            self.sd.append(JOURNAL_NAME, lines)
            self._journal_lines += count
        except OSError:
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
        except OSError:
            return
        self.sd.unlink(JOURNAL_NAME)
        self._journal_lines = 0
