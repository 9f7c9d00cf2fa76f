"""A socket of the host's network namespace holds the host port it serves (reap/holders.listening): undo puts
no mapping back over it. The tables are read as the kernel prints them; SCTP's only once its module is loaded,
which a test may not do to this machine, hence files written here in the kernel's format (net/sctp/proc.c)."""

from __future__ import annotations

from cni_reaper.reap.holders import listening
from cni_reaper.values import HostPort

TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
EPS_HEADER = " ENDPT     SOCK   STY SST HBKT LPORT   UID INODE LADDRS\n"


def _held(proc) -> list[tuple[str, int, str]]:
    return sorted((p.proto, p.port, p.host_ip) for p in listening(str(proc)))


def test_sctp_endpoints_hold_their_port_on_their_addresses_or_on_every_address(tmp_path):
    (tmp_path / "sctp").mkdir()
    (tmp_path / "sctp" / "eps").write_text(
        EPS_HEADER
        + "ffff88017e0a0200 ffff880299f7fa00 2   10  29   8132      0 299689357 172.26.64.1 10.0.0.70 \n"
        + "ffff880612e81c00 ffff8803c28a1b00 1   10  30   8133      0 273361203 0.0.0.0 \n"
        + "ffff880612e81c01 ffff8803c28a1b01 2   7   31   8134      0 273361204 \n"
        + "ffff880612e81c02 ffff8803c28a1b02 2   10  32   8135      0 273361205 :: \n")
    assert _held(tmp_path) == [("sctp", 8132, "10.0.0.70"), ("sctp", 8132, "172.26.64.1"), ("sctp", 8133, ""),
                               ("sctp", 8134, ""), ("sctp", 8135, "")]
    assert HostPort("sctp", 8133, "").clashes(HostPort("sctp", 8133, "172.26.64.1"))


def test_listening_tcp_and_bound_udp_hold_and_no_sctp_file_is_no_endpoint(tmp_path):
    (tmp_path / "tcp").write_text(
        TCP_HEADER
        + "   0: 00000000:1FC3 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1064 1\n"
        + "   1: 014016AC:1FC4 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1065 1\n"
        + "   2: 020200C0:8548 507100CB:0050 06 00000000:00000000 03:000010C9 00000000     0        0 0 3\n")
    (tmp_path / "udp").write_text(
        TCP_HEADER + "  5: 00000000:1FC5 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 7 2\n")
    assert _held(tmp_path) == [("tcp", 8131, ""), ("tcp", 8132, "172.22.64.1"), ("udp", 8133, "")]
