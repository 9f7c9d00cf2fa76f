"""The scheduler's word: which of the allocations this host's records name Nomad proves over, asked of the
local agent (nomad.py) by the CLI's sweep, never by a CNI verb.

What proves an allocation over (README, "Evidence"), and only when the agent answering is this host's Nomad
client (its `stats.client.node_id` is the node ID that client keeps in `<its state dir>/client-id` here):
- this client's node lists it with a terminal client status (`complete`, `failed`, `lost`): an allocation ID
  is never run again once terminal, so even an old view (servers restored from a snapshot) proves that much;
- it is not in that list and `/v1/client/allocation/<id>/stats`, which the local client answers itself for
  every allocation it still has, is answered 404 "Unknown allocation": neither this client nor the servers
  know it (a list alone proves no absence: a token without a namespace's rights sees a shorter list); this
  only of an attachment whose netns path Nomad named after the allocation (another runtime's container with
  an ID of the same shape is no forgotten allocation).
A process in the namespace outweighs the word (reap/word.py): Nomad reports an allocation `failed`
while a sibling task is still within its kill timeout, and servers mark `lost` a client that still runs it.
Nothing else proves anything: an error, a timeout, a redirect (never followed), an agent that is a server only
or another host's client, a list that names another node, an allocation placed after the list was read (a
record made after the question is not judged by it). Then the word is silent and says why.
"""

from __future__ import annotations

import os
import re
import time

from cni_reaper.reap.nomad import Agent, Unreachable, read_client_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

TERMINAL = ("complete", "failed", "lost")
ALLOCATION_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
RIGHTS = "agent:read, node:read and read-job in the allocations' namespaces"


class Word:
    """What the scheduler said: the allocations it proves over (ID -> why), when the question was put (a life
    recorded after that is not judged by it), this client's node ID, and why more could not be proven."""

    __slots__ = ("absent", "asked_at", "node", "over", "problems")

    def __init__(self, asked_at: float) -> None:
        self.asked_at = asked_at
        self.node = ""
        self.over: dict[str, str] = {}
        self.absent: set[str] = set()  # of `over`, those known to nobody (not listed terminal)
        self.problems: list[str] = []

    def silent(self, why: str) -> Word:
        self.problems.append(why)
        return self

    def says_over(self, container_id: str, created_at: float, netns: str) -> str | None:
        """Why the attachment of this container, recorded at `created_at` with its netns at `netns`, is over
        (None: not proven). Known to nobody proves only an attachment that is Nomad's by its netns path
        (Nomad names it after the allocation: /var/run/netns/<allocation ID>): a container of another runtime
        with an ID shaped like an allocation's is no allocation Nomad forgot."""
        if created_at >= self.asked_at:
            return None
        if container_id in self.absent and os.path.basename(netns) != container_id:
            return None
        return self.over.get(container_id)


def allocations(container_ids: Iterable[str]) -> set[str]:
    """The container IDs that can be Nomad allocation IDs (the others are no allocation of Nomad's)."""
    return {c for c in container_ids if ALLOCATION_ID.match(c)}


def ask(agent: Agent, wanted: Iterable[str]) -> Word:
    """The scheduler's word on `wanted` (allocation IDs)."""
    word = Word(time.time())
    try:
        node = _this_client(agent, word)
        if node is None:
            return word
        word.node = node
        listed = _listed(agent, node, word)
        if listed is None:
            return word
        for alloc in sorted(allocations(wanted)):
            status = listed.get(alloc)
            if status in TERMINAL:
                word.over[alloc] = f"Nomad's client (node {node}) says allocation {alloc} is {status}"
            elif status is None:
                _unknown_to_all(agent, alloc, word)
    except Unreachable as exc:
        word.problems.append(f"Nomad's agent cannot be asked: {exc}")
    return word


def refused(reply: Any, what: str) -> str:
    """Why an answer that is no 200 proves nothing, in words."""
    body = " ".join(reply.body.split())[:200]
    if reply.status in (401, 403):
        return f"the token may not {what} ({reply.status} {body}): it needs {RIGHTS}"
    if 300 <= reply.status < 400:
        return f"the agent answered {reply.status} (a redirect, not followed) to {what}"
    return f"the agent answered {reply.status} ({body or 'no body'}) to {what}"


def _this_client(agent: Agent, word: Word) -> str | None:
    reply = agent.get("/v1/agent/self")
    if reply.status != 200:
        word.silent(refused(reply, "read the agent (/v1/agent/self)"))
        return None
    from cni_reaper.models import nomad_answer

    try:
        me = nomad_answer("agent-self", reply.json())
    except ValueError as exc:
        word.silent(f"the agent's /v1/agent/self is not as Nomad answers it ({exc})")
        return None
    node, state = me.node_id, me.state_dir
    if not node:
        word.silent(f"the agent at {agent.conn.address} is no Nomad client (a server only?): it runs no allocation")
        return None
    found = read_client_id(state) if state else None
    if found != node:
        seen = f"{state}/client-id holds {found}" if found else (f"{state}/client-id cannot be read here" if state
                                                                  else "it names no data directory")
        word.silent(f"the agent at {agent.conn.address} is not shown to be this host's client: its node is {node}, "
                    f"and {seen}")
        return None
    return node


def _listed(agent: Agent, node: str, word: Word) -> dict[str, str] | None:
    """This node's allocations as its list has them (ID -> client status); None when the list proves nothing."""
    reply = agent.get(f"/v1/node/{node}/allocations")
    if reply.status != 200:
        word.silent(refused(reply, f"list node {node}'s allocations"))
        return None
    from cni_reaper.models import nomad_answer

    try:
        listed = nomad_answer("allocations", reply.json())
    except ValueError as exc:
        word.silent(f"the list of the node's allocations is no list of allocations ({exc}): nothing in it is taken")
        return None
    out: dict[str, str] = {}
    for a in listed:
        if a.NodeID != node:
            word.silent(f"the list of node {node}'s allocations names another node's ({a.NodeID!r}): "
                        "nothing in it is taken")
            return None
        out[a.ID] = a.ClientStatus
    return out


def _unknown_to_all(agent: Agent, alloc: str, word: Word) -> None:
    reply = agent.get(f"/v1/client/allocation/{alloc}/stats")
    if reply.status == 404 and "unknown allocation" in reply.body.lower():
        word.over[alloc] = f"neither this client nor Nomad's servers know allocation {alloc} (404 Unknown allocation)"
        word.absent.add(alloc)
    elif reply.status != 200:
        word.problems.append(refused(reply, f"read allocation {alloc}"))
