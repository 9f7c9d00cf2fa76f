"""The local Nomad agent's HTTP API, reached the way the Nomad CLI reaches it (`NOMAD_ADDR`, `NOMAD_TOKEN`,
`NOMAD_CACERT`, `NOMAD_CAPATH`, `NOMAD_CLIENT_CERT`, `NOMAD_CLIENT_KEY`, `NOMAD_TLS_SERVER_NAME`,
`NOMAD_SKIP_VERIFY`; a token file, `CNI_REAPER_NOMAD_TOKEN_FILE` or `--nomad-token-file`, is preferred to a
token in the environment): a backend, behind one small interface (`Agent.get`). It never follows a redirect,
waits `TIMEOUT` seconds at most per request and reads at most `MAX_BODY` bytes; every failure is an
`Unreachable` with the reason in words. What the answers prove is scheduler.py's to judge.

Never on a CNI verb's path: Nomad calls the plugins while it holds its network lock, and must not wait on
its own API through them. The CLI's sweep (and the periodic one, which is the CLI's) asks it, before it takes
the state lock.
"""

from __future__ import annotations

import json
import os
import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_ADDRESS = "http://127.0.0.1:4646"
TIMEOUT = 2.0  # per connect, send and read
WHOLE = 5.0  # per request, however the agent drips its answer
MAX_BODY = 32 << 20
TOKEN_FILE_ENV = "CNI_REAPER_NOMAD_TOKEN_FILE"
ENABLE_ENV = "CNI_REAPER_NOMAD"


class Unreachable(Exception):
    """No answer that can be read: the agent could not be reached, TLS failed, it timed out, the body is no
    JSON or too large. Nothing is proven by it."""


class Reply:
    """An HTTP answer: status, the body as text (Nomad's errors are plain text), and the headers that matter."""

    __slots__ = ("body", "status")

    def __init__(self, status: int, body: str) -> None:
        self.status, self.body = status, body

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            raise Unreachable(f"the answer ({self.status}) is no JSON (or nested too deep)") from None


class Connection:
    """Where the agent is and how to speak to it: its address (http://, https:// or unix://), the ACL token,
    and the TLS settings of the Nomad CLI."""

    __slots__ = ("address", "ca_file", "ca_path", "client_cert", "client_key", "server_name", "skip_verify",
                 "token", "token_from")

    def __init__(self, address: str = DEFAULT_ADDRESS, token: str = "", token_from: str = "", ca_file: str = "",
                 ca_path: str = "", client_cert: str = "", client_key: str = "", server_name: str = "",
                 skip_verify: bool = False) -> None:
        self.address, self.token, self.token_from = address.rstrip("/"), token, token_from
        self.ca_file, self.ca_path, self.client_cert, self.client_key = ca_file, ca_path, client_cert, client_key
        self.server_name, self.skip_verify = server_name, skip_verify

    @classmethod
    def of_env(cls, env: Mapping[str, str], token_file: str | None = None) -> Connection:
        """The connection the Nomad CLI would use with `env`; a token file (the flag's, else
        CNI_REAPER_NOMAD_TOKEN_FILE) wins over NOMAD_TOKEN. Raises Unreachable when the token file cannot be
        read."""
        path = token_file or env.get(TOKEN_FILE_ENV, "")
        token, source = env.get("NOMAD_TOKEN", ""), "NOMAD_TOKEN" if env.get("NOMAD_TOKEN") else ""
        if path:
            try:
                token, source = read_small(path).strip(), path
            except (OSError, UnicodeDecodeError) as exc:
                why = getattr(exc, "strerror", None) or exc
                raise Unreachable(f"the token file {path} cannot be read ({why})") from None
        skip = env.get("NOMAD_SKIP_VERIFY", "").strip().lower() in ("1", "true", "yes", "t")
        return cls(env.get("NOMAD_ADDR") or DEFAULT_ADDRESS, token, source, env.get("NOMAD_CACERT", ""),
                   env.get("NOMAD_CAPATH", ""), env.get("NOMAD_CLIENT_CERT", ""), env.get("NOMAD_CLIENT_KEY", ""),
                   env.get("NOMAD_TLS_SERVER_NAME", ""), skip)

    @property
    def local(self) -> bool:
        """Whether the address is a unix socket or a loopback one (only this host can answer there)."""
        if self.address.startswith("unix://"):
            return True
        host = _host_port(self.address)[0]
        return host in ("localhost", "::1") or host.startswith("127.")


def _host_port(address: str) -> tuple[str, int]:
    rest = address.split("://", 1)[-1].split("/", 1)[0]
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = rest.partition(":")
    default = 443 if address.startswith("https://") else 80
    try:
        return host, int(port) if port else default
    except ValueError:
        raise Unreachable(f"{address} is no address (scheme://host:port or unix:///path)") from None


class Agent:
    """The one interface to the agent: GET a path, get a Reply or an Unreachable."""

    def __init__(self, conn: Connection, timeout: float = TIMEOUT) -> None:
        self.conn, self.timeout = conn, timeout

    def get(self, path: str) -> Reply:
        import http.client
        import threading

        try:
            c = self._connection()
        except (OSError, ValueError) as exc:  # the TLS files: not PEM, a key that does not match, ...
            raise Unreachable(f"{self.conn.address}: TLS cannot be set up: {_said(exc)}") from None
        late, held = threading.Event(), []  # type: threading.Event, list[Any]
        cut = threading.Timer(WHOLE, _cut, (held, late))  # a whole request in WHOLE seconds, however slow the drip
        cut.start()
        try:
            headers = {"Accept": "application/json", "User-Agent": "cni-reaper"}
            if self.conn.token:
                headers["X-Nomad-Token"] = self.conn.token
            c.connect()
            held.append(c.sock)  # the response may take the socket from the connection: cut this one
            c.request("GET", path, headers=headers)
            r = c.getresponse()
            body = r.read(MAX_BODY + 1)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            why = f"no whole answer within {WHOLE:g} s" if late.is_set() else _said(exc)
            raise Unreachable(f"{self.conn.address}{path}: {why}") from None
        finally:
            cut.cancel()
            c.close()
        if late.is_set():
            raise Unreachable(f"{self.conn.address}{path}: no whole answer within {WHOLE:g} s")
        if len(body) > MAX_BODY:
            raise Unreachable(f"{self.conn.address}{path}: the answer is larger than {MAX_BODY >> 20} MiB")
        return Reply(r.status, body.decode("utf-8", errors="replace"))

    def _connection(self) -> Any:
        import http.client

        address = self.conn.address
        if address.startswith("unix://"):
            return _UnixConnection(address[len("unix://"):], self.timeout)
        host, port = _host_port(address)
        if address.startswith("https://"):
            return http.client.HTTPSConnection(host, port, timeout=self.timeout, context=self._tls())
        if address.startswith("http://") or "://" not in address:
            return http.client.HTTPConnection(host, port, timeout=self.timeout)
        raise Unreachable(f"{address}: an address of http://, https:// or unix://")

    def _tls(self) -> Any:
        import ssl

        c = self.conn
        for name, path in (("NOMAD_CACERT", c.ca_file), ("NOMAD_CLIENT_CERT", c.client_cert),
                           ("NOMAD_CLIENT_KEY", c.client_key)):
            if path:
                _regular(name, path)
        if c.ca_path and not os.path.isdir(c.ca_path):
            raise Unreachable(f"NOMAD_CAPATH {c.ca_path} is no directory")
        ctx = ssl.create_default_context(cafile=c.ca_file or None, capath=c.ca_path or None)
        if c.client_cert:
            ctx.load_cert_chain(c.client_cert, c.client_key or None)
        if c.skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif c.server_name:
            ctx.check_hostname = False  # checked against the name given instead, below
            return _NamedContext(ctx, c.server_name)
        return ctx


class _NamedContext:
    """An SSL context that checks the certificate against NOMAD_TLS_SERVER_NAME rather than the host dialed
    (Nomad's certificates name `client.<region>.nomad`, not 127.0.0.1)."""

    def __init__(self, ctx: Any, name: str) -> None:
        self.ctx, self.name = ctx, name
        ctx.check_hostname = True

    def wrap_socket(self, sock: Any, server_hostname: str | None = None, **kw: Any) -> Any:
        return self.ctx.wrap_socket(sock, server_hostname=self.name, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ctx, name)


def _regular(name: str, path: str) -> None:
    """A TLS file is read by OpenSSL, which would wait on a FIFO: only a regular file is handed to it."""
    try:
        read_small(path, 0)
    except OSError as exc:
        raise Unreachable(f"{name} {path} cannot be read ({exc.strerror})") from None


def _cut(held: list[Any], late: Any) -> None:
    """Cut a request that took too long: its socket is shut down, so the read waiting on it returns."""
    late.set()
    for sock in held:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _UnixConnection(path: str, timeout: float) -> Any:
    import http.client

    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            try:
                s.connect(path)
            except OSError:
                s.close()
                raise
            self.sock = s

    return Conn("localhost", timeout=timeout)


def _said(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout) or "timed out" in str(exc):
        return f"no answer within {TIMEOUT:g} s"
    text = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    return str(text)


def enabled(env: Mapping[str, str], flag: bool) -> bool:
    """Whether the scheduler's word is asked: `--nomad`, or CNI_REAPER_NOMAD=1 (the periodic sweep's
    environment file)."""
    return flag or env.get(ENABLE_ENV, "").strip().lower() in ("1", "true", "yes")


def read_small(path: str, limit: int = 4096) -> str:
    """The text of a small regular file (symlinks followed), read without ever waiting on it: a FIFO, a
    device or a directory there is an OSError at once."""
    import errno
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return os.read(fd, limit).decode("utf-8")
    finally:
        os.close(fd)


def read_client_id(state_dir: str) -> str | None:
    """The node ID a Nomad client keeps in `<its state dir>/client-id` on this host (None: not readable)."""
    try:
        return read_small(os.path.join(state_dir, "client-id"), 128).strip() or None
    except (OSError, UnicodeDecodeError):
        return None
