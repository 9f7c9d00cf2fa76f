"""Red team rt44: the fixes of 3a1b582 (modes of wrapped networks, STATUS's lock wait, later records, undo's
holder map, the damaged index, cache entries dated ahead) and their neighbourhood, attacked in throwaway
namespaces. Tests that FAIL on main are breaks; those marked "held" in their docstring passed."""

from __future__ import annotations

import json
import shutil

import pytest

from testkit.sandbox import ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns

NET = "nomad-reaper"



def _damage(path, how: str) -> None:
    if how == "intact":
        return
    if how == "torn":
        path.write_text('{"nomad-reap')
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "list":
        path.write_text(json.dumps([NET]))
    else:
        raise AssertionError(how)


# -- 1. modes: a damaged .wrapped -----------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["intact", "torn", "directory", "list"])
@pytest.mark.parametrize("sweeper", ["cli-sweep-apply"])
def test_a_damaged_wrapped_file_never_turns_a_wrappers_observe_into_clean(nsb, how, sweeper):
    """Promise: observe from any source removes nothing anywhere. A client wraps portmap (wrapper directory
    first on cni_path) and its settings file (CNI_REAPER_CONFIG) says `"mode": "observe"`; nomad-reaper's
    conflist chains cni-reaper (clean) and its portmap is wrapped, so the wrapper's calls note
    `.wrapped = {"nomad-reaper": "observe"}` (the only place the wrapper's observe is kept: the network is
    chained, so the settings file's top level does not govern it). An allocation dies (netns gone, no DEL).
    With `.wrapped` intact (control) the CLI's `sweep --apply` and another allocation's DEL observe it. When
    `.wrapped` is damaged (torn write, a directory, not an object) its word is silently dropped ({}), and
    the same sweep removes the dead allocation's rules, reservation and record, although `.modes` in the same
    state (state/modes.modes) makes every network observed when it cannot be read.
    (Another allocation's DEL on nomad-reaper held: its wrapped portmap's call writes .wrapped anew first.)
    Reproduce: pytest -k test_a_damaged_wrapped_file_never_turns_a_wrappers_observe_into_clean.
    Root cause: state/modes.py wrapped_networks `return _load(store, WRAPPED) or {}` (None, "cannot be
    read", becomes "no network wrapped"); judge/modes.mode_of then reads only `.modes`' clean."""
    from testkit.nomad import Client

    sb = nsb
    Client(sb, settings={"mode": "observe"})
    conf = sb.conflist()
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, ("8131:80/tcp",), conf))
    sb.remove_container(netns)
    wrapped = sb.state_dir() / ".wrapped"
    assert json.loads(wrapped.read_text()).get(NET) == "observe", wrapped.read_text()
    before = sb.residue(NET, cid, ips)
    assert before
    if sweeper == "del-of-another":  # an ADD's wrapped portmap would write .wrapped anew: damage after it
        other, ns = unique("alloc-"), sb.container()
        ips_of(sb.driver("add", other, ns, ("8132:80/tcp",), conf))
        _damage(wrapped, how)
        out = sb.driver("del", other, ns, ("8132:80/tcp",), conf)
        said = out.stderr
    else:
        _damage(wrapped, how)
        conf_dir = sb.root / "net.d"
        conf_dir.mkdir(exist_ok=True)
        shutil.copy(conf, conf_dir / "10-nomad-reaper.conflist")
        out = sb.run([str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", "--cni-conf-dir", str(conf_dir)])
        said = out.stdout + out.stderr
    after = sb.residue(NET, cid, ips)
    assert after == before, ("observed allocation cleaned", how, said[-2000:])


# -- 4. undo's holder map: an operator's own nftables table named like iptables' ------------------------------
@pytest.fixture
def box(tmp_path, package_exe):
    from testkit.sandbox import Stack

    with open_sandbox(tmp_path, "nft", package_exe, Stack("1.9", "go-cni-1.1.13")) as sb:
        yield sb


def _leak(sb, port: str, conflist=None) -> tuple[str, list[str]]:
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, (port,), conflist))
    sb.remove_container(netns)
    return cid, ips


def _operator_table(sb, table: str, port: int) -> str:
    """A live task at 172.31.9.2:80 (a namespace of its own) that host port `port` reaches through an
    operator's hand-written nftables table (`nft -f /etc/nftables.conf`), named `table`."""
    from testkit.foreign import foreign_task

    live = foreign_task(sb)
    script = (f"table {table} {{\n"
              f" chain prerouting {{ type nat hook prerouting priority -90; policy accept;\n"
              f"  tcp dport {port} dnat to 172.31.9.2:80\n }}\n"
              f" chain output {{ type nat hook output priority -90; policy accept;\n"
              f"  tcp dport {port} dnat to 172.31.9.2:80\n }}\n}}\n")
    sb.run(["nft", "-f", "-"], input=script, check=True)
    return live


@pytest.mark.parametrize("table", ["ip nat", "ip filter", "ip mangle", "ip operator"])
@pytest.mark.parametrize("world", ["iptables", "native"])
def test_undo_never_shadows_a_live_task_behind_an_operators_nft_table_named_like_iptables(box, world, table):
    """Promise: undo never puts back something that shadows a live holder ("a host port something else holds
    now": README "Undo"). A dead allocation mapped host port 8141 and was swept. Then the operator's own
    nftables ruleset (the textbook `/etc/nftables.conf`: `table ip nat { chain prerouting { type nat hook
    prerouting priority dstnat; tcp dport 8141 dnat to 172.31.9.2:80 } }`) reaches a live task through that
    port. `cni-reaper undo <dead>` puts the dead DNAT back (nothing refused) and connections to the port go to
    the dead address.
    Root cause: reap/netfilter/nftables/backend.py `foreign_tables` leaves out every ip/ip6 table named
    nat/filter/mangle/raw/security ("iptables' own: its save tool reads those"), but iptables-nft-save does
    not read a native base chain: it prints "# Table `nat' contains incompatible base-chains, use 'nft' tool
    to list them." and exits 0, listing none of its rules (for `ip filter`/`ip mangle` it reads no nat rule
    at all); so reap/holders.py port_map() sees the operator's DNAT in neither world, and is not blind.
    BREAK for `ip nat`, `ip filter`, `ip mangle` in both worlds, every run; held for `ip operator` (the fix).
    Reproduce: pytest -k test_undo_never_shadows_a_live_task_behind_an_operators_nft_table_named_like_iptables."""
    sb = box
    port = 8141
    conf = sb.native_conflist() if world == "native" else sb.conflist()
    cid, _ips = _leak(sb, f"{port}:80/tcp", conf)
    assert sb.cli("sweep", "--apply").returncode == 0
    live = _operator_table(sb, table, port)
    gw = "172.26.64.1"
    assert sb.reach(live, gw, port, "operators-task") == "operators-task"
    out = sb.cli("undo", cid)
    after = sb.reach(live, gw, port, "operators-task")
    assert after == "operators-task", (after, out.returncode, out.stdout[-1500:], out.stderr[-1500:])


# -- 6. a time ahead of now bounds no reservation: a record of cni-reaper 0.2 -----------------------------------
def _as_written_by_0_2(created: str):
    def change(rec: dict) -> None:  # what cni-reaper 0.2 wrote (schema 1: tests/unit/test_schema.py _valid_record)
        rec["schema"] = 1
        rec.pop("settings", None)
        for life in [rec["current"], *rec["earlier"]]:
            for k in ("netnsDir", "host", "veth"):
                life.pop(k, None)
            if life.get("netnsId"):
                life["netnsId"].pop("ctime", None)
            for ip in life["ips"]:
                ip.pop("reservation", None)
        if rec.get("deleted"):
            rec["deleted"].pop("cached", None)
        rec["current"]["createdAt"] = created
    return change


@pytest.mark.parametrize("ahead", [True, False], ids=["created-ahead", "control-created-before-held"])
@pytest.mark.parametrize("sweeper", ["cli-sweep-apply", "add-of-another"])
def test_a_forming_re_add_keeps_its_reservation_against_a_0_2_record_dated_ahead(nsb, ahead, sweeper):
    """Promise: nothing a forming attachment holds is removed (dead only on positive evidence). X was recorded
    by cni-reaper 0.2 (a schema 1 record: no reservation identity, only createdAt) while the clock ran a day
    ahead (corrected since: NTP, a boot). X dies (netns gone, no DEL) and host-local lost its reservation (a
    tmpfs, a boot). Nomad adds X again (same ID) and that ADD is held after bridge/portmap, before cni-reaper
    records it: X's new reservation exists. A sweep (the CLI's `sweep --apply`, or another allocation's ADD)
    judges the 0.2 record dead and takes X's new reservation as the dead life's own (it names X and is no
    newer than createdAt), and releases it with the forming life's own chains (its masquerade chain, its
    hostport DNAT chain and jump, its firewall rules): the re-ADD, once released, is a task with no DNAT, no
    masquerade, and an address the next ADD takes. Every run; the control (createdAt a day before) held:
    "a host-local reservation ... names it and is not the one it recorded: a newer life of it".
    The fix of 3a1b582 (judge/reservations.bound: a time ahead of now bounds nothing) was applied to libcni's
    cache entries (reap/orphans.py) only.
    Root cause: reap/sweep.py `_expect` (line ~214): `Expect(..., not_after=int(life.created * 1e9))` with no
    `bound(..., now)`; judge/reservations.own then accepts any file naming X modified before createdAt.
    Reproduce: pytest -k test_a_forming_re_add_keeps_its_reservation_against_a_0_2_record_dated_ahead."""
    import datetime

    from testkit.sandbox import Held, add_stall_plugin

    sb = nsb
    conf = sb.conflist()
    x = unique("zero-two-")
    ips_of(sb.driver("add", x, sb.container(), ("8151:80/tcp",), conf))
    sb.remove_container(next(p for p in [sb.record(x)["current"]["netns"]]))
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1 if ahead else -1)
    sb.edit_record(x, _as_written_by_0_2(when.strftime("%Y-%m-%dT%H:%M:%SZ")))
    res_dir = sb.cni_dir / "networks" / NET
    shutil.rmtree(res_dir)  # host-local's reservations lost (a tmpfs and a boot): the same address is next
    stalled, stall_dir = add_stall_plugin(sb, conf)
    held = Held(sb, stalled, stall_dir, x, sb.container(), ("8151:80/tcp",))
    try:
        held.wait()
        forming = {ip: o for ip, o in sb.reservations(NET).items() if o == x}
        assert forming
        if sweeper == "cli-sweep-apply":
            conf_dir = sb.root / "net.d"
            conf_dir.mkdir(exist_ok=True)
            shutil.copy(conf, conf_dir / "10-nomad-reaper.conflist")
            out = sb.run([str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", "--cni-conf-dir", str(conf_dir)])
            said = out.stdout + out.stderr
        else:
            out = sb.driver("add", unique("other-"), sb.container(), ("8152:80/tcp",), conf)
            said = out.stderr
        now = {ip: o for ip, o in sb.reservations(NET).items() if o == x}
    finally:
        done = held.release()
    assert now == forming, ("the forming re-ADD's reservation was released", said[-2000:])
    assert done.returncode == 0, done.stderr


# -- 1b. modes: 0.5.0's `.wrapped` upgraded on a network both chained (observe) and wrapped ---------------------
@pytest.mark.parametrize("legacy", [True, False], ids=["from-0.5.0", "control-fresh"])
def test_a_0_5_0_wrapped_file_upgrade_never_drops_the_conflists_observe(nsb, legacy):
    """Promise: observe from any source removes nothing anywhere. nomad-reaper chains cni-reaper in observe
    (its conflist) and its portmap is wrapped (wrapper directory first on cni_path), the settings file saying
    observe too. cni-reaper 0.5.0 left `.wrapped = {"nomad-reaper": "wrapped"}` and `.modes =
    {"nomad-reaper": "observe"}`. After the upgrade, the first wrapped portmap call (a DEL: libcni runs
    portmap after cni-reaper's entry there, so nothing notes the conflist's mode again after it) finds its own mode
    equal to `.modes`' and takes that word for 0.5.0's wrapper's (state/modes.py network_modes ->
    _forget_mode): the conflist's observe is deleted from `.modes`. The operator then sets the settings file to
    clean (the wrapped networks only: nomad-reaper's conflist still says observe). An allocation of
    nomad-reaper dies; the next ADD on nomad-reaper runs the wrapped portmap before cni-reaper's conflist entry,
    and the wrapper's sweep sees no observe anywhere (`.modes` forgot it, `.wrapped` says clean, the settings
    file says clean): the dead allocation's rules, reservation and record are removed, although its conflist
    says observe. Every run; the control (no 0.5.0 files) observes it. (With an ADD as the upgrade's first
    call the conflist's entry notes observe again in the same ADD: held.)
    Root cause: state/modes.py network_modes: `said == LEGACY_WRAPPED and known.get(conf.name) == conf.mode`
    cannot tell 0.5.0's wrapper's word from the conflist's own in `.modes` (equal modes), and _forget_mode
    deletes it.
    Reproduce: pytest -k test_a_0_5_0_wrapped_file_upgrade_never_drops_the_conflists_observe."""
    from testkit.nomad import Client

    sb = nsb
    client = Client(sb, settings={"mode": "observe"})
    observing = sb.conflist(mode="observe")
    sd = sb.state_dir()
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, ("8161:80/tcp",), observing))
    seed, seed_ns = unique("seed-"), sb.container()
    ips_of(sb.driver("add", seed, seed_ns, (), observing))
    if legacy:  # what 0.5.0 left
        (sd / ".wrapped").write_text(json.dumps({NET: "wrapped"}))
        (sd / ".modes").write_text(json.dumps({NET: "observe"}))
    assert sb.driver("del", seed, seed_ns, (), observing).returncode == 0  # the upgrade's first call: a DEL
    modes_after_upgrade = (sd / ".modes").read_text()
    client.settings.write_text(json.dumps({"logFile": str(sb.log_file)}))  # wrapped networks: clean now
    sb.remove_container(netns)
    before = sb.residue(NET, cid, ips)
    assert before
    ips_of(sb.driver("add", unique("next-"), sb.container(), ("8162:80/tcp",), observing))
    after = sb.residue(NET, cid, ips)
    assert after == before, ("an allocation of an observe conflist was cleaned", modes_after_upgrade,
                             (sd / ".modes").read_text(), (sd / ".wrapped").read_text())


# -- 3/4. undo of an earlier life while a newer, unrecorded life of the same container maps the port -------------
@pytest.mark.parametrize("world", ["native", "iptables"])
def test_undo_puts_back_no_dnat_of_a_port_a_newer_unrecorded_life_of_the_container_maps(box, world):
    """Promise: undo never puts back something that shadows a live holder. Container C (host port 8171) dies
    with no DEL and is swept (journaled). Nomad adds C again (same ID, new namespace, same port) and that ADD
    goes unrecorded (cni-reaper's bookkeeping failed: a lock held past lockTimeout, a full disk, a later
    cni-reaper's record at the key after a rollback, whose save the store skips; here: a chain without
    cni-reaper); the new life got another address. `cni-reaper undo C` finds no record of C, the old
    addresses unheld, and no *other* container mapping 8171, and (native world) puts back portmap's
    `nft ip cni_hostport hostports` DNAT of 8171 to the dead address beside the live life's, with the dead
    life's record (undo exit 4, the rest "put back"). Today the put-back rule is appended after the live one,
    so connections still reach the live life; any re-making of the live life's rule (portmap adds with `add
    rule`) puts it behind the dead one. The iptables world held (the DN chain exists: "a newer life of the
    container has it"), but puts back the dead life's record, reservation and masquerade all the same.
    BREAK for native, every run.
    Root cause: reap/holders.py PortMap.others `m.container_id != cid`: a live mapping tagged with the same
    container ID is taken as the put-back's own, whatever life made it; reap/undo.py `_record_of` (a record
    exists) is the only guard against a newer life, and an unrecorded life passes it.
    Reproduce: pytest -k test_undo_puts_back_no_dnat_of_a_port_a_newer_unrecorded_life_of_the_container_maps."""
    sb = box
    port = 8171
    conf = sb.native_conflist() if world == "native" else sb.conflist()
    plain = sb.native_conflist(without_reaper=True) if world == "native" else sb.conflist(without_reaper=True)
    cid, old_ips = _leak(sb, f"{port}:80/tcp", conf)
    assert sb.cli("sweep", "--apply").returncode == 0
    live = sb.container()
    new_ips = ips_of(sb.driver("add", cid, live, (f"{port}:80/tcp",), plain))
    assert set(new_ips) != set(old_ips), (new_ips, old_ips)
    gw = "172.26.64.1"
    assert sb.reach(live, gw, port, "newer-life") == "newer-life"
    out = sb.cli("undo", cid)
    dead_dnat = [l for l in sb.rules_naming_port(port) if any(ip in l for ip in old_ips)]
    assert dead_dnat == [], (dead_dnat, out.returncode, out.stdout[-1500:])
