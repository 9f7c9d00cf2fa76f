"""The one answer to "what mode is this target in", pure: every source in (ModeSources), clean or observe out.
Observe from any source wins; clean only when none says observe.

The sources: the state directory's word (`known`: each network's mode as its own conflist's calls last said
it, `.modes`; EVERY when that file cannot be read: every network observed), the networks a wrapper served with
the mode its calls last said (`wrapped`, `.wrapped`), the settings file of wrapped networks (its top level,
`file_top`, and its per-network modes, `file_networks`; a file that cannot be used says observe), the
conflists the CLI reads here (`conflists`: network -> its cni-reaper entry's mode), a mode forced for the whole
pass (`forced`: the CLI's, a wrapper's),
and the call that found the target (`finder`: its network's mode); two facts besides: the networks that have
records in the state directory (`recorded`), and those an attachment found with no record shows chaining no
cni-reaper (`unchained`: the conflist libcni cached with it has none: a leak from before installation, or
after cni-reaper was taken out of the conflist).

A network that chains cni-reaper in a conflist has that conflist's mode (as its calls noted it, or as the
CLI reads it). Every other network (wrapped, or one that never chained cni-reaper: leaks from before the
installation, another network's leftovers found by a port's look) is governed by the settings file's top
level, and, when it never chained cni-reaper, by the mode of the call that found it too: an operator who
configured observe only gets nothing removed anywhere. A network that has records chained cni-reaper (only
its calls make them): while no source says its mode (`.modes` lost or removed, its conflist gone from the
CLI's view) it is observed, never governed by the call that found it, until its own call says its mode again
(or the settings file names it).
"""

from __future__ import annotations

CLEAN, OBSERVE = "clean", "observe"
EVERY = "*"  # in `known`: the modes file could not be read, so every network is taken as observed


class ModeSources:
    """Every source of a pass's modes (the module's docstring); values only."""

    __slots__ = ("conflists", "file_networks", "file_top", "finder", "forced", "known", "recorded", "unchained",
                 "wrapped")

    def __init__(self, known: dict[str, str] | None = None, wrapped: dict[str, str] | None = None,
                 file_top: str | None = None, file_networks: dict[str, str] | None = None,
                 conflists: dict[str, str] | None = None, finder: str | None = None, forced: str | None = None,
                 recorded: frozenset[str] = frozenset(), unchained: frozenset[str] = frozenset()) -> None:
        self.known = dict(known or {})
        self.wrapped = dict(wrapped or {})
        self.file_top = file_top
        self.file_networks = dict(file_networks or {})
        self.conflists = dict(conflists or {})
        self.finder = finder
        self.forced = forced
        self.recorded = recorded
        self.unchained = unchained

    def with_cached(self, conflists: dict[str, str], unchained: set[str]) -> ModeSources:
        """These sources with what the conflists libcni cached with attachments found here say: networks'
        own modes (`conflists`), networks chaining no cni-reaper (`unchained`)."""
        return ModeSources(self.known, self.wrapped, self.file_top, self.file_networks,
                           {**conflists, **self.conflists}, self.finder, self.forced, self.recorded,
                           self.unchained | unchained)

    def of(self, network: str) -> str:
        return mode_of(network, self)

    def observing(self, network: str) -> bool:
        return mode_of(network, self) == OBSERVE

    def networks(self) -> set[str]:
        """The networks the sources name (EVERY left out)."""
        return ({*self.known, *self.wrapped, *self.file_networks, *self.conflists}) - {EVERY}


def chained(network: str, s: ModeSources) -> bool:
    """Whether `network` chains cni-reaper in a conflist of its own (its calls noted a mode, not as a wrapper's;
    or the CLI reads its conflist here), and no attachment found of it shows otherwise."""
    return (network in s.conflists or (network in s.known and network not in s.wrapped)) and network not in s.unchained


def strictest(*modes: str | None) -> str:
    """OBSERVE when any of `modes` says it, else CLEAN."""
    return OBSERVE if OBSERVE in modes else CLEAN


def stated(network: str, s: ModeSources) -> bool:
    """Whether a source names `network`'s own mode (its calls' word, its conflist, the settings file's entry)."""
    return network in s.known or network in s.wrapped or network in s.conflists or network in s.file_networks


def mode_of(network: str, s: ModeSources) -> str:
    """CLEAN or OBSERVE for a target of `network` (module docstring)."""
    said = [s.forced, s.known.get(EVERY), s.known.get(network), s.conflists.get(network), s.file_networks.get(network),
            s.wrapped.get(network)]
    if not chained(network, s):
        said += [s.file_top, s.finder]
    if network in s.recorded and not stated(network, s):
        said.append(OBSERVE)  # it chained cni-reaper in a mode nobody says now: not the finder's to decide
    return strictest(*said)
