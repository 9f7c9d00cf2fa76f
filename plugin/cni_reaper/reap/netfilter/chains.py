"""Names and tags the reference plugins (bridge ipMasq, portmap) give to one attachment's netfilter artifacts.

Chain names are deterministic: "CNI-" + prefix + sha512(network + containerID) in hex, cut to 28 characters
(libcni utils.FormatChainName / MustFormatChainNameWithPrefix). The interface name is not part of it.
"""

from __future__ import annotations

try:  # the builtin digest module: hashlib loads OpenSSL, milliseconds on every clean-up (the release's Python)
    from _sha512 import sha512
except ImportError:  # Python 3.12+ has it in _sha2; hashlib is right too, only slower to import
    from hashlib import sha512

MAX_CHAIN_LEN = 28
# Chains the plugins share between all containers: never deleted, their jumps never touched.
SHARED = frozenset({
    "CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ", "CNI-HOSTPORT-SNAT", "CNI-FORWARD",
    "CNI-ADMIN",
})


def _chain(prefix: str, network: str, container_id: str) -> str:
    digest = sha512((network + container_id).encode()).hexdigest()
    return ("CNI-" + prefix + digest)[:MAX_CHAIN_LEN]


def masq_chain(network: str, container_id: str) -> str:
    return _chain("", network, container_id)


def dnat_chain(network: str, container_id: str) -> str:
    return _chain("DN-", network, container_id)


def snat_chain(network: str, container_id: str) -> str:
    """portmap's per-container SNAT chain from before v0.7, hanging off CNI-HOSTPORT-SNAT."""
    return _chain("SN-", network, container_id)


def masq_comment(network: str, container_id: str) -> str:
    return f'name: "{network}" id: "{container_id}"'


def dnat_comment(network: str, container_id: str) -> str:
    return f'dnat name: "{network}" id: "{container_id}"'


def snat_comment(network: str, container_id: str) -> str:
    return f'snat name: "{network}" id: "{container_id}"'
