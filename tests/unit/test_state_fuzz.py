"""Damaged state never blocks anyone, and cni-reaper never writes what its own reader refuses.

- A fuzzer over the state directory: every field of a record, the index and its journal damaged (wrong
  types, values past every limit, sizes at and past the read limits, cut lines): ADD, CHECK, DEL and STATUS
  of another attachment always succeed (never the internal error code, never a traceback), in bounded time.
- Records made through the writer from generated inputs (IDs, ifnames, netns paths, addresses, port
  mappings, CNI_ARGS at their limits, earlier lives up to the bound) are read back equal by the reader, and
  the largest stays under the read limit.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cni_reaper.state import record as rec
from cni_reaper.state.index import INDEX_NAME, JOURNAL_NAME, MAGIC, Entry
from cni_reaper.state.store import Store, record_name
from testkit.cni import NETNS, conf, invoke, prev_result

pytestmark = pytest.mark.usefixtures("private_host")  # verbs in process: a throwaway netns and mount ns
EXAMPLES = int(os.environ.get("CNI_REAPER_FUZZ_EXAMPLES", "1000"))
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64), st.floats(allow_nan=True), st.text(max_size=8),
                 st.sampled_from(["", "2026-11-29T19:33:41-00:00", "2026-11-29T19:33:41+00:00", "9999-12-31T23:59:59Z",
                                  "x" * (rec.MAX_TEXT + 1), "/var/run/netns/x", "veth00000000"]),
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _observed(netns: str, parts: dict) -> rec.Life:
    """What probes.observe_life would have found (the parts given as their documents)."""
    return rec.Life.of(dict(parts, netns=netns, ips=[], portMappings=[], createdAt=""))


def _good_record(i: int) -> dict:
    observed = {"netnsId": {"dev": 4, "ino": 4026532000 + i, "ctime": 1}, "netnsDir": {"dev": 1, "ino": 2, "groups": [1]},
                "host": {"boot": "b", "machine": "m", "netns": 1, "mnt": 1}, "veth": {"name": f"veth{i:08x}", "ifindex": 9}}
    life = rec.life(_observed(f"/var/run/netns/fuzz-{i}", observed),
                    [rec.RecordedIP(f"10.9.0.{i + 2}", 24, 4, rec.ReservationId("/d", 1, 3, 4, 5))],
                    [rec.RecordedPortMapping(9000 + i, 80, "tcp", "")])
    r, _ = rec.merge(None, "nomad-reaper", f"other-{i}", "eth0", life, {"K": "V"}, rec.RecordSettings("/d", "/c", "auto"))
    r = r.replace(earlier=(life,))
    if i % 2:
        r = r.replace(deleted=rec.tombstone(True, True, True, True, cached=True))
    return json.loads(json.dumps(r.doc()))


def _places(doc, prefix=()):
    if isinstance(doc, dict):
        for k in list(doc):
            yield prefix + (k,), doc
            yield from _places(doc[k], prefix + (k,))
    elif isinstance(doc, list):
        for i in range(len(doc)):
            yield prefix + (i,), doc
            yield from _places(doc[i], prefix + (i,))


def _sealed(hot: bytes, cold: bytes = b"[]", length: int | None = None) -> bytes:
    """An index file of two parts, its checksums right (what only a writer of another build could leave)."""
    from cni_reaper.state.index import seal

    data = seal(hot, cold)
    if length is not None:
        data = data[:len(MAGIC)] + length.to_bytes(4, "big") + data[len(MAGIC) + 4:]
    return data


def _hot(**kw) -> bytes:
    from cni_reaper.state.index import NAMED
    from cni_reaper.state.record import SCHEMA

    doc = {"fields": NAMED, "names": [], "inos": [], "quick": [], "raw": [], "hosts": [["b", "m", 1, 1]],
           "dirs": [[1, 2, []]], **kw}
    doc.setdefault("attached", ["n-c-eth0"] * len(doc["names"]))
    doc.setdefault("networks", ["n"])
    doc.setdefault("recordSchema", SCHEMA)
    return json.dumps(doc).encode()


_ENTRY: list = [1, "n", "c", "eth0", "/p", [1, 2, 3], 0, 0, ["v", 1], None, None, False, False, [], None, False]
_QUICK = [["b", "m", 1, 1], 0, 1, ["/p"], "1,2,3", hash((1, 2, 3))]
INDEXES = [None, b"", b"{}", b'{"version": 4, "entries": {"r-x.json": [1]}}', b"\x00" * 10,  # older and junk
           MAGIC, MAGIC + b"\0\0", MAGIC + b"\0" * 12 + b"{}", _sealed(b"\xff" * 9), _sealed(b"{"),  # cut, damaged
           _sealed(b"[1]"), _sealed(_hot(), length=1 << 30),  # a first part longer than the file
           _sealed(_hot(names=["r-x.json"], inos=[1], raw=[[1, "n"]])),  # not entries
           _sealed(_hot(names=["r-x.json"], inos=[1], raw=[_ENTRY])),  # no such record
           _sealed(_hot(names=["r-x.json"], inos=["1"], raw=[_ENTRY])),
           _sealed(_hot(names=["r-x.json", "r-x.json"], inos=[1, 1], raw=[_ENTRY, _ENTRY])),  # twice
           _sealed(_hot(names=["r-x.json"], inos=[1], raw=[_ENTRY[:6] + [5, 7] + _ENTRY[8:]])),  # past the tables
           _sealed(_hot(names=["r-x.json"], inos=[1], attached=[], raw=[_ENTRY])),  # an attachment name short
           _sealed(_hot(names=["r-x.json"], inos=[1], attached=[7], raw=[_ENTRY])),  # not a name
           _sealed(_hot(names=["r-x.json"], inos=[1], raw=[[None] * 16])),
           _sealed(_hot(names=["r-x.json"], inos=[1], quick=[_QUICK]), json.dumps([_ENTRY]).encode()),  # no such record
           _sealed(_hot(names=["r-x.json"], inos=[1], quick=[_QUICK]), b"[[1,"),  # its second part cut
           _sealed(_hot(names=["r-x.json"], inos=[1], quick=[_QUICK]), b"[]"),  # its second part short
           _sealed(_hot(names=["r-x.json"], inos=[1], quick=[[["b"], 0, 1, ["/p"], "1,2,3", 1]])),  # not a host
           _sealed(_hot(names=["r-x.json"], inos=[1], quick=[[["b", "m", 1, 1], 0, 5, ["/p"], "1,2,3", 1]])),
           _sealed(_hot(names=["r-x.json"], inos=[1], quick=[[["b", "m", 1, 1], 0, 1, [7], "1,x,", None]]),
                   json.dumps([_ENTRY]).encode()),
           _sealed(_hot(names=["r-x.json"], inos=[1], quick=[[["b", "m", 1, 1], 0, 1, [7], "1,x,", 5]]),
                   json.dumps([_ENTRY]).encode()),  # digest and triples not as written
           _sealed(_hot(names=["r-x.json"], inos=[1], quick=[[["b", "m", 1, 1], 0, 1, ["/p"], [1, 2, 3]]])),  # v6's
           _sealed(_hot(names=[".lock"], inos=[1], raw=[_ENTRY])),  # another file of the directory as a record
           _sealed(_hot(names=["r-x.json\nr-y.json"], inos=[1], raw=[_ENTRY])),
           _sealed(_hot(names=["r-x.json"], inos=[1], quick=[_QUICK, _QUICK])),  # groups overlap
           _sealed(b"(" + (2**31 - 1).to_bytes(4, "little")),  # what made marshal allocate 16 GB (red team)
           _sealed(b"[" * 100000), _sealed(_hot(), b"[" * 100000)]


@st.composite
def damage(draw):
    """A state directory's worth of damage: records with a field replaced, removed or grown past its limit,
    raw bytes, and the index and journal as junk."""
    records = []
    for i in range(draw(st.integers(1, 3))):
        r = _good_record(i)
        for _ in range(draw(st.integers(0, 2))):
            places = list(_places(r))
            path, container = places[draw(st.integers(0, len(places) - 1))]
            how = draw(st.sampled_from(["replace", "replace", "delete", "grow"]))
            if how == "delete" and isinstance(container, dict):
                del container[path[-1]]
            elif how == "grow" and isinstance(container, list):
                container.extend(json.loads(json.dumps(container)) * draw(st.sampled_from([1, 16, 1100])))
            else:
                container[path[-1]] = draw(JUNK)
        records.append(r)
    raw = draw(st.sampled_from([b"", b"{", b"\xff\xfe", b"[]", b"null", b'{"schema": 2}', b"x" * 100]))
    index = draw(st.sampled_from(INDEXES))
    journal = draw(st.sampled_from([None, b'["r-x.json", [1, "n"', b"[1]\n", b'["r-y.json", null]\n', b"\n\n"]))
    return records, raw, index, journal


def _plant(state, records, raw, index, journal) -> None:
    state.mkdir(mode=0o700, exist_ok=True)
    for r in records:
        try:
            name = record_name(r["network"], r["containerID"], r["ifname"])
        except (KeyError, TypeError):
            name = f"r-{id(r):040x}.json"[:45]
        (state / name).write_text(json.dumps(r, default=str))
    (state / "r-0000000000000000000000000000000000000000.json").write_bytes(raw)
    if index is not None:
        (state / INDEX_NAME).write_bytes(index)
    if journal is not None:
        (state / JOURNAL_NAME).write_bytes(journal)
    for p in state.iterdir():
        os.chmod(p, 0o600)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])
@pytest.mark.slow
@given(damage())
def test_no_verb_fails_or_blocks_because_of_another_attachments_state(tmp_path_factory, case):
    state = tmp_path_factory.mktemp("fuzz") / "s"
    _plant(state, *case)
    c = conf(state, runtimeConfig={"portMappings": [{"hostPort": 8080, "containerPort": 80}]})
    for verb, cfg in (("ADD", c), ("CHECK", c), ("STATUS", conf(state, "1.1.0", prev=None)), ("DEL", c)):
        started = time.monotonic()
        status = verb == "STATUS"
        rc, out = invoke(verb, cfg, cid=None if status else "mine", netns=None if status else NETNS,
                         ifname=None if status else "eth0")
        assert rc == 0, (verb, out)
        assert time.monotonic() - started < 30, f"{verb} took too long"  # a hang detector, not a figure
    # every record left is one the readers accept (all of them: the check, the times, the index entry); the
    # damaged ones were moved aside
    for p in state.glob("r-*.json"):
        doc = json.loads(p.read_text())
        if rec.later_schema(doc) is not None:  # a later release's record: kept as it is, never read whole here
            assert rec.of_later(doc) is not None or True
            continue
        assert rec.problem(doc) is None
        for life in [doc["current"], *doc["earlier"]]:
            rec.parse_time(life["createdAt"])
        Entry.of_record(rec.of_document(doc), 0)


ID = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"), min_size=1,
             max_size=1024).filter(lambda s: s[0].isalnum())
PATHS = st.text(min_size=1, max_size=4096).map(lambda s: "/" + s.replace("\0", "")[:4095])


@settings(max_examples=max(EXAMPLES // 3, 30), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                                       HealthCheck.function_scoped_fixture])
@given(cid=ID, network=ID, ifname=st.text(st.characters(blacklist_characters="/: \0\t\n\r\x0b\x0c", max_codepoint=0x10FFFF),
                                          min_size=1, max_size=15),
       netns=PATHS, n_ips=st.integers(0, 40), n_ports=st.integers(0, 1500), n_args=st.integers(0, 64),
       lives=st.integers(1, 20), big=st.booleans())
# a name that is not UTF-8 (CNI_IFNAME=$'\xff' reaches Python as a lone surrogate): once a traceback on every ADD
@pytest.mark.slow
@example(cid="0", network="0", ifname="\udcff", netns="/0", n_ips=0, n_ports=0, n_args=0, lives=1, big=False)
@example(cid="0", network="0", ifname="\ud800", netns="/0", n_ips=0, n_ports=0, n_args=0, lives=1, big=False)
def test_what_the_writer_writes_the_reader_reads(tmp_path_factory, cid, network, ifname, netns, n_ips, n_ports, n_args,
                                                 lives, big):
    state = tmp_path_factory.mktemp("rt") / "s"
    store = Store(str(state)).open()
    host_text, dir_text, link = ("\U0001f600" * rec.MAX_HOST, "\U0001f600" * rec.MAX_DIR, "v" * rec.MAX_LINK) if big else ("b", "/d", "veth0")
    args = {f"K{i}{'k' * (rec.MAX_ARG_KEY - 8) if big else ''}": ("\u00e9" * rec.MAX_ARG_VALUE if big else "v")
            for i in range(n_args)}
    r = None
    with store.locked():
        for k in range(lives):
            observed = {"netnsId": {"dev": 2**62, "ino": 2**63, "ctime": None}, "netnsDir": {"dev": 1, "ino": 1, "groups": [7] * 8},
                        "host": {"boot": host_text, "machine": host_text, "netns": 1, "mnt": 2},
                        "veth": {"name": link, "ifindex": 1}}
            ips = [rec.RecordedIP(f"fd00:{k:x}::{i:x}", 64, 6, rec.ReservationId(dir_text, 1, 2, 3, 4)) for i in range(n_ips)]
            ports = [rec.RecordedPortMapping(1 + i % 65535, 80, "udp", "ffff:" * 7 + "ffff") for i in range(n_ports)]
            life = rec.life(_observed(netns, observed), ips, ports)
            r, _ = rec.merge(r, network, cid, ifname, life, args, rec.RecordSettings(dir_text, dir_text, "auto"))
        assert r is not None
        store.save(r)
        back = store.load(network, cid, ifname)
    store.close()
    assert back == r and back is not None and back.doc() == json.loads(json.dumps(r.doc()))
    assert (state / record_name(network, cid, ifname)).stat().st_size < rec.MAX_RECORD_BYTES


def test_a_tombstone_time_the_check_accepts_is_one_every_reader_reads(tmp_path):
    """A record whose tombstone was written with a -00:00 offset (the check accepts it) once made every verb of
    the node fail with an internal error: the index read it with another parser."""
    state = tmp_path / "s"
    r = _good_record(1)
    r["deleted"] = dict(rec.tombstone(True, True, True, True, cached=True).doc(), at="2026-11-29T19:33:41-00:00")
    _plant(state, [r], b"", None, None)
    for verb in ("ADD", "CHECK", "DEL"):
        assert invoke(verb, conf(state), cid="mine")[0] == 0
    assert invoke("STATUS", conf(state, "1.1.0", prev=None), cid=None, netns=None, ifname=None)[0] == 0
    assert any(json.loads(p.read_text())["containerID"] == "other-1" for p in state.glob("r-*.json"))


def test_port_mappings_past_the_limit_are_recorded_in_part_and_the_record_is_read_back(tmp_path):
    state = tmp_path / "s"
    ports = [{"hostPort": 1 + i, "containerPort": 80, "protocol": "tcp"} for i in range(5000)]
    c = conf(state, runtimeConfig={"portMappings": ports}, capabilities={"portMappings": True})
    assert invoke("ADD", c, cid="many")[0] == 0
    assert invoke("STATUS", conf(state, "1.1.0", prev=None), cid=None, netns=None, ifname=None)[0] == 0
    [p] = state.glob("r-*.json")
    got = json.loads(p.read_text())
    assert len(got["current"]["portMappings"]) == rec.MAX_PORTS and not list(state.glob("*.corrupt"))


def test_prev_result_is_recorded_with_at_most_the_limit_of_addresses(tmp_path):
    prev = prev_result()
    prev["ips"] = [{"address": f"10.8.{i // 250}.{i % 250 + 1}/16"} for i in range(100)]
    state = tmp_path / "s"
    assert invoke("ADD", conf(state, prev=prev), cid="wide")[0] == 0
    [p] = state.glob("r-*.json")
    assert len(json.loads(p.read_text())["current"]["ips"]) == rec.MAX_IPS


_NAMEISH = st.lists(st.sampled_from(["r", "-", ".", "json", "\n", "a", "0", ".corrupt", ".lock"]), max_size=8).map("".join)


@pytest.mark.slow
@given(st.lists(st.one_of(_NAMEISH, st.builds(lambda s: f"r-{s}.json", _NAMEISH)), max_size=6))
@settings(max_examples=3000, deadline=None)
@example(["ar-x.json"])
@example(["r-x.json", "r-x.jsonx"])
@example(["r-a\nr-b.json", "r-c.json"])
def test_names_are_told_record_names_in_c_as_one_by_one(names):
    """all_record_names (a join and three counts) says what is_record_name says of each (and no newline in
    any: no record's name holds one); others_in with the index's names finds what it finds without them."""
    from cni_reaper.state.names import all_record_names, is_record_name, others_in

    assert all_record_names(names) == all(is_record_name(n) and "\n" not in n for n in names)
    found = {n: i for i, n in enumerate(names)}
    known = {n: i for n, i in found.items() if is_record_name(n)}
    assert sorted(others_in(found, known)) == sorted(others_in(found)) == sorted(n for n in found if n not in known)
