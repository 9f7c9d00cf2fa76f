"""The index of the state directory: per record file, what deciding "is anything stale" takes (its key, what
proves its current life alive or dead, its tombstone, whether it has earlier lives, its addresses), so that
with nothing stale a verb reads one small file instead of every record (README, Performance).

It is a cache: `.index` (written whole) plus `.index-journal` (one JSON line per change since), checked
against one scan of the directory (names and inodes: no stat, no read); anything that does not agree, does
not parse or is not an entry of this version makes it anew from the records, with a log line. Every save
and removal under the lock keeps it current.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.state.safedir import SafeDir

from cni_reaper import jsonio, log
from cni_reaper.state.record import parse_time

INDEX_NAME = ".index"
JOURNAL_NAME = ".index-journal"
JOURNAL_MAX = 64  # lines, before the index is written whole again
VERSION = 4
MAX_BYTES = 64 << 20


class Entry:
    """One record's entry (a slotted class: `dataclasses` costs milliseconds to import on the hot path)."""

    __slots__ = ("cache_dir", "cached", "cid", "deleted_at", "dir", "earlier", "host", "ifname", "ino", "ips",
                 "left", "netns", "network", "ns", "verify", "veth")

    def __init__(self, ino: int, network: str, cid: str, ifname: str, netns: str, ns: tuple | None, dir_: tuple | None,
                 host: dict[str, Any] | None, veth: dict[str, Any] | None, deleted_at: float | None,
                 cached: bool | None, verify: bool, earlier: bool, ips: list[str], cache_dir: str | None,
                 left: bool = False) -> None:
        self.ino, self.network, self.cid, self.ifname, self.netns = ino, network, cid, ifname, netns
        self.ns, self.dir, self.host, self.veth = ns, dir_, host, veth
        self.deleted_at, self.cached, self.verify, self.earlier = deleted_at, cached, verify, earlier
        self.ips, self.cache_dir = ips, cache_dir
        self.left = left  # its leftovers wait for the runtime's DEL or GC (record.left)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.network, self.cid, self.ifname)

    @classmethod
    def of_record(cls, record: dict[str, Any], ino: int) -> Entry:
        cur, dead, s = record["current"], record["deleted"], record["settings"]
        n, d = cur["netnsId"], cur["netnsDir"]
        return cls(ino, record["network"], record["containerID"], record["ifname"], cur["netns"],
                   (n["dev"], n["ino"], n["ctime"]) if n else None, (d["dev"], d["ino"], tuple(d["groups"])) if d else None,
                   cur["host"], cur["veth"], parse_time(dead["at"]) if dead is not None else None,
                   dead["cached"] if dead is not None else None, dead["verify"] if dead is not None else False,
                   bool(record["earlier"]), sorted(ip["address"] for ip in cur["ips"]),
                   s["cniCacheDir"] if s else None, bool(record.get("left")))

    def to_list(self) -> list[Any]:
        h, v = self.host, self.veth
        d = self.dir
        return [self.ino, self.network, self.cid, self.ifname, self.netns, list(self.ns) if self.ns else None,
                [d[0], d[1], list(d[2])] if d else None, [h["boot"], h["machine"], h["netns"], h["mnt"]] if h else None,
                [v["name"], v["ifindex"]] if v else None, self.deleted_at, self.cached, self.verify, self.earlier,
                self.ips, self.cache_dir, self.left]

    @classmethod
    def of_list(cls, v: Any) -> Entry | None:
        """The entry a line of the index holds, or None when it is not one."""
        try:
            ino, network, cid, ifname, netns, ns, dir_, host, veth, at, cached, verify, earlier, ips, cache_dir, left = v
        except (TypeError, ValueError):
            return None
        # `type(x) is int`: an int and not a bool, for what JSON gives; inline, for 1,000 entries a call
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
                and (earlier is True or earlier is False) and (left is True or left is False)
                and type(ips) is lst and all(type(x) is t for x in ips)
                and (cache_dir is None or type(cache_dir) is t)):
            return None
        return cls(ino, network, cid, ifname, netns, tuple(ns) if ns else None,
                   (dir_[0], dir_[1], tuple(dir_[2])) if dir_ else None,
                   {"boot": host[0], "machine": host[1], "netns": host[2], "mnt": host[3]} if host else None,
                   {"name": veth[0], "ifindex": veth[1]} if veth else None, at, cached, verify, earlier, ips, cache_dir,
                   left)


class Index:
    """The index of one state directory, valid while its lock is held."""

    def __init__(self, sd: SafeDir) -> None:
        self.sd = sd
        self.entries: dict[str, Entry] = {}  # record file name -> entry
        self._journal_lines = 0
        self._pending: list[bytes] = []  # journal lines of a batch of removals, written at flush()

    def load(self, found: dict[str, int]) -> bool:
        """Take the index on disk if it agrees with `found` (record file name -> inode); False when it must be
        made anew (then the caller rebuilds it from the records)."""
        cached = self._read()
        if cached is None or len(cached) != len(found) or any(found.get(n) != e.ino for n, e in cached.items()):
            return False
        self.entries = cached
        if self._journal_lines > JOURNAL_MAX:
            self.write_whole()
        return True

    def _read(self) -> dict[str, Entry] | None:
        data, why = self.sd.read(INDEX_NAME, MAX_BYTES)
        if data is None:
            if why:
                log.warn("index unusable; made anew from the records", problem=why)
            return None
        try:
            doc = jsonio.loads(data)
            if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("entries"), dict):
                return None
            raw = dict(doc["entries"])
            journal, _ = self.sd.read(JOURNAL_NAME, MAX_BYTES)
            lines = (journal or b"").splitlines()
            self._journal_lines = len(lines)
            for line in lines:
                name, entry = jsonio.loads(line)
                if entry is None:
                    raw.pop(name, None)
                else:
                    raw[name] = entry
        except (ValueError, TypeError, RecursionError, UnicodeDecodeError):
            log.warn("index or its journal does not parse; made anew from the records")
            return None
        out = {}
        for name, v in raw.items():
            e = Entry.of_list(v)
            if e is None or not isinstance(name, str):
                log.warn("index entry unusable; index made anew from the records", record=str(name)[:80])
                return None
            out[name] = e
        return out

    def set(self, name: str, entry: Entry | None, write: bool = True) -> None:
        """One record saved (entry) or removed (None): the index in memory, and one journal line (an ADD
        writes a line, not the whole index). With write=False, flush() writes the lines later."""
        if entry is None:
            self.entries.pop(name, None)
        else:
            self.entries[name] = entry
        line = jsonio.dumps([name, entry.to_list() if entry else None]).encode() + b"\n"
        if write:
            self._append(line, 1)
        else:
            self._pending.append(line)

    def drop(self, name: str) -> None:
        """Forget a record that was moved aside (the next write of the index has it right)."""
        if self.entries.pop(name, None) is not None:
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
        doc = {"version": VERSION, "entries": {n: e.to_list() for n, e in self.entries.items()}}
        try:
            self.sd.write(INDEX_NAME, jsonio.dumps(doc).encode())
        except OSError:
            return
        self.sd.unlink(JOURNAL_NAME)
        self._journal_lines = 0
