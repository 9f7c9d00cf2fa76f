"""`cni-reaper doctor`: the conflists, the host, the records and what the client leaks now, checked (tools/doctor.py
holds the checks); changes nothing."""

from __future__ import annotations

from cni_reaper.errors import CniError
from cni_reaper.tools import context
from cni_reaper.tools.exits import EXIT_DOCTOR, EXIT_OK
from cni_reaper.tools.printed import print_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.tools.context import Context
    from cni_reaper.tools.doctor import Finding

DEFAULT_CNI_PATH = "/opt/cni/bin:/usr/lib/cni"  # Nomad's client cni_path default, then Debian's plugins


def run(args) -> int:
    from cni_reaper.tools import doctor

    dirs, found = context.scan_dirs(args)
    contexts, skipped = context.contexts(args, (dirs, found))
    nomad = doctor.nomad_cni_path(args.nomad_config)
    cni_path = [d for d in args.cni_path.split(":") if d] if args.cni_path else (
        nomad[0] if nomad else DEFAULT_CNI_PATH.split(":"))
    wrap = doctor.check_wrap(cni_path, nomad)
    findings = doctor.check_scan(found, dirs, wrapped=bool(wrap)) + wrap
    findings += doctor.check_settings_file(context.settings_path(args))
    findings += _doctor_networks(args, found, contexts, cni_path)
    findings += _doctor_records(contexts)
    findings += _doctor_leaks(args, contexts)
    findings += doctor.check_iptables(contexts[0].conf.backend)
    findings.append(doctor.check_nftables())
    findings += doctor.check_nomad(args)
    failed = any(f.status == doctor.FAIL for f in findings) or skipped
    if args.json:
        print_json("doctor", {"ok": not failed, "findings": [f.as_dict() for f in findings]})
    else:
        for f in findings:
            print(f.line())
        print(doctor.summary(findings))
    return EXIT_DOCTOR if failed else EXIT_OK


def _doctor_networks(args, found, contexts: list[Context], cni_path: list[str]) -> list:
    """doctor's findings of each network: its conflist (shadowed by another file of its name, the chain's
    order and capabilities, host-local's directory, the plugins), its state directory, log file and mode."""
    from cni_reaper.tools import doctor

    findings = [doctor.check_shadowed(n) for n in found.networks if n.shadowed_by is not None and n.name in
                (args.network or n.name,)]
    by_name = {n.name: n for n in found.networks if n.shadowed_by is None}
    for c in contexts:
        n = by_name.get(c.network or "")
        if n is not None:
            findings += [doctor.check_order(n), doctor.check_capability(n), doctor.check_ipam_dir(n, c.conf)]
            findings += doctor.check_plugins(n, cni_path)
        # a wrapped network (its settings file), or none: the flags and defaults
        label = c.network or "(defaults)"
        findings += doctor.check_own_files(label, c.conf) + [doctor.check_mode(label, c.conf.mode, c.source)]
    return findings


def _doctor_records(contexts: list[Context]) -> list:
    """doctor's checks of the records: dead ones waiting, and what cannot be judged from here, and why."""
    from cni_reaper.reap.engine import host_view
    from cni_reaper.tools import doctor

    out = []
    view = host_view()
    recorded = 0
    for state_dir, group in context.by_state_dir(contexts).items():
        try:
            records = context.records_in(state_dir)
        except CniError:
            continue  # a state directory that cannot be used: the state-dir check says why
        recorded += len(records)
        states = list(context.states(records, group, view).values())
        out.append(doctor.check_records(state_dir, [c.network or "(defaults)" for c in group], states))
        out += doctor.check_sharing(state_dir, [c for c in group if c.network], records)
    out += doctor.check_view(view, [c.conf for c in contexts], recorded)
    return out


def _doctor_leaks(args, contexts: list[Context]) -> list:
    """What the client leaks now, as `sweep --orphans` (a dry run, the same judgement) finds it, and the host
    ports more than one container maps (a dead allocation's DNAT shadowing a live one's, or a conflict)."""
    from argparse import Namespace

    from cni_reaper.reap import engine, probes
    from cni_reaper.tools import doctor
    from cni_reaper.tools.cmd_sweep import sweep_group

    total, view = engine.outcome(), engine.host_view(at_once=True)
    dry = Namespace(**{**vars(args), "orphans": True, "apply": False})
    try:
        for group in context.by_state_dir(contexts).values():
            sweep_group(dry, group, total, view)
        doubled = probes.doubled_ports()
    except Exception as exc:  # noqa: BLE001 - doctor reports, it does not fail on what it cannot look at
        return [doctor.Finding(doctor.WARN, "leaks", "", f"what this client leaks could not be looked at ({exc})")]
    return [_leaks_finding({**total.removed, **total.would}, doubled, sum(view.blind.values()))]


def _leaks_finding(found: dict, doubled: dict[str, set[str]], unknown: int) -> Finding:
    """What a dry `sweep --orphans` found (attachment -> items) and the host ports mapped twice, as one finding."""
    from cni_reaper.tools import doctor

    items = sum(len(v) for v in found.values())
    reserved = sum(1 for v in found.values() for item in v if item.startswith("host-local reservation"))
    said = (f"; {unknown} attachment(s) could not be judged (`cni-reaper sweep --orphans` says why)" if unknown else "")
    ports = "; ".join(f"{port} by {', '.join(sorted(owners))}" for port, owners in sorted(doubled.items()))
    if not found and not doubled:
        return doctor.Finding(doctor.OK, "leaks", "", "no dead attachment's rules or reservations are left, and no "
                              f"host port is mapped twice{said}")
    parts = [f"{len(found)} dead attachment(s) left {items} item(s), {reserved} of them reservation(s)"] if found else []
    parts += [f"host ports mapped by more than one container: {ports}"] if doubled else []
    return doctor.Finding(doctor.WARN, "leaks", "", "; ".join(parts) + said, "`cni-reaper sweep --orphans` lists them "
                          "with the evidence; `cni-reaper sweep --orphans --apply` removes what is proven dead")
