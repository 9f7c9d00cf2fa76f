"""A stand-in of a Nomad agent's HTTP API (Nomad cannot be installed here: its licence since 1.7), serving the
shapes the Nomad `api` package and documentation have (REFERENCE.md, round 4):

- `GET /v1/agent/self`: `{"config": {"DataDir", "Client": {"StateDir"}}, "member": {...}, "stats": {"client":
  {"node_id"}}}` (no `client` in `stats` on a server-only agent); needs `agent:read`;
- `GET /v1/node/<node>/allocations`: a list of allocations (`ID`, `NodeID`, `ClientStatus`, `DesiredStatus`,
  `Namespace`, `JobID`); needs `node:read` (a token without a namespace's read-job sees those allocations
  left out);
- `GET /v1/client/allocation/<id>/stats`: 200 with the allocation's stats for one this client has, else 404
  "Unknown allocation" (what the servers answer when they do not know it either);
- errors as plain text bodies: 403 "Permission denied", 404, 500 "No cluster leader".

`fail` makes a path answer with a status, a body and headers of one's choosing; `delay` stalls every answer.
Serves on a unix socket (NOMAD_ADDR=unix://...) or on TCP, with TLS and a client certificate check when given.
"""

from __future__ import annotations

import contextlib
import json
import os
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any


class Agent:
    """What the stand-in says: its node, data dir, allocations, the tokens it accepts and their rights."""

    def __init__(self, node_id: str, data_dir: str, allocations: list[dict] | None = None,
                 client: bool = True, tokens: dict[str, set[str]] | None = None) -> None:
        self.node_id, self.data_dir, self.client = node_id, data_dir, client
        self.allocations: list[dict] = allocations or []
        self.known: set[str] = set()  # allocations this client still has (stats answered 200)
        self.tokens = tokens  # None: ACLs off; else token -> rights ("agent", "node", "job")
        self.fail: dict[str, tuple[int, str, dict[str, str]]] = {}
        self.delay = 0.0
        self.confused = False  # a node's list answered with every node's allocations (a broken proxy)
        self.drip = 0.0  # seconds between the bytes of every answer's body (0: all at once)
        self.seen: list[tuple[str, str]] = []  # (path, token) of every request
        self.serving: Serving | None = None

    def allocation(self, alloc_id: str, status: str, node: str | None = None, namespace: str = "default") -> dict:
        a = {"ID": alloc_id, "NodeID": node or self.node_id, "ClientStatus": status,
             "DesiredStatus": "run" if status in ("pending", "running") else "stop", "Namespace": namespace,
             "JobID": "job", "TaskGroup": "g", "Name": "job.g[0]", "CreateIndex": 10, "ModifyIndex": 12}
        self.allocations.append(a)
        if status in ("pending", "running"):
            self.known.add(alloc_id)
        return a

    def answer(self, path: str, token: str) -> tuple[int, str, dict[str, str]]:
        self.seen.append((path, token))
        if self.delay:
            time.sleep(self.delay)
        if path in self.fail:
            return self.fail[path]
        rights = None if self.tokens is None else self.tokens.get(token)
        if self.tokens is not None and rights is None:
            return 403, "Permission denied", {}
        if path == "/v1/agent/self":
            return self._self(rights)
        if path.startswith("/v1/node/") and path.endswith("/allocations"):
            return self._listed(path.split("/")[3], rights)
        if path.startswith("/v1/client/allocation/") and path.endswith("/stats"):
            return self._stats(path.split("/")[4], rights)
        return 404, "Invalid URL", {}

    def _self(self, rights: set[str] | None) -> tuple[int, str, dict[str, str]]:
        if rights is not None and "agent" not in rights:
            return 403, "Permission denied", {}
        stats = {"client": {"node_id": self.node_id, "known_servers": "10.0.0.1:4647"}} if self.client else {}
        return 200, json.dumps({"config": {"DataDir": self.data_dir, "Client": {"Enabled": self.client, "StateDir": ""}},
                                "member": {"Name": "client-1"}, "stats": stats}), {}

    def _listed(self, node: str, rights: set[str] | None) -> tuple[int, str, dict[str, str]]:
        if rights is not None and "node" not in rights:
            return 403, "Permission denied", {}
        listed = [a for a in self.allocations if a["NodeID"] == node or self.confused]
        if rights is not None and "job" not in rights:
            listed = []
        return 200, json.dumps(listed), {"X-Nomad-Index": "12", "X-Nomad-KnownLeader": "true"}

    def _stats(self, alloc: str, rights: set[str] | None) -> tuple[int, str, dict[str, str]]:
        if alloc in self.known and rights is not None and "job" not in rights:
            return 403, "Permission denied", {}
        if alloc in self.known:
            return 200, json.dumps({"ResourceUsage": {}, "Tasks": {}, "Timestamp": 1}), {}
        return 404, f'Unknown allocation "{alloc}"', {}


def _handler(agent: Agent):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            status, body, headers = agent.answer(self.path, self.headers.get("X-Nomad-Token", ""))
            data = body.encode()
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
            self.end_headers()
            try:
                if not agent.drip:
                    self.wfile.write(data)
                    return
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(agent.drip)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client cut it: what a client that stops waiting does

        def address_string(self) -> str:
            return "local"

        def log_message(self, *args) -> None:
            pass

    return Handler


class _Unix(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False  # a handler still dripping its answer is not waited for


class _Tcp(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class Serving:
    """The stand-in serving `agent` in a thread, on a unix socket at `path` or on TCP at `port` (with TLS when
    `cert` and `key` are given; client certificates signed by `client_ca` required when given)."""

    def __init__(self, agent: Agent, path: str | None = None, port: int = 0, cert: str = "", key: str = "",
                 client_ca: str = "") -> None:
        handler = _handler(agent)
        if path is not None:
            if os.path.exists(path):
                os.unlink(path)
            self.server: socketserver.BaseServer = _Unix(path, handler)
            self.address = f"unix://{path}"
        else:
            self.server = _Tcp(("127.0.0.1", port), handler)
            scheme = "http"
            if cert:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                ctx.load_cert_chain(cert, key)
                if client_ca:
                    ctx.verify_mode = ssl.CERT_REQUIRED
                    ctx.load_verify_locations(client_ca)
                self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
                scheme = "https"
            self.address = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Serving:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def client_dir(data_dir: str, node_id: str) -> None:
    """A Nomad client's data directory as it keeps its node ID: `<data_dir>/client/client-id`."""
    os.makedirs(os.path.join(data_dir, "client"), exist_ok=True)
    with open(os.path.join(data_dir, "client", "client-id"), "w") as f:
        f.write(node_id)


@contextlib.contextmanager
def serving_agent(tmp_path: Any, node_id: str) -> Iterator[Agent]:
    """A client agent of node `node_id` (its data directory, with its client-id, under `tmp_path`) served on
    a unix socket there; its `serving.address` is the NOMAD_ADDR to give."""
    data = str(tmp_path / "nomad-data")
    client_dir(data, node_id)
    agent = Agent(node_id, data)
    with Serving(agent, path=str(tmp_path / "nomad.sock")) as serving:
        agent.serving = serving
        yield agent
