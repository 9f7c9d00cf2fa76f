"""ADD: record the attachment, pass prevResult through unchanged, sweep what dead attachments left."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.cni.shell import Invocation

from cni_reaper import log
from cni_reaper.errors import INVALID_CONFIG, CniError
from cni_reaper.gojson import lookup
from cni_reaper.state.record import merge
from cni_reaper.state.store import Store
from cni_reaper.verbs.recording import current_life, settings


def run(inv: Invocation) -> dict[str, Any]:
    conf = inv.conf
    if conf.prevResult is None:
        raise CniError(
            INVALID_CONFIG,
            "cni-reaper must be chained after an interface-creating plugin",
            "put it last in a conflist's plugins list, after bridge/firewall/portmap; it got no prevResult",
        )
    if not conf.portMappingsDeclared:
        log.warn("cni-reaper's conflist entry does not declare the portMappings capability, so the runtime "
                 "hands it no port mappings: none recorded (dead attachments' DNAT rules are still found by "
                 "their owner tag)", fix='add "capabilities": {"portMappings": true} to cni-reaper\'s entry')
    current = current_life(inv)
    store = Store(conf.stateDir, conf.lockTimeout).open()
    try:
        with store.locked():
            if store.waited > 0.1:
                log.info("waited for the state lock", seconds=round(store.waited, 3))
            existing = store.load(conf.name, inv.container_id, inv.ifname)
            record, kept = merge(existing, conf.name, inv.container_id, inv.ifname, current, inv.args, settings(conf))
            store.save(record)
            if kept:
                log.info("re-added: earlier life kept for clean-up", earlier=len(record["earlier"]))
            # the new life is recorded (so its addresses are protected); now clear what dead ones left,
            # including DNAT jumps that would shadow this attachment's host ports
            from cni_reaper.reap.sweep import sweep_quietly

            sweep_quietly(store, conf)
    finally:
        store.close()
    result = dict(conf.prevResult)
    if not lookup(result, "cniVersion")[0]:
        result["cniVersion"] = inv.version
    return result
