"""The pydantic models are the schema; the verbs use plain-Python mirrors of them (conf.py, result.py,
record.py) because pydantic does not fit an ADD's time budget. These property tests hold the mirrors to the
schema: on generated documents, both accept and refuse the same inputs and yield the same values, and
every record the verbs write validates against models.Record."""

from __future__ import annotations

import ipaddress
import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cni_reaper import models
from cni_reaper.cni import conf as fastconf
from cni_reaper.cni import result
from cni_reaper.errors import CniError
from cni_reaper.state import record
from testkit.cni import conf as make_conf
from testkit.cni import invoke, prev_result

EXAMPLES = int(os.environ.get("CNI_REAPER_SCHEMA_EXAMPLES", "1500"))

junk = st.one_of(st.none(), st.booleans(), st.integers(-70000, 70000), st.floats(allow_nan=True),
                 st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
paths = st.one_of(st.sampled_from(["/var/lib/x", "/tmp/a b", "relative", "", "/\0x", "/" + "a" * 1100]), junk)
ports = st.one_of(st.integers(-1, 70000), junk)


def spelled(name: str):
    """The key as written, or as Go would still match it: another case, a long s, a Kelvin sign."""
    variants = [name, name.lower(), name.upper(), name[:1].upper() + name[1:], name.replace("s", "\u017f"),
                name.replace("k", "\u212a"), name + "x"]
    return st.sampled_from(variants)


port_mapping = st.dictionaries(
    st.sampled_from(["hostPort", "containerPort", "protocol", "hostIP", "other"]).flatmap(spelled),
    st.one_of(ports, st.sampled_from(["tcp", "UDP", "sctp", "icmp", "", "10.0.0.1", "fd00::1", "fe80::1%eth0", "1.2.3"])),
    max_size=5)
VALID_CONF = {"name": "net", "type": "cni-reaper", "stateDir": "/var/lib/cni/reaper", "ipamDataDir": "/var/lib/cni/networks",
              "cniCacheDir": "/var/lib/cni", "logFile": "", "backend": "auto", "lockTimeout": 10,
              "cniVersion": "1.0.0", "prevResult": {}, "capabilities": {"portMappings": True},
              "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}}
FIELD_VALUES = {
    "name": junk, "type": junk, "stateDir": paths, "ipamDataDir": paths, "cniCacheDir": paths, "logFile": paths,
    "backend": st.one_of(st.sampled_from(["auto", "nft", "legacy", "iptables", "NFT", ""]), junk),
    "mode": st.one_of(st.sampled_from(["clean", "observe", "Observe", "CLEAN", "", "observ", "dry-run"]), junk),
    "lockTimeout": st.one_of(st.floats(-1, 400), st.integers(-5, 400), st.sampled_from([float("inf"), float("nan")]), junk),
    "cniVersion": junk,
    "cniVersions": st.one_of(st.lists(st.sampled_from(["1.0.0", "0.4.0"]), max_size=2), st.lists(junk, max_size=2), junk),
    "prevResult": junk,
    "capabilities": st.one_of(st.fixed_dictionaries({"portMappings": junk}), junk),
    "runtimeConfig": st.one_of(st.dictionaries(st.sampled_from(["portMappings", "PortMappings", "x"]),
                                               st.one_of(st.lists(st.one_of(port_mapping, junk), max_size=3), junk),
                                               max_size=2), junk),
    "extra": junk,
}


@st.composite
def confs(draw):
    """A valid configuration with one (sometimes up to three) fields removed, nulled, spelled as Go would
    still match them, or replaced by edge values and junk."""
    raw = json.loads(json.dumps(VALID_CONF))
    fields = [draw(st.sampled_from(sorted(FIELD_VALUES)))]
    if draw(st.integers(0, 3)) == 0:  # mostly one field at a time, so that one wrong rule shows on its own
        fields += draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=2, unique=True))
    for field in dict.fromkeys(fields):
        how = draw(st.sampled_from(["delete", "replace", "replace", "respell", "null-after"]))
        if how == "delete":
            raw.pop(field, None)
        elif how == "respell":  # the same value under another spelling, before or after the original
            value = raw.pop(field, None) if draw(st.booleans()) else draw(FIELD_VALUES[field])
            raw[draw(spelled(field))] = value
        elif how == "null-after":
            raw[draw(spelled(field))] = None
        else:
            raw[field] = draw(FIELD_VALUES[field])
    return raw


def vars_of(p: fastconf.PortMapping) -> dict:
    return {"hostPort": p.hostPort, "containerPort": p.containerPort, "protocol": p.protocol, "hostIP": p.hostIP}


def _fast(raw):
    try:
        return fastconf.parse(raw)
    except CniError as err:
        assert err.code == 7
        return None


def _slow(raw):
    try:
        return models.PluginConf.model_validate(raw)
    except ValidationError:
        return None


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(confs())
def test_config_mirror_agrees_with_the_schema(raw):
    fast, slow = _fast(raw), _slow(raw)
    assert (fast is None) == (slow is None), (raw, fast, slow)
    if fast is None:
        return
    for attr in ("name", "type", "stateDir", "ipamDataDir", "cniCacheDir", "backend", "lockTimeout", "logFile",
                 "mode", "prevResult", "portMappingsDeclared"):
        assert getattr(fast, attr) == getattr(slow, attr), attr
    assert [vars_of(p) for p in fast.portMappings] == [p.model_dump() for p in slow.runtimeConfig.portMappings]


def _addresses():
    v4 = st.integers(0, 2**32 - 1).map(lambda i: str(ipaddress.IPv4Address(i)))
    v6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address).map(
        lambda a: a.compressed if a.ipv4_mapped is None else "fd00::1")
    odd = st.sampled_from(["1.2.3", "01.2.3.4", "fe80::1%eth0", "::ffff:1.2.3.4", "::1.2.3.4", "x", "", "1.2.3.4 "])
    return st.one_of(v4, v6, odd)


prefixes = st.one_of(st.integers(0, 130).map(str), st.sampled_from(["", "x", "024", "0024", "-1", "٢", "+8"]))
cidrs = st.one_of(st.tuples(_addresses(), prefixes).map(lambda t: f"{t[0]}/{t[1]}"), _addresses(), junk)
ENTRY_VALUES = {"address": cidrs, "version": st.one_of(st.sampled_from(["4", "6", "5", 4]), st.none()),
                "gateway": st.one_of(_addresses(), st.none(), junk), "interface": st.one_of(st.integers(-1, 3), st.none(), junk)}
IFACE_VALUES = {"name": junk, "mac": junk, "sandbox": junk, "mtu": junk}
OLD_VALUES = {"ip": cidrs, "gateway": st.one_of(_addresses(), st.none(), junk)}


@st.composite
def prev_results(draw):
    """A valid bridge-like result (0.2.0 to 1.1.0), then zero to three parts removed, nulled, respelled or
    replaced by edge values and junk."""
    version = draw(st.sampled_from(["0.2.0", "0.4.0", "1.0.0", "1.1.0"]))
    address = draw(st.sampled_from(["172.26.64.2/20", "fd00::2/64"]))
    if version == "0.2.0":
        raw = {"cniVersion": version, "ip4": {"ip": address, "gateway": "172.26.64.1"}, "ip6": {"ip": "fd00::3/64"}}
    else:
        raw = prev_result(version, address=address)
        raw["ips"].append({"address": draw(cidrs) if draw(st.booleans()) else "10.1.2.3/24", "interface": 2})
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 3]))):
        where = draw(st.sampled_from(["ips", "interfaces", "ip4", "ip6", "top"]))
        items = raw.get(where)
        if isinstance(items, dict):
            items = [items]
        if where != "top" and isinstance(items, list) and items:
            item = items[draw(st.integers(0, len(items) - 1))]
            values = {"ips": ENTRY_VALUES, "interfaces": IFACE_VALUES}.get(where, OLD_VALUES)
            if not isinstance(item, dict):
                continue
            field = draw(st.sampled_from(sorted(values)))
            how = draw(st.sampled_from(["delete", "replace", "respell", "null"]))
            if how == "delete":
                item.pop(field, None)
            elif how == "respell":
                item[draw(spelled(field))] = item.pop(field, None)
            elif how == "null":
                item[draw(spelled(field))] = None
            else:
                item[field] = draw(values[field])
        else:
            key = draw(st.sampled_from(["ips", "interfaces", "cniVersion", "ip4"]))
            if draw(st.booleans()) and key in raw:
                raw[draw(spelled(key))] = raw.pop(key)
            else:
                raw[key] = draw(st.one_of(junk, st.lists(st.one_of(st.none(), junk), max_size=2)))
    return raw, draw(st.sampled_from(["0.2.0", "1.0.0"]))


def _fast_ips(raw, version):
    try:
        return result.recorded_ips(raw, version)
    except CniError as err:
        assert err.code == 7
        return None


def _slow_ips(raw, version):
    try:
        return models.PrevResult.parse(raw, version).addresses()
    except ValidationError:
        return None


def _same_ips(fast, slow) -> bool:
    got = [(ipaddress.ip_address(i.address).packed, i.prefix, i.family) for i in fast]
    return got == [(i.ip.packed, i.network.prefixlen, i.version) for i in slow]


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(prev_results())
def test_prev_result_mirror_agrees_with_the_schema(case):
    raw, version = case
    fast, slow = _fast_ips(raw, version), _slow_ips(raw, version)
    assert (fast is None) == (slow is None), (raw, fast, slow)
    if slow is not None:
        assert _same_ips(fast, slow), (raw, fast, slow)


@settings(max_examples=max(EXAMPLES // 10, 50), suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["ADD", "DEL", "CHECK"]), st.integers(2, 9), st.sampled_from(["a", "b"])),
                      min_size=1, max_size=8))
def test_every_record_the_verbs_write_validates_against_the_schema(tmp_path_factory, steps):
    state = tmp_path_factory.mktemp("s")
    for verb, host, cid in steps:
        c = make_conf(state, prev=prev_result(address=f"172.26.64.{host}/20"),
                      runtimeConfig={"portMappings": [{"HostPort": 8000 + host, "ContainerPort": 80}]})
        assert invoke(verb, c, cid=cid)[0] == 0
    for path in state.glob("r-*.json"):
        assert json.loads(path.read_text())["schema"] == record.WRITTEN
        models.RECORDS[record.WRITTEN].model_validate_json(path.read_text())


EDGES = [("lockTimeout", v) for v in (300, 300.0, 300.5, 301, 0, 0.0, 1e-9, -0.0, True, "10", float("inf"), None)] + \
    [("backend", v) for v in ("auto", "nft", "legacy", "Legacy", "iptables", "", None)] + \
    [("logFile", v) for v in ("", "/x", "x", "/" + "a" * 1023, "/" + "a" * 1024, None)] + \
    [("stateDir", v) for v in ("/", "/a\0b", "", " /x", None)] + \
    [("runtimeConfig", {"portMappings": [dict(hostPort=h, containerPort=c, **extra)]})
     for h, c, extra in ((1, 65535, {}), (0, 80, {}), (65536, 80, {}), (80, 80, {"protocol": "SCTP"}),
                         (80, 80, {"protocol": 6}), (80, 80, {"hostIP": "::"}), (80, 80, {"hostIP": "1.2.3.4/32"}),
                         (True, 80, {}), (80.0, 80, {}), (80, 80, {"protocol": ""}), (80, 80, {"hostIP": None}))]


def test_config_mirror_agrees_on_the_boundaries():
    for field, value in EDGES:
        raw = json.loads(json.dumps(VALID_CONF))
        raw[field] = value
        fast, slow = _fast(raw), _slow(raw)
        assert (fast is None) == (slow is None), (field, value)
        if fast is not None:
            assert getattr(fast, field if field != "runtimeConfig" else "portMappings") is not None
            assert [vars_of(p) for p in fast.portMappings] == [p.model_dump() for p in slow.runtimeConfig.portMappings]
            assert (fast.lockTimeout, fast.backend, fast.logFile) == (slow.lockTimeout, slow.backend, slow.logFile)


def test_prev_result_mirror_agrees_on_the_boundaries():
    entries = [{"address": a} for a in ("10.0.0.1/32", "10.0.0.1/33", "10.0.0.1/024", "10.0.0.1/0024", "fd00::1/128",
                                         "fd00::1/129", "fd00::1/0", "10.0.0.1/", "/24", "10.0.0.1/24/1", "::ffff:10.0.0.1/96",
                                         "10.0.0.1/000000000000000000032", "10.0.0.1/+8", None, 5)]
    entries += [{"address": "10.0.0.1/24", "version": v} for v in ("4", "6", "5", 4, None)]
    entries += [{"address": "fd00::1/64", "version": v} for v in ("6", "4")]
    entries += [{"address": "10.0.0.1/24", "gateway": g} for g in ("10.0.0.254", "fd00::1", "10.0.0.256", "", None, 5)]
    entries += [{"address": "10.0.0.1/24", "interface": i} for i in (0, 1, -1, True, "0", None, 9)]
    for entry in entries:
        raw = {"interfaces": [{"name": "eth0"}], "ips": [entry]}
        fast, slow = _fast_ips(raw, "1.0.0"), _slow_ips(raw, "1.0.0")
        assert (fast is None) == (slow is None), entry
        if slow is not None:
            assert _same_ips(fast, slow), entry


# -- records: record.problem() (what every read of the state directory applies) says what models.Record says
OBSERVED = {"netnsId": {"dev": 4, "ino": 4026532177, "ctime": 1796114877312865396},
            "netnsDir": {"dev": 26, "ino": 2, "groups": [1]},
            "host": {"boot": "58f0f6a0-7962-4060-86f1-e71f30e58d45", "machine": "3d1219c7", "netns": 4026531833,
                     "mnt": 4026531832},
            "veth": {"name": "veth1a2b3c4d", "ifindex": 7}}
RESERVATION = {"dataDir": "/var/lib/cni/networks", "dev": 65024, "ino": 12, "mtime": 1796114877000000000,
               "ctime": 1796114877000000000}


def _valid_record(schema: int = 2) -> dict:
    """A record document as the builders make it (the typed model's `doc`), with an earlier life and a tombstone."""
    from cni_reaper.state import record

    observed = record.Life.of(dict(OBSERVED, netns="/var/run/netns/alloc-1", ips=[], portMappings=[], createdAt=""))
    inc = record.life(observed, [record.RecordedIP("172.26.64.2", 20, 4, record.ReservationId.of(RESERVATION))],
                      [record.RecordedPortMapping(8080, 80, "tcp", "")])
    typed, _ = record.merge(None, "nomad-reaper", "alloc-1", "eth0", inc, {"NOMAD_JOB_ID": "web"},
                            record.RecordSettings("/var/lib/cni/networks", "/var/lib/cni", "auto"))
    typed = typed.replace(earlier=(inc,), deleted=record.tombstone(True, True, False, True, cached=True))
    rec = json.loads(json.dumps(typed.doc()))
    if schema == 1:  # what cni-reaper 0.2 wrote
        rec = dict(rec, schema=1)
        del rec["settings"]
        for life in [rec["current"], *rec["earlier"]]:
            for k in ("netnsDir", "host", "veth"):
                del life[k]
            del life["netnsId"]["ctime"]
            for ip in life["ips"]:
                del ip["reservation"]
        del rec["deleted"]["cached"]
    return rec


TIMES = ["2026-11-29T19:33:41.123456Z", "2026-11-29T19:33:41Z", "2026-11-29T19:33:41", "2026-11-29T19:33:41+00:00",
         "2026-11-29T19:33:41-00:00", "2026-11-29T19:33:41+01:00", "2026-02-29T00:00:00Z", "2024-02-29T00:00:00Z",
         "2000-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-11-29", "2026-11-29 19:33:41Z",
         "2026-11-29T24:00:00Z", "2026-11-29T23:59:60Z", "x", "", "2026-11-29T19:33:41.1234567Z", "1700000000",
         "2026-11-29t19:33:41z", "0000-01-01T00:00:00Z", "2026-11-29T19:33Z", "2026-04-31T00:00:00Z"]
record_junk = st.one_of(st.none(), st.booleans(), st.integers(-2, 70000), st.floats(allow_nan=False, allow_infinity=False),
                        st.text(max_size=4), st.sampled_from(TIMES), st.lists(st.integers(0, 3), max_size=2),
                        st.dictionaries(st.sampled_from(["a", "dev", "ino"]), st.one_of(st.integers(), st.text(max_size=2)), max_size=2),
                        st.sampled_from([0, 1, 4, 6, 128, 129, 65535, 65536, "tcp", "udp", "sctp", "TCP", True, False]))


def _paths(doc, prefix=()):
    """Every (path, container) of a nested document, where path[-1] is a key or an index of container."""
    if isinstance(doc, dict):
        for k in list(doc):
            yield prefix + (k,), doc
            yield from _paths(doc[k], prefix + (k,))
    elif isinstance(doc, list):
        for i in range(len(doc)):
            yield prefix + (i,), doc
            yield from _paths(doc[i], prefix + (i,))


@st.composite
def records(draw):
    from cni_reaper.state import record

    rec = _valid_record(draw(st.sampled_from([1, 2, 2])))
    mark = draw(st.sampled_from(["none", "none", "left", "held"]))
    if rec["schema"] == 2 and mark == "left":  # waits for the runtime's DEL or GC
        rec["left"] = record.left("no reservation shows who else holds 172.26.64.2").doc()
    elif rec["schema"] == 2 and mark == "held":  # something not ours holds a leftover: looked at again later
        rec["left"] = record.held("ipv4 nat CNI-1: still referenced by 1 rule(s) we do not own", None).doc()
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2]))):
        places = list(_paths(rec))
        path, container = places[draw(st.integers(0, len(places) - 1))]
        how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "extra", "grow"]))
        if how == "delete":
            del container[path[-1]]
        elif how == "extra" and isinstance(container, dict):
            container[draw(st.sampled_from(["extra", "Schema", "verify", "hostip"]))] = draw(record_junk)
        elif how == "grow" and isinstance(container, list):
            container.extend(json.loads(json.dumps(container)) * draw(st.integers(1, 20)))
        else:
            container[path[-1]] = draw(record_junk)
    return rec


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(records())
def test_the_record_check_agrees_with_the_schema(doc):
    """Both schemas: what cni-reaper writes (2) and what cni-reaper 0.2 wrote (1), and a record of schema 1 that
    is read is carried in schema 2's shape that the schema accepts."""
    from cni_reaper.state import record

    fast = record.problem(doc) is None
    slow = models.record_problem(doc) is None
    assert fast == slow, (doc, record.problem(doc), models.record_problem(doc))
    if fast:
        models.Record.model_validate_json(json.dumps(record.upgrade(json.loads(json.dumps(doc)))))


def test_the_record_check_agrees_on_every_time_form():
    from cni_reaper.state import record

    for t in TIMES:
        for where in ("current", "deleted"):
            doc = _valid_record()
            (doc["current"] if where == "current" else doc["deleted"])["createdAt" if where == "current" else "at"] = t
            slow = models.record_problem(doc) is None
            assert (record.problem(doc) is None) == slow, (t, where)
            if slow:  # and every reader reads what the check lets through
                record.parse_time(t)


def test_a_record_held_or_left_as_the_sweep_writes_it_is_a_record():
    from cni_reaper.state import record

    for mark in (record.left("no reservation shows who else holds it"), record.held("nat CNI-1: still referenced", None)):
        doc = dict(_valid_record(), left=mark.doc())
        assert record.problem(doc) is None and models.record_problem(doc) is None, mark
        assert record.of_document(doc).doc() == doc  # read and written back key for key
    bad = dict(_valid_record(), left=dict(record.held("x", None).doc(), tries=0))
    assert record.problem(bad) is not None and models.record_problem(bad) is not None
    bad = dict(_valid_record(), left={k: v for k, v in record.held("x", None).doc().items() if k != "tries"})
    assert record.problem(bad) is not None and models.record_problem(bad) is not None
