"""Nomad's own `bridge` network as Nomad 2.0 builds it in memory (client/allocrunner/cni/bridge.go and its
test fixtures): no file of it exists on a client, so nothing can be chained onto it; cni-reaper wraps its
`portmap` instead (wrap mode). And a sandbox set up as a client that wraps it: a wrapper directory first in the
plugin path (as Nomad passes cni_path), cni-reaper's settings file named by CNI_REAPER_CONFIG."""

from __future__ import annotations

import json
from pathlib import Path

from testkit.sandbox import Sandbox


def bridge_conflist(ipv6: bool = False, consul_cni: bool = False, hairpin: bool = False, version: str = "0.4.0") -> dict:
    ranges = [[{"subnet": "172.26.64.0/20"}]]
    routes = [{"dst": "0.0.0.0/0"}]
    if ipv6:
        ranges.append([{"subnet": "3fff:cab0:0d13::/120"}])
        routes.append({"dst": "::/0"})
    plugins: list[dict] = [
        {"type": "loopback"},
        {"type": "bridge", "bridge": "nomad", "ipMasq": True, "isGateway": True, "forceAddress": True,
         "hairpinMode": hairpin, "ipam": {"type": "host-local", "ranges": ranges, "routes": routes,
                                          "dataDir": "/var/run/cni"}},
        {"type": "firewall", "backend": "iptables", "iptablesAdminChainName": "NOMAD-ADMIN"},
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
    ]
    if consul_cni:
        plugins.append({"type": "consul-cni", "log_level": "debug"})
    return {"cniVersion": version, "name": "nomad", "plugins": plugins}


CONSUL_CNI = r'''#!/usr/bin/env python3
# A stand-in for consul-cni (transparent proxy), last in Nomad's bridge chain: on ADD it passes prevResult
# through (the real one adds a redirect rule inside the allocation's netns, which needs Consul); DEL and CHECK
# succeed.
import json, os, sys
cmd = os.environ.get("CNI_COMMAND", "")
if cmd == "VERSION":
    print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]}))
    sys.exit(0)
conf = json.load(sys.stdin)
if cmd == "ADD":
    out = dict(conf.get("prevResult") or {})
    out.setdefault("cniVersion", conf.get("cniVersion"))
    print(json.dumps(out))
'''


class Client:
    """A sandbox as a Nomad client that wraps portmap: `conflist` is Nomad's bridge network (written to a
    file only for the test driver), `plugindir` the cni_path with the wrapper directory first."""

    def __init__(self, sb: Sandbox, ipv6: bool = False, consul_cni: bool = False, version: str = "0.4.0",
                 settings: dict | None = None) -> None:
        self.sb = sb
        self.wrap = sb.root / "wrap"
        self.wrap.mkdir(exist_ok=True)
        link = self.wrap / "portmap"
        if not link.exists():
            link.symlink_to(sb.plugin_dir / "cni-reaper")
        if consul_cni and not (sb.plugin_dir / "consul-cni").exists():
            (sb.plugin_dir / "consul-cni").write_text(CONSUL_CNI)
            (sb.plugin_dir / "consul-cni").chmod(0o755)
        self.settings = sb.root / "cni-reaper.json"
        self.settings.write_text(json.dumps({"logFile": str(sb.log_file), **(settings or {})}))
        sb.extra_env["CNI_REAPER_CONFIG"] = str(self.settings)
        sb.plugin_path = f"{self.wrap}:{sb.plugin_dir}:{sb.plugins}"
        self.conflist = sb.root / f"nomad-bridge{'-ds' if ipv6 else ''}{'-consul' if consul_cni else ''}.conflist"
        self.conflist.write_text(json.dumps(bridge_conflist(ipv6, consul_cni, version=version), indent=1))

    def driver(self, op: str, cid: str = "", netns: str = "", ports: tuple[str, ...] = (), **kw):
        return self.sb.driver(op, cid, netns, ports, self.conflist, **kw)


def reservations_dir(sb: Sandbox) -> Path:
    return sb.run_cni / "nomad"
