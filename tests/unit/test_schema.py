"""The pydantic models are the schema; the verbs use plain-Python mirrors of them (conf.py, result.py,
record.py) because pydantic does not fit an ADD's time budget. These property tests hold the mirrors to the
schema: on generated documents, both accept and refuse the same inputs and yield the same values, and
every record the verbs write validates against models.Record."""

from __future__ import annotations

import ipaddress
import json
import os

from helpers import conf as make_conf
from helpers import invoke, prev_result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cni_reaper import conf as fastconf
from cni_reaper import models, result
from cni_reaper.errors import CniError

EXAMPLES = int(os.environ.get("CNI_REAPER_SCHEMA_EXAMPLES", "1500"))

junk = st.one_of(st.none(), st.booleans(), st.integers(-70000, 70000), st.floats(allow_nan=True),
                 st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
paths = st.one_of(st.sampled_from(["/var/lib/x", "/tmp/a b", "relative", "", "/\0x", "/" + "a" * 1100]), junk)
ports = st.one_of(st.integers(-1, 70000), junk)
port_mapping = st.dictionaries(
    st.sampled_from(["hostPort", "HostPort", "hostport", "containerPort", "ContainerPort", "protocol", "Protocol",
                     "hostIP", "HostIP", "other"]),
    st.one_of(ports, st.sampled_from(["tcp", "UDP", "sctp", "icmp", "", "10.0.0.1", "fd00::1", "fe80::1%eth0", "1.2.3"])),
    max_size=5)
VALID_CONF = {"name": "net", "type": "cni-reaper", "stateDir": "/var/lib/cni/reaper", "ipamDataDir": "/var/lib/cni/networks",
              "cniCacheDir": "/var/lib/cni", "logFile": "", "backend": "auto", "lockTimeout": 10,
              "cniVersion": "1.0.0", "prevResult": {},
              "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}}
FIELD_VALUES = {
    "name": junk, "type": junk, "stateDir": paths, "ipamDataDir": paths, "cniCacheDir": paths, "logFile": paths,
    "backend": st.one_of(st.sampled_from(["auto", "nft", "legacy", "iptables", "NFT"]), junk),
    "lockTimeout": st.one_of(st.floats(-1, 400), st.integers(-5, 400), st.sampled_from([float("inf"), float("nan")]), junk),
    "cniVersion": junk,
    "cniVersions": st.one_of(st.lists(st.sampled_from(["1.0.0", "0.4.0"]), max_size=2), st.lists(junk, max_size=2), junk),
    "prevResult": junk,
    "runtimeConfig": st.one_of(st.fixed_dictionaries({}, optional={"portMappings": st.one_of(st.lists(port_mapping, max_size=3), junk)}), junk),
    "extra": junk,
}


@st.composite
def confs(draw):
    """A valid configuration with one (sometimes up to three) fields removed or replaced by edge values and junk."""
    raw = json.loads(json.dumps(VALID_CONF))
    fields = [draw(st.sampled_from(sorted(FIELD_VALUES)))]
    if draw(st.integers(0, 3)) == 0:  # mostly one field at a time, so that one wrong rule shows on its own
        fields += draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=2, unique=True))
    for field in dict.fromkeys(fields):
        if draw(st.booleans()) and field in raw:
            del raw[field]
        else:
            raw[field] = draw(FIELD_VALUES[field])
    return raw


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
                 "prevResult", "cniVersion", "cniVersions"):
        assert getattr(fast, attr) == getattr(slow, attr), attr
    assert [p.as_dict() for p in fast.runtimeConfig.portMappings] == [
        p.model_dump() for p in slow.runtimeConfig.portMappings]


def _addresses():
    v4 = st.integers(0, 2**32 - 1).map(lambda i: str(ipaddress.IPv4Address(i)))
    v6 = st.integers(0, 2**128 - 1).map(lambda i: ipaddress.IPv6Address(i)).map(
        lambda a: a.compressed if a.ipv4_mapped is None else "fd00::1")
    odd = st.sampled_from(["1.2.3", "01.2.3.4", "fe80::1%eth0", "::ffff:1.2.3.4", "::1.2.3.4", "x", "", "1.2.3.4 "])
    return st.one_of(v4, v6, odd)


prefixes = st.one_of(st.integers(0, 130).map(str), st.sampled_from(["", "x", "024", "0024", "-1", "٢"]))
cidrs = st.one_of(st.tuples(_addresses(), prefixes).map(lambda t: f"{t[0]}/{t[1]}"), _addresses(), junk)
ENTRY_VALUES = {"address": cidrs, "version": st.one_of(st.sampled_from(["4", "6", "5", 4]), st.none()),
                "gateway": st.one_of(_addresses(), st.none(), junk), "interface": st.one_of(st.integers(-1, 3), st.none(), junk)}
IFACE_VALUES = {"name": junk, "mac": junk, "sandbox": junk}


@st.composite
def prev_results(draw):
    """A valid bridge-like result, then zero to three parts replaced by edge values and junk."""
    raw = prev_result(draw(st.sampled_from(["0.4.0", "1.0.0"])), address=draw(st.sampled_from(["172.26.64.2/20", "fd00::2/64"])))
    raw["ips"].append({"address": draw(cidrs) if draw(st.booleans()) else "10.1.2.3/24", "interface": 2})
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 3]))):
        where = draw(st.sampled_from(["ips", "interfaces", "top"]))
        items = raw.get(where)
        if where != "top" and isinstance(items, list) and items:
            item = items[draw(st.integers(0, len(items) - 1))]
            values = ENTRY_VALUES if where == "ips" else IFACE_VALUES
            if not isinstance(item, dict):
                continue
            field = draw(st.sampled_from(sorted(values)))
            if draw(st.booleans()):
                item.pop(field, None)
            else:
                item[field] = draw(values[field])
        else:
            raw[draw(st.sampled_from(["ips", "interfaces", "cniVersion"]))] = draw(junk)
    return raw


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(prev_results())
def test_prev_result_mirror_agrees_with_the_schema(raw):
    try:
        fast = result.recorded_ips(raw)
    except CniError as err:
        assert err.code == 7
        fast = None
    try:
        slow = models.PrevResult.model_validate(raw)
    except ValidationError:
        slow = None
    assert (fast is None) == (slow is None), (raw, fast, slow)
    if slow is None:
        return
    expected = []
    for entry in slow.ips:
        iface = ipaddress.ip_interface(entry.address)
        item = (iface.ip.packed, iface.network.prefixlen, iface.version)
        if item not in expected:
            expected.append(item)
    got = [(ipaddress.ip_address(i["address"]).packed, i["prefix"], i["family"]) for i in fast]
    assert got == expected


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
        models.Record.model_validate_json(path.read_text())
        json.loads(path.read_text())


EDGES = [("lockTimeout", v) for v in (300, 300.0, 300.5, 301, 0, 0.0, 1e-9, -0.0, True, "10", float("inf"))] + \
    [("backend", v) for v in ("auto", "nft", "legacy", "Legacy", "iptables", "", None)] + \
    [("logFile", v) for v in ("", "/x", "x", "/" + "a" * 1023, "/" + "a" * 1024, None)] + \
    [("stateDir", v) for v in ("/", "/a\0b", "", " /x")] + \
    [("runtimeConfig", {"portMappings": [dict(hostPort=h, containerPort=c, **extra)]})
     for h, c, extra in ((1, 65535, {}), (0, 80, {}), (65536, 80, {}), (80, 80, {"protocol": "SCTP"}),
                         (80, 80, {"protocol": 6}), (80, 80, {"hostIP": "::"}), (80, 80, {"hostIP": "1.2.3.4/32"}),
                         (True, 80, {}), (80.0, 80, {}))]


def test_config_mirror_agrees_on_the_boundaries():
    for field, value in EDGES:
        raw = json.loads(json.dumps(VALID_CONF))
        raw[field] = value
        fast, slow = _fast(raw), _slow(raw)
        assert (fast is None) == (slow is None), (field, value)


def test_prev_result_mirror_agrees_on_the_boundaries():
    entries = [{"address": a} for a in ("10.0.0.1/32", "10.0.0.1/33", "10.0.0.1/024", "10.0.0.1/0024", "fd00::1/128",
                                         "fd00::1/129", "fd00::1/0", "10.0.0.1/", "/24", "10.0.0.1/24/1", "::ffff:10.0.0.1/96")]
    entries += [{"address": "10.0.0.1/24", "version": v} for v in ("4", "6", "5", 4)]
    entries += [{"address": "fd00::1/64", "version": v} for v in ("6", "4")]
    entries += [{"address": "10.0.0.1/24", "gateway": g} for g in ("10.0.0.254", "fd00::1", "10.0.0.256", "", None)]
    entries += [{"address": "10.0.0.1/24", "interface": i} for i in (0, 1, -1, True, "0")]
    for entry in entries:
        address = entry
        raw = {"interfaces": [{"name": "eth0"}], "ips": [entry]}
        try:
            fast = result.recorded_ips(raw)
        except CniError:
            fast = None
        try:
            slow = models.PrevResult.model_validate(raw)
        except ValidationError:
            slow = None
        assert (fast is None) == (slow is None), address
