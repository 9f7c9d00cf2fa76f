"""host-local's word on an attachment known only by its tags (issue 33): dead only when, in every directory of
its network (the one host-local keeps it in among them), read whole, no reservation names its container."""

from __future__ import annotations

import os

from cni_reaper.reap.claims import Claims
from cni_reaper.reap.hostlocal import NetworkDir, reserved_elsewhere
from cni_reaper.reap.targets import Expect, Target

NET = "nomad"


def target(data_dir: str, cid: str = "gone") -> Target:
    return Target(NET, cid, "", frozenset({"10.0.0.5"}), whole=True, any_source=True,
                  expect={"10.0.0.5": Expect(data_dir, (cid, ""))}, reserved_in=data_dir)


def reserve(data_dir, ip: str, cid: str, network: str = NET) -> None:
    d = data_dir / network
    d.mkdir(parents=True, exist_ok=True)
    (d / ip).write_text(f"{cid}\r\neth0")


def doubt(t: Target, *data_dirs) -> str | None:
    dirs = [NetworkDir(str(d), NET) for d in data_dirs]
    try:
        return Claims([t], {}, dirs).unreserved_doubt(t)
    finally:
        for d in dirs:
            d.close()


def test_a_container_no_reservation_names_is_dead_on_host_locals_word(tmp_path):
    reserve(tmp_path, "10.0.0.9", "someone-else")
    assert doubt(target(str(tmp_path)), tmp_path) is None


def test_a_reservation_naming_it_anywhere_in_the_network_keeps_it(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    reserve(first, "10.0.0.9", "someone-else")
    reserve(second, "10.0.0.7", "gone")  # another directory of the network: a life of it is being made there
    assert "names it" in doubt(target(str(first)), first, second)
    assert doubt(target(str(first)), first) is None
    reserve(first, "10.0.0.8", "gone")  # a new address of it in the network's own directory
    assert "names it" in doubt(target(str(first)), first)


def test_no_directory_of_the_network_proves_nothing(tmp_path):
    (tmp_path / "other-network").mkdir()
    assert "not there" in doubt(target(str(tmp_path)), tmp_path)


def test_a_reservation_that_cannot_be_read_may_name_it(tmp_path):
    reserve(tmp_path, "10.0.0.9", "someone-else")
    os.mkfifo(tmp_path / NET / "10.0.0.6")
    assert "cannot be read" in doubt(target(str(tmp_path)), tmp_path)


def test_an_unnamed_networks_owner_is_named_only_when_no_other_network_holds_it(tmp_path):
    reserve(tmp_path, "10.0.0.9", "gone", network="elsewhere")
    assert reserved_elsewhere([str(tmp_path)], "gone", NET)
    assert not reserved_elsewhere([str(tmp_path)], "gone", "elsewhere")
    assert not reserved_elsewhere([str(tmp_path)], "nobody", NET)


def test_a_reservation_that_cannot_be_read_holds_its_address_and_the_network_for_any_dead_life(tmp_path):
    """Not only host-local's word: a reservation there that cannot be read (a FIFO, a directory named by the
    address) may be anyone's, so a recorded dead life keeps what is tied to that address, and its chains."""
    dead = Target(NET, "dead", "eth0", frozenset({"10.0.0.6", "10.0.0.7"}), whole=True,
                  expect={ip: Expect(str(tmp_path), ("dead", "eth0")) for ip in ("10.0.0.6", "10.0.0.7")})
    reserve(tmp_path, "10.0.0.7", "dead")
    d = NetworkDir(str(tmp_path), NET)
    claims = Claims([dead], {}, [d])
    assert claims.ip_free(dead, "10.0.0.6") and claims.container_free(dead)
    d.close()
    os.mkfifo(tmp_path / NET / "10.0.0.6")
    d = NetworkDir(str(tmp_path), NET)
    try:
        claims = Claims([dead], {}, [d])
        assert not claims.ip_free(dead, "10.0.0.6") and not claims.kin_free(dead, "10.0.0.6")
        assert claims.kin_free(dead, "10.0.0.7")  # its own reservation, read
        assert not claims.container_free(dead)
        assert "cannot be read" in claims.why_kept(dead, "10.0.0.6")
    finally:
        d.close()


def test_an_address_is_the_swept_networks_only_on_its_interface_alone():
    """Keeping.covers with the host's interfaces: an address of the swept subnet is taken for the swept
    network's only when the one interface that holds it is on that very subnet."""
    import ipaddress

    from cni_reaper.reap.hostlocal import Keeping
    from cni_reaper.reap.probes import OnLink

    def on(index, net, bridge=True):
        return OnLink(index, bridge, ipaddress.ip_network(net))

    k = Keeping("/var/lib/cni/networks", ["172.26.64.0/20", "fd00:a::/64"])
    swept, eth0 = on(5, "172.26.64.0/20"), on(2, "172.16.0.0/12", bridge=False)
    assert k.covers(["172.26.70.2"], [swept, eth0])  # a host network around it that is no bridge: not another's
    assert not k.covers(["172.26.70.2"], [swept, on(7, "172.26.70.0/24")])  # another network inside
    assert not k.covers(["172.26.70.2"], [swept, on(7, "172.26.64.0/20")])  # the same subnet on another bridge
    assert not k.covers(["172.26.70.2"], [swept, on(7, "172.26.0.0/16")])  # another bridge around it
    assert not k.covers(["172.26.70.2"], [])  # no interface holds it (no gateway): not known
    assert not k.covers(["172.26.70.2"], [on(7, "172.26.70.0/24")])
    assert k.covers(["172.26.64.9", "fd00:a::9"], [swept, on(5, "fd00:a::/64")])
    assert not k.covers(["fd00:a::9"], [swept])
    assert k.covers(["172.26.70.2"]) and not k.covers(["10.0.0.1"]) and not k.covers([])
