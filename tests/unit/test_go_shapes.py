"""Never block an allocation (issue: compatibility). cni-reaper accepts every request that the Go reference
plugins accept, because they decode with Go's encoding/json: keys in any case (including the two non-ASCII
letters Go folds to ASCII), `null` for a field meaning its zero value, unknown keys ignored, the last of
several spellings of one key winning. Generated from canonical requests of the shapes Nomad's releases send,
each variant must give ADD, CHECK and DEL success and record exactly what the canonical request records.
CNI_REAPER_GO_SHAPES_EXAMPLES sets the number of variants (5,000 by default, as in CI)."""

from __future__ import annotations

import copy
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper.gojson import fold, lookup
from testkit.cni import NETNS, invoke

pytestmark = pytest.mark.usefixtures("private_host")  # verbs in process: a throwaway netns and mount ns

EXAMPLES = int(os.environ.get("CNI_REAPER_GO_SHAPES_EXAMPLES", "5000"))

NOMAD_PORTS = [{"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""},
               {"HostPort": 8080, "ContainerPort": 80, "Protocol": "udp", "HostIP": ""}]
TAGGED_PORTS = [{"hostPort": 25000, "containerPort": 5000}]  # CRI-style tags, protocol left to its default


def bridge_result(version: str, dual: bool) -> dict:
    """What bridge (with host-local) returns, as libcni hands it on as prevResult."""
    ips: list[dict] = [{"address": "172.26.64.7/20", "gateway": "172.26.64.1", "interface": 2}]
    if dual:
        ips.append({"address": "fd00:a:26::7/64", "gateway": "fd00:a:26::1", "interface": 2})
    if version.startswith("0."):
        for ip in ips:
            ip["version"] = "6" if ":" in ip["address"] else "4"
    return {"cniVersion": version,
            "interfaces": [{"name": "nomad", "mac": "02:00:00:00:00:01"},
                           {"name": "veth1234", "mac": "02:00:00:00:00:02"},
                           {"name": "eth0", "mac": "02:00:00:00:00:03", "sandbox": NETNS}],
            "ips": ips, "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}


def canonical(state_dir: str, log: str, version: str, dual: bool, ports: list | None) -> dict:
    doc = {"cniVersion": version, "name": "nomad-reaper", "type": "cni-reaper",
           "capabilities": {"portMappings": True}, "stateDir": state_dir, "logFile": log,
           "prevResult": bridge_result(version, dual)}
    if ports is not None:
        doc["runtimeConfig"] = {"portMappings": copy.deepcopy(ports)}
    return doc


# The Go struct fields cni-reaper reads, per object kind, and what a `null` or an empty value may replace
# without changing what a Go plugin sees. Paths lead from the top of the document to each object.
FIELDS = {
    "top": ["cniVersion", "name", "type", "stateDir", "logFile", "prevResult", "runtimeConfig", "capabilities"],
    "runtime": ["portMappings"],
    "port": ["HostPort", "ContainerPort", "Protocol", "HostIP", "hostPort", "containerPort", "protocol", "hostIP"],
    "result": ["cniVersion", "interfaces", "ips", "routes", "dns"],
    "ip": ["address", "gateway", "interface", "version"],
    "iface": ["name", "mac", "sandbox"],
}
ABSENT_OK = {  # fields that may be added as null (or their zero) when absent: Go sees its zero value either way
    "top": ["ipamDataDir", "cniCacheDir", "backend", "lockTimeout", "cniVersions"],
    "port": ["hostIP", "HostIP"],
    "ip": ["gateway"],
    "iface": ["mtu", "socketPath", "pciID"],
    "result": ["routes", "dns"],
}
ZERO = {"ipamDataDir": "", "cniCacheDir": "", "backend": "", "lockTimeout": 0, "cniVersions": [], "hostIP": "",
        "HostIP": "", "gateway": "", "mtu": 0, "socketPath": "", "pciID": "", "routes": [], "dns": {}}


def objects(doc: dict) -> list[tuple[str, dict]]:
    """(kind, object) of every struct-like object of the document."""
    out = [("top", doc)]
    rc = lookup(doc, "runtimeConfig")[1]
    if isinstance(rc, dict):
        out.append(("runtime", rc))
        out += [("port", p) for p in lookup(rc, "portMappings")[1] or [] if isinstance(p, dict)]
    prev = lookup(doc, "prevResult")[1]
    out.append(("result", prev))
    out += [("ip", ip) for ip in lookup(prev, "ips")[1] or [] if isinstance(ip, dict)]
    out += [("iface", i) for i in lookup(prev, "interfaces")[1] or [] if isinstance(i, dict)]
    return out


def respell(draw, name: str, taken=()) -> str:
    """Another spelling Go still matches to the same field (none of `taken`)."""
    choices = [name.lower(), name.upper(), name.swapcase(), name[:1].swapcase() + name[1:]]
    if "s" in name:
        choices.append(name.replace("s", "\u017f", 1))  # LATIN SMALL LETTER LONG S folds to s
    if "k" in name.lower():
        choices.append(name.replace("k", "\u212a").replace("K", "\u212a"))  # KELVIN SIGN folds to k
    mixed = "".join(c.upper() if draw(st.booleans()) else c.lower() for c in name)
    choices.append(mixed)
    fresh = [c for c in choices if c != name and c not in taken]
    return draw(st.sampled_from(fresh)) if fresh else name


def rebuild(obj: dict, items: list[tuple[str, object]]) -> None:
    obj.clear()
    obj.update(items)


RUNTIME_CONFIGS = {"none-null": {"portMappings": None},  # Nomad <= 1.7: a nil slice through go-cni
                   "none-empty": {"portMappings": []},  # Nomad >= 1.8
                   "none-absent": {}}


def _shadow(draw, obj: dict, present: list[str]) -> None:
    """An earlier spelling of the same key with another value of the right type: the last one wins."""
    name = draw(st.sampled_from(present))
    value = obj[name]
    decoy = {str: "decoy", int: 1, list: [], dict: {}, bool: False}.get(type(value))
    if decoy is not None and not isinstance(value, bool) and name not in (
            "prevResult", "stateDir", "logFile", "address", "gateway"):
        spelling = respell(draw, name, taken=obj)
        if spelling != name:
            rebuild(obj, [(spelling, decoy), *obj.items()])


def _vary(draw, kind: str, obj: dict) -> None:
    """One change Go's decoding does not see: another spelling, a null or zero for an absent key, an unknown
    key, a shadowed key, another order of the keys, a null for a string."""
    how = draw(st.sampled_from(["respell", "respell", "null-absent", "zero-absent", "extra", "shadow", "shuffle",
                                "null-unused"]))
    present = [k for k in obj if k in FIELDS[kind]]
    if how == "respell" and present:
        name = draw(st.sampled_from(present))
        new = respell(draw, name, taken=obj)
        rebuild(obj, [(new if k == name else k, v) for k, v in obj.items()])
    elif how in ("null-absent", "zero-absent") and ABSENT_OK.get(kind):
        name = draw(st.sampled_from(ABSENT_OK[kind]))
        if not any(k.lower() == name.lower() for k in obj):
            obj[name] = None if how == "null-absent" else copy.deepcopy(ZERO[name])
    elif how == "extra":
        obj[draw(st.sampled_from(["x-extra", "future", "ipam", "dns2", "cni.dev/x"]))] = draw(
            st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2)))
    elif how == "shadow" and present:
        _shadow(draw, obj, present)
    elif how == "shuffle" and len({fold(k) for k in obj}) == len(obj):
        # (not where two spellings of one key stand: their order decides which one Go takes)
        rebuild(obj, draw(st.permutations(list(obj.items()))))
    elif how == "null-unused" and kind == "iface" and "mac" in obj:
        obj["mac"] = None  # strings: null leaves Go's zero value


@st.composite
def variants(draw):
    version = draw(st.sampled_from(["0.3.1", "0.4.0", "1.0.0", "1.1.0"]))
    dual = draw(st.booleans())
    ports = draw(st.sampled_from(["nomad", "tagged", "none-absent", "none-null", "none-empty", "none-no-runtime",
                                  "none-runtime-null"]))
    shapes: dict[str, list] = {"nomad": NOMAD_PORTS, "tagged": TAGGED_PORTS}
    base = shapes.get(ports)
    key = (version, dual, ports if base is not None else "none")
    doc = canonical("@STATE@", "@LOG@", version, dual, base)
    if ports in RUNTIME_CONFIGS:
        doc["runtimeConfig"] = copy.deepcopy(RUNTIME_CONFIGS[ports])
    elif ports == "none-runtime-null":
        doc["runtimeConfig"] = None
    for _ in range(draw(st.integers(1, 6))):
        kind, obj = draw(st.sampled_from(objects(doc)))
        _vary(draw, kind, obj)
    return key, doc


def fill(doc, state_dir: str, log: str) -> str:
    return json.dumps(doc).replace('"@STATE@"', json.dumps(state_dir)).replace('"@LOG@"', json.dumps(log))


def attachment(state_dir) -> dict:
    [path] = list(state_dir.glob("r-*.json"))
    record = json.loads(path.read_text())
    for inc in [record["current"], *record["earlier"]]:
        inc.pop("createdAt")
    record.pop("deleted")
    return record


_canonical_records: dict = {}


def expected(key, tmp_path_factory) -> dict:
    if key not in _canonical_records:
        version, dual, ports = key
        state = tmp_path_factory.mktemp("canon")
        shapes: dict[str, list] = {"nomad": NOMAD_PORTS, "tagged": TAGGED_PORTS}
        base = shapes.get(ports)
        doc = canonical(str(state / "s"), str(state / "log"), version, dual, base)
        assert invoke("ADD", doc, cid="alloc-7")[0] == 0
        _canonical_records[key] = attachment(state / "s")
    return _canonical_records[key]


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@pytest.mark.slow
@given(case=variants())
def test_every_request_go_plugins_accept_is_accepted_and_recorded_the_same(tmp_path_factory, case):
    key, doc = case
    state = tmp_path_factory.mktemp("v")
    text = fill(doc, str(state / "s"), str(state / "log"))
    rc, out = invoke("ADD", text, cid="alloc-7")
    assert rc == 0, (text, out)
    assert attachment(state / "s") == expected(key, tmp_path_factory), text
    sent = json.loads(text)
    assert [v for k, v in sent.items() if fold(k) == "prevresult"][-1].items() <= out.items()
    if key[0] != "0.3.1":  # libcni sends CHECK from 0.4.0 on
        rc, out = invoke("CHECK", text, cid="alloc-7")
        assert rc == 0 and out is None, (text, out)
    rc, out = invoke("DEL", text, cid="alloc-7")
    assert rc == 0 and out is None, (text, out)
    [path] = list((state / "s").glob("r-*.json"))
    assert json.loads(path.read_text())["deleted"] is not None


def test_the_variants_do_vary():
    """So that the property above cannot pass on canonical requests alone."""
    seen = set()

    @settings(max_examples=300, deadline=None)
    @given(case=variants())
    def collect(case):
        text = json.dumps(case[1])
        for marker in ("\u017f", "\\u017f", "\\u212a", "HOSTPORT", "null", "x-extra", "PORTMAPPINGS", "PrevResult"):
            if marker.lower() in text.lower():
                seen.add(marker.lower())

    collect()
    assert {"null", "x-extra", "hostport", "\\u017f"} <= seen, seen
