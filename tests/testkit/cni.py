from __future__ import annotations

import io
import json
from pathlib import Path

from cni_reaper.cni import shell
from cni_reaper.verbs.dispatch import dispatch

NETNS = "/proc/self/ns/net"  # a live network namespace anyone can stat


def prev_result(version: str = "1.0.0", address: str = "172.26.64.2/20", netns: str = NETNS) -> dict:
    ip = {"address": address, "gateway": "172.26.64.1", "interface": 2}
    if version.startswith("0."):
        ip["version"] = "6" if ":" in address else "4"
    return {
        "cniVersion": version,
        "interfaces": [{"name": "nomad", "mac": "aa:bb:cc:dd:ee:01"}, {"name": "veth1", "mac": "aa:bb:cc:dd:ee:02"},
                       {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": netns}],
        "ips": [ip],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {},
    }


def conf(state_dir, version: str = "1.0.0", prev: dict | str | None = "default", **extra) -> dict:
    base = Path(state_dir).parent
    c: dict = {"cniVersion": version, "name": "nomad-reaper", "type": "cni-reaper", "stateDir": str(state_dir),
         "logFile": str(base / "cni-reaper.log"), "cniCacheDir": str(base / "cache"), "ipamDataDir": str(base / "ipam")}
    if prev == "default":
        prev = prev_result(version)
    if prev is not None:
        c["prevResult"] = prev
    c.update(extra)
    return c


def invoke(command: str, config, cid: str = "alloc-1", netns: str = NETNS, ifname: str = "eth0",
           **env) -> tuple[int, dict | None]:
    """Run one CNI invocation in process, exactly as the entry point does."""
    e = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": ifname,
         "CNI_PATH": "/opt/cni/bin"}
    e.update(env)
    e = {k: v for k, v in e.items() if v is not None}
    data = config if isinstance(config, bytes) else (config.encode() if isinstance(config, str) else json.dumps(config).encode())
    out = io.StringIO()
    rc = shell.run(e, io.BytesIO(data), out, dispatch)
    text = out.getvalue()
    return rc, (json.loads(text) if text else None)
