"""The scheduler's word (reap/scheduler.py, reap/nomad.py) against a stand-in of the Nomad agent's HTTP API
(testkit/nomad_standin.py) on a unix socket: which answers prove an allocation over, and that every other
answer (an error, a timeout, a redirect, an empty or foreign list, a server, another host's client) proves
nothing and says why."""

from __future__ import annotations

import json
import uuid

import pytest

from cni_reaper.reap import nomad, scheduler
from testkit.nomad_standin import client_dir, serving_agent

NODE = "5d5ed6c4-7b4b-43a0-9b59-8d9b2f7a3c11"


def new_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def standin(tmp_path):
    with serving_agent(tmp_path, NODE) as a:
        yield a


def ask(agent, wanted, timeout: float = nomad.TIMEOUT, **conn) -> scheduler.Word:
    return scheduler.ask(nomad.Agent(nomad.Connection(agent.serving.address, **conn), timeout=timeout), wanted)


@pytest.mark.parametrize("status", ["complete", "failed", "lost"])
def test_a_terminal_allocation_of_this_client_is_over(standin, status):
    done, running, pending = new_id(), new_id(), new_id()
    standin.allocation(done, status)
    standin.allocation(running, "running")
    standin.allocation(pending, "pending")
    word = ask(standin, {done, running, pending})
    assert set(word.over) == {done}, word.problems
    assert status in word.over[done] and NODE in word.over[done]
    assert word.problems == [] and word.node == NODE


def test_an_allocation_neither_the_client_nor_the_servers_know_is_over_one_the_client_has_is_not(standin):
    gone, kept = new_id(), new_id()
    standin.known.add(kept)  # the client still has it, the list (a restored snapshot) does not
    word = ask(standin, {gone, kept})
    assert set(word.over) == {gone}
    assert "Unknown allocation" in word.over[gone]


def test_container_ids_that_are_no_allocation_ids_are_not_asked_about(standin):
    word = ask(standin, {"alloc-1", "a" * 64, new_id().upper()})
    assert word.over == {}
    assert not [p for p, _ in standin.seen if "/v1/client/allocation/" in p]


def test_a_life_recorded_after_the_question_is_not_judged_by_the_answer(standin):
    gone, done = new_id(), new_id()
    standin.allocation(done, "complete")
    word = ask(standin, {gone, done})
    for alloc in (gone, done):
        assert word.says_over(alloc, word.asked_at - 1, f"/var/run/netns/{alloc}") is not None
        assert word.says_over(alloc, word.asked_at, f"/var/run/netns/{alloc}") is None
        assert word.says_over(alloc, word.asked_at + 5, f"/var/run/netns/{alloc}") is None


def test_known_to_nobody_proves_only_an_attachment_nomad_named(standin):
    """A container ID shaped like an allocation's that Nomad does not know is over only when its netns path
    is the one Nomad makes for an allocation (named after it); listed terminal proves it at any path."""
    gone, done = new_id(), new_id()
    standin.allocation(done, "complete")
    word = ask(standin, {gone, done})
    assert word.says_over(gone, 0, f"/var/run/netns/{gone}") is not None
    assert word.says_over(gone, 0, "/var/run/netns/cni-1234") is None
    assert word.says_over(gone, 0, "/var/run/docker/netns/0123456789ab") is None
    assert word.says_over(done, 0, "/var/run/docker/netns/0123456789ab") is not None


@pytest.mark.parametrize("status,body,said", [
    (401, "ACL token not found", "401"),
    (403, "Permission denied", "403 Permission denied"),
    (404, "Invalid URL", "404"),
    (500, "No cluster leader", "No cluster leader"),
    (307, "", "redirect"),
])
def test_an_agent_that_does_not_answer_proves_nothing(standin, status, body, said):
    done = new_id()
    standin.allocation(done, "complete")
    standin.fail["/v1/agent/self"] = (status, body, {"Location": "http://10.1.2.3:4646/v1/agent/self"})
    word = ask(standin, {done, new_id()})
    assert word.over == {}
    assert len(word.problems) == 1 and said in word.problems[0], word.problems
    assert [p for p, _ in standin.seen] == ["/v1/agent/self"]  # nothing followed, nothing else asked


@pytest.mark.parametrize("status,body", [(403, "Permission denied"), (500, "No cluster leader"), (302, "")])
def test_a_list_that_cannot_be_read_proves_nothing(standin, status, body):
    done = new_id()
    standin.allocation(done, "complete")
    standin.fail[f"/v1/node/{NODE}/allocations"] = (status, body, {"Location": "/elsewhere"})
    word = ask(standin, {done, new_id()})
    assert word.over == {} and len(word.problems) == 1 and str(status) in word.problems[0]


def test_no_answer_in_time_proves_nothing(standin):
    standin.allocation(new_id(), "complete")
    standin.delay = 1.0
    word = ask(standin, {a["ID"] for a in standin.allocations}, timeout=0.3)
    assert word.over == {} and "no answer within" in word.problems[0], word.problems


def test_a_server_only_agent_proves_nothing(standin):
    standin.client = False
    standin.allocation(new_id(), "complete")
    word = ask(standin, {a["ID"] for a in standin.allocations})
    assert word.over == {} and "no Nomad client" in word.problems[0]


def test_another_hosts_client_proves_nothing(standin, tmp_path):
    client_dir(standin.data_dir, "0b7c2d8e-0000-4000-8000-000000000001")  # this host's client is another node
    standin.allocation(new_id(), "complete")
    word = ask(standin, {a["ID"] for a in standin.allocations})
    assert word.over == {} and "not shown to be this host's client" in word.problems[0]
    standin.data_dir = str(tmp_path / "elsewhere")  # a data dir that is not on this host
    word = ask(standin, {a["ID"] for a in standin.allocations})
    assert word.over == {} and "cannot be read here" in word.problems[0]


@pytest.mark.parametrize("body,said", [
    ('{"stats": {"client": {"node_id": 7}}}', "stats.client.node_id"),
    (json.dumps({"stats": {"client": {"node_id": NODE}}, "config": {"DataDir": ["/opt/nomad"]}}), "config.DataDir"),
])
def test_an_agent_self_not_as_nomad_answers_it_proves_nothing_and_says_where(standin, body, said):
    """The agent's answers are read by their models (models.NomadAgentSelf): a value of another type is named."""
    standin.allocation(new_id(), "complete")
    standin.fail["/v1/agent/self"] = (200, body, {})
    word = ask(standin, {a["ID"] for a in standin.allocations})
    assert word.over == {} and len(word.problems) == 1 and said in word.problems[0], word.problems


@pytest.mark.parametrize("stub", [{"NodeID": NODE, "ClientStatus": "complete"}, {"ID": 7, "NodeID": NODE,
                                                                               "ClientStatus": "complete"}])
def test_a_list_with_an_allocation_not_as_nomad_lists_it_proves_nothing(standin, stub):
    done = new_id()
    standin.allocation(done, "complete")
    listed = [{"ID": done, "NodeID": NODE, "ClientStatus": "complete", "JobID": "web"}, stub]
    standin.fail[f"/v1/node/{NODE}/allocations"] = (200, json.dumps(listed), {})
    word = ask(standin, {done})
    assert word.over == {} and "no list of allocations" in word.problems[0] and "1.ID" in word.problems[0], word.problems


def test_a_list_that_names_another_node_proves_nothing(standin):
    done = new_id()
    standin.allocation(done, "complete")
    standin.allocation(new_id(), "complete", node="0b7c2d8e-0000-4000-8000-000000000002")
    standin.confused = True
    word = ask(standin, {done})
    assert word.over == {} and "another node" in word.problems[0]


def test_with_acls_the_token_is_sent_and_a_token_without_job_rights_proves_only_unknowns(standin, tmp_path):
    secret = new_id()
    standin.tokens = {secret: {"agent", "node"}}
    running, gone = new_id(), new_id()
    standin.allocation(running, "running")
    word = ask(standin, {running, gone}, token=secret)
    assert set(word.over) == {gone}  # its list is empty (no read-job), the client still has `running`: 403
    assert any("403" in p for p in word.problems)
    assert all(t == secret for _, t in standin.seen)
    assert ask(standin, {running, gone}, token="wrong").over == {}


def test_a_token_file_is_preferred_to_nomad_token(tmp_path):
    f = tmp_path / "token"
    f.write_text("from-file\n")
    conn = nomad.Connection.of_env({"NOMAD_TOKEN": "from-env", "NOMAD_ADDR": "https://127.0.0.1:4646/"}, str(f))
    assert conn.token == "from-file" and conn.address == "https://127.0.0.1:4646" and conn.local
    conn = nomad.Connection.of_env({"NOMAD_TOKEN": "from-env", nomad.TOKEN_FILE_ENV: str(f)})
    assert conn.token == "from-file" and conn.address == nomad.DEFAULT_ADDRESS
    assert nomad.Connection.of_env({"NOMAD_TOKEN": "from-env"}).token == "from-env"
    with pytest.raises(nomad.Unreachable, match="cannot be read"):
        nomad.Connection.of_env({}, str(tmp_path / "missing"))
    assert not nomad.Connection.of_env({"NOMAD_ADDR": "http://10.0.0.5:4646"}).local


def test_an_agent_that_is_not_there_proves_nothing(tmp_path):
    word = scheduler.ask(nomad.Agent(nomad.Connection(f"unix://{tmp_path}/none.sock")), {new_id()})
    assert word.over == {} and "cannot be asked" in word.problems[0]


def test_a_token_file_or_a_client_id_that_is_a_fifo_is_refused_at_once(standin, tmp_path):
    import os
    import time

    fifo = tmp_path / "token-fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(nomad.Unreachable, match="not a regular file"):
        nomad.Connection.of_env({}, str(fifo))
    ids = os.path.join(standin.data_dir, "client", "client-id")
    os.unlink(ids)
    os.mkfifo(ids)
    standin.allocation(new_id(), "complete")
    word = ask(standin, {a["ID"] for a in standin.allocations})
    assert word.over == {} and "cannot be read here" in word.problems[0]
    assert time.monotonic() - started < 5


def test_an_answer_nested_too_deep_or_dripped_too_slowly_proves_nothing(standin, monkeypatch):
    import time

    standin.allocation(new_id(), "complete")
    standin.fail["/v1/agent/self"] = (200, "[" * 200000, {})
    word = ask(standin, {a["ID"] for a in standin.allocations})
    assert word.over == {} and "no JSON" in word.problems[0], word.problems
    del standin.fail["/v1/agent/self"]
    monkeypatch.setattr(nomad, "WHOLE", 1.0)
    standin.drip = 0.3  # a byte every 0.3 s: each read in time, the whole answer never
    started = time.monotonic()
    word = ask(standin, {a["ID"] for a in standin.allocations})
    assert word.over == {} and "no whole answer within 1 s" in word.problems[0], word.problems
    assert time.monotonic() - started < 3


def test_tls_files_that_are_no_regular_files_are_refused_at_once(tmp_path):
    import os
    import time

    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    for env in ({"NOMAD_CACERT": str(fifo)}, {"NOMAD_CLIENT_CERT": str(fifo)}, {"NOMAD_CAPATH": str(fifo)},
                {"NOMAD_CACERT": str(tmp_path)}):
        conn = nomad.Connection.of_env({"NOMAD_ADDR": "https://127.0.0.1:9", **env})
        word = scheduler.ask(nomad.Agent(conn), {new_id()})
        assert word.over == {} and len(word.problems) == 1 and "cannot be asked" in word.problems[0], (env, word.problems)
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    word = scheduler.ask(nomad.Agent(nomad.Connection.of_env({"NOMAD_ADDR": "https://127.0.0.1:9",
                                                               "NOMAD_CACERT": str(bad)})), {new_id()})
    assert "TLS cannot be set up" in word.problems[0], word.problems
    assert time.monotonic() - started < 5
