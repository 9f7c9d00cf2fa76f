"""The netfilter package's own types: a parsed view of `iptables-save` output (tables, chains, rules with the
fields ownership is decided on) and the operations that delete from it.

Ownership is decided from parsed fields (chain, comment, target, source, DNAT destination), never from
positions in the text. A rule keeps its exact saved text, from which a deletion (`-D CHAIN <text>`) is built.
"""

from __future__ import annotations

from cni_reaper.values import Value


class Rule(Value):
    # slotted: a sweep of 1,000 attachments parses 11,000
    __slots__ = ("chain", "comment", "index", "source", "spec", "target", "to_destination", "tokens")

    def __init__(self, chain: str, spec: str, tokens: tuple[str, ...], source: str | None, comment: str | None,
                 target: str | None, to_destination: str | None, index: int) -> None:
        self.chain = chain
        self.spec = spec  # the saved rule after "-A CHAIN ", exactly as iptables-save printed it
        self.tokens = tokens
        self.source, self.comment, self.target, self.to_destination = source, comment, target, to_destination
        self.index = index  # position in its chain at the time of the save

    @property
    def source_ip(self) -> str | None:
        return self.source.split("/")[0] if self.source else None

    @property
    def dnat_ip(self) -> str | None:
        """The address of `--to-destination 10.0.0.2:80` or `[fd00::2]:80`."""
        dest = self.to_destination
        if not dest:
            return None
        if dest.startswith("["):
            return dest[1:].split("]")[0]
        return dest.split(":")[0] if dest.count(":") == 1 or "." in dest else dest


class Op(Value):
    """One change of a table: a deletion (a rule by its saved text, and its position when planned, or a whole
    chain) or, for undo, a put-back (a chain made anew, or a saved rule inserted at its position: a put-back
    is a plan applied through the same backend as a clean-up's)."""

    __slots__ = ("chain", "index", "kind", "owner", "part", "spec", "table", "what")

    def __init__(self, kind: str, table: str, chain: str, spec: str, owner: tuple[str, str], what: str, index: int,
                 part: str) -> None:
        self.kind = kind  # "rule" (delete one rule), "chain" (flush and delete a chain), or PUT_BACKS
        self.table, self.chain, self.spec = table, chain, spec
        self.owner = owner  # (network, container ID) whose leftover this is
        self.what = what  # for the log: what it is
        self.index = index  # for rules: position in the chain when planned (backends that delete by position check it)
        self.part = part  # which plugin's leftover (plan.PARTS: "masq", "dnat", "forward"): what the metrics count


def rule_op(table: str, rule: Rule, owner: tuple[str, str], what: str, part: str) -> Op:
    return Op("rule", table, rule.chain, rule.spec, owner, what, rule.index, part)


def chain_op(table: str, chain: str, owner: tuple[str, str], what: str, part: str) -> Op:
    return Op("chain", table, chain, "", owner, what, -1, part)


# the kinds of a put-back: "new" makes an empty chain; "insert" puts a saved rule at position `index` of its
# chain (0 the first; -1 after the last). One transaction either removes or puts back, never both.
PUT_BACKS = ("new", "insert")


def new_chain_op(table: str, chain: str, owner: tuple[str, str], what: str) -> Op:
    return Op("new", table, chain, "", owner, what, -1, "")


def insert_op(table: str, chain: str, spec: str, index: int, owner: tuple[str, str], what: str) -> Op:
    return Op("insert", table, chain, spec, owner, what, index, "")


def puts_back(ops: list[Op]) -> bool:
    """Whether `ops` put back (PUT_BACKS) rather than remove; a mix is refused (ValueError)."""
    kinds = {op.kind in PUT_BACKS for op in ops}
    if len(kinds) > 1:
        raise ValueError("one transaction either removes or puts back")
    return kinds == {True}


def by_table(ops: list[Op]) -> dict[str, list[Op]]:
    """The operations grouped by table, in their order: every backend commits one transaction per table."""
    out: dict[str, list[Op]] = {}
    for op in ops:
        out.setdefault(op.table, []).append(op)
    return out


class Table(Value):
    __slots__ = ("_by_target", "builtin", "chains", "name")
    _uncompared = ("_by_target",)

    def __init__(self, name: str, chains: dict[str, list[Rule]] | None = None, builtin: set[str] | None = None) -> None:
        self.name = name
        self.chains: dict[str, list[Rule]] = {} if chains is None else chains  # chain -> rules in order
        self.builtin: set[str] = set() if builtin is None else builtin
        self._by_target: dict[str, list[Rule]] | None = None

    def rules(self):
        for rules in self.chains.values():
            yield from rules

    def references(self, chain: str) -> list[Rule]:
        """Rules anywhere in the table that jump or go to `chain` (indexed: sweeps of thousands stay linear)."""
        if self._by_target is None:
            index: dict[str, list[Rule]] = {}
            for r in self.rules():
                if r.target:
                    index.setdefault(r.target, []).append(r)
            self._by_target = index
        return self._by_target.get(chain, [])


def split(spec: str) -> list[str]:
    """Tokens of a saved rule. iptables-save quotes only comments (and the like) with double quotes and
    escapes quotes inside them with a backslash; shlex would do, at ten times the cost on large tables.
    The plugins' rules carry quoted comments with escaped quotes in them (`"name: \\"nomad\\" id: ..."`): when
    every backslash escapes a quote, the text is cut at its other quotes (in C) instead of read a character
    at a time."""
    if '"' not in spec and "\\" not in spec:
        return [t for t in spec.split(" ") if t]
    escaped = spec.count('\\"')
    if spec.count("\\") == escaped and "\0" not in spec:
        parts = (spec.replace('\\"', "\0") if escaped else spec).split('"')
        if len(parts) % 2:  # the quotes pair up
            tokens = _split_quoted(parts)
            return [t.replace("\0", '"') for t in tokens] if escaped else tokens
    return _split_slow(spec)


def _split_quoted(parts: list[str]) -> list[str]:
    """split() of a text without backslashes, given as cut at its quotes: the odd parts were quoted."""
    tokens: list[str] = []
    open_ = False  # whether the last token goes on (no space since it began)
    for k, part in enumerate(parts):
        if k % 2:
            if open_:
                tokens[-1] += part
            else:
                tokens.append(part)
                open_ = True
            continue
        pieces = part.split(" ")
        if open_:
            tokens[-1] += pieces[0]
        elif pieces[0]:
            tokens.append(pieces[0])
            open_ = True
        if len(pieces) > 1:
            tokens += [t for t in pieces[1:-1] if t]
            open_ = bool(pieces[-1])
            if open_:
                tokens.append(pieces[-1])
    return tokens


def _split_slow(spec: str) -> list[str]:
    tokens: list[str] = []
    buf: list[str] = []
    in_token = quoted = False
    i, n = 0, len(spec)
    while i < n:
        c = spec[i]
        if c == "\\" and i + 1 < n:
            buf.append(spec[i + 1])
            in_token = True
            i += 2
            continue
        if c == '"':
            quoted = not quoted
            in_token = True
        elif c == " " and not quoted:
            if in_token:
                tokens.append("".join(buf))
                buf, in_token = [], False
        else:
            buf.append(c)
            in_token = True
        i += 1
    if in_token:
        tokens.append("".join(buf))
    return tokens


_SOURCE = ("-s", "--source")
_COMMENT = ("--comment",)
_TARGET = ("-j", "-g", "--jump", "--goto")
_TO = ("--to-destination",)


def parse_rule(chain: str, spec: str, index: int = 0) -> Rule:
    """A saved rule's fields: each the token after the last of its options that has one after it (every
    token is looked at, a value too); the source none when a "!" stands right before its option."""
    tokens = tuple(split(spec))
    head = tokens[:-1]  # an option as the last token has no value
    i = _last(head, _SOURCE)
    source = None if i < 0 or (i and head[i - 1] == "!") else tokens[i + 1]
    c, t, d = _last(head, _COMMENT), _last(head, _TARGET), _last(head, _TO)
    return Rule(chain, spec, tokens, source, tokens[c + 1] if c >= 0 else None, tokens[t + 1] if t >= 0 else None,
                tokens[d + 1] if d >= 0 else None, index)


def _last(head: tuple[str, ...], names: tuple[str, ...]) -> int:
    """The last index in `head` of one of `names` (-1: none), found in C (a saved rule has a dozen tokens, a
    sweep of 1,000 attachments reads 11,000 rules)."""
    at = -1
    for name in names:
        if name in head:
            at = max(at, len(head) - 1 - head[::-1].index(name))
    return at


def parse_save(text: str) -> dict[str, Table]:
    """Parse `iptables-save` / `ip6tables-save` output into tables. Lines end at "\n" only: a comment may hold
    any other character that str.splitlines() takes for a line's end (form feed, U+2028, ...), printed raw,
    and a rule cut there would shift the positions of every later rule of its chain."""
    tables: dict[str, Table] = {}
    current: Table | None = None
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            current = tables.setdefault(line[1:].strip(), Table(line[1:].strip()))
        elif current is None:
            continue
        elif line.startswith(":"):
            name, _, rest = line[1:].partition(" ")
            current.chains.setdefault(name, [])
            if not rest.startswith("-"):
                current.builtin.add(name)
        elif line.startswith("-A "):
            chain, _, spec = line[3:].partition(" ")
            rules = current.chains.setdefault(chain, [])
            rules.append(parse_rule(chain, spec, len(rules)))
        elif line == "COMMIT":
            current = None
    return tables
