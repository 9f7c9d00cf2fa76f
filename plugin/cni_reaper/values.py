"""Value classes without `dataclasses`: importing it (and `inspect`, `ast`, `tokenize` with it) and making
its classes cost a call that cleans ~10 ms, more than the rest of a one-attachment clean-up's Python. A value
class lists its fields in `__slots__`, writes its `__init__`, and gets from `Value` what a dataclass would
give: equality and hashing over its fields (but those in `_uncompared`), a repr, and `replace`."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    V = TypeVar("V", bound="Value")


class Value:
    __slots__: tuple[str, ...] = ()
    _uncompared: tuple[str, ...] = ()  # fields left out of equality and hashing (a dataclass's compare=False)

    def _compared(self) -> tuple[Any, ...]:
        skip = self._uncompared
        return tuple(getattr(self, n) for n in self.__slots__ if n not in skip)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._compared() == other._compared()

    def __hash__(self) -> int:
        return hash(self._compared())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"

    def replace(self: V, **changes: Any) -> V:
        """A copy with some fields changed (dataclasses.replace)."""
        new = object.__new__(type(self))
        for n in self.__slots__:
            object.__setattr__(new, n, changes.pop(n) if n in changes else getattr(self, n))
        if changes:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(changes)}")
        return new


if TYPE_CHECKING:
    _Triple = tuple[str, str, str]
else:
    _Triple = tuple


class Key(_Triple):
    """An attachment's identity as libcni names it: (network, container ID, ifname). A tuple (a dict key,
    equal to and sorted as the plain tuple), whose parts are read by name."""

    __slots__ = ()

    def __new__(cls, network: str, container_id: str, ifname: str) -> Key:
        return tuple.__new__(cls, (network, container_id, ifname))

    def __getnewargs__(self) -> tuple[str, str, str]:  # copy and pickle make it again from its parts
        return (self[0], self[1], self[2])

    @property
    def network(self) -> str:
        return self[0]

    @property
    def container_id(self) -> str:
        return self[1]

    @property
    def ifname(self) -> str:
        return self[2]

    @property
    def owner(self) -> tuple[str, str]:
        """(network, container ID): whose leftovers a rule's tag names (it does not name the interface)."""
        return (self[0], self[1])


class HostPort(Value):
    """A host port a rule maps: protocol ("" when the rule names none: every protocol), port (EVERY_PORT when
    the rule names none: a whole address's DNAT holds every port), host IP ("" for every address)."""

    __slots__ = ("host_ip", "port", "proto")

    def __init__(self, proto: str, port: int, host_ip: str = "") -> None:
        self.proto, self.port, self.host_ip = proto, port, host_ip

    def clashes(self, other: HostPort) -> bool:
        """The same port (either EVERY_PORT) of the same protocol (either naming none), whatever host IP either
        maps."""
        return ((self.port == other.port or self.port == EVERY_PORT or other.port == EVERY_PORT)
                and (self.proto == other.proto or not self.proto or not other.proto))

    def __str__(self) -> str:
        return (f"{self.port or 'every port'}/{self.proto or 'any'}"
                + (f" on {self.host_ip}" if self.host_ip else ""))


EVERY_PORT = 0  # HostPort.port of a rule that matches no port: it holds them all


class DelCall(Value):
    """What a DEL call says of its attachment (reap/teardown.py): its key, CNI_NETNS, and whether it carries port
    mappings and prevResult (the downstream plugins remove the DNAT and the firewall rules only with them)."""

    __slots__ = ("key", "netns", "ports", "prev_result")

    def __init__(self, key: Key, netns: str, ports: bool, prev_result: bool) -> None:
        self.key, self.netns, self.ports, self.prev_result = key, netns, ports, prev_result
