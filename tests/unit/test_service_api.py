"""The status socket, for real: mode 0600, same-uid answers, foreign uids refused."""
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from seedance.model.errors import BadInput, NotAvailable
from seedance.service.api import StatusServer, peer_credentials, request

NOBODY = 65534
CLIENT = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print(json.dumps({"connect": "EACCES"})); sys.exit(0)
try:
    s.sendall(b'{"op": "status"}\\n')
except BrokenPipeError:
    pass  # a refusal may close the connection before the request is sent; the answer is still there
print(json.dumps({"connect": "ok", "reply": s.recv(65536).decode()}))
"""


@pytest.fixture
def runtime():
    # unix socket paths are limited to 108 bytes: keep them short, not under pytest's tmp_path
    path = Path(tempfile.mkdtemp(prefix="sd-api-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(runtime):
    calls = []

    def handler(message):
        calls.append(message)
        return {"answer": message.get("op"), "echo": message}

    srv = StatusServer(runtime / "seedance" / "agent.sock", handler)
    srv.start()
    srv.calls = calls
    yield srv
    srv.stop()


def test_socket_and_directory_are_private(server):
    assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(server.path.parent.stat().st_mode) == 0o700
    assert server.path.is_socket()


def test_same_uid_gets_an_answer(server):
    reply = request(server.path, "status", extra=1)
    assert reply == {"answer": "status", "echo": {"op": "status", "extra": 1}}


def test_peer_credentials_are_the_kernel_s(server):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_credentials(a) == (os.getpid(), os.getuid(), os.getgid())


def test_bad_request_line_gets_an_error_not_a_crash(server):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(server.path))
        sock.sendall(b"[1, 2, 3]\n")
        assert "bad request" in json.loads(sock.makefile().readline())["error"]
    assert request(server.path, "ping")["answer"] == "ping"  # still serving


def test_no_agent_is_one_line_not_available(runtime):
    with pytest.raises(NotAvailable) as info:
        request(runtime / "seedance" / "agent.sock")
    assert "no agent running" in str(info.value)


def test_stale_socket_is_replaced_live_one_is_refused(runtime, server):
    with pytest.raises(BadInput, match="already running"):
        StatusServer(server.path, lambda m: {}).start()
    server.stop()
    # a socket file left by a killed agent: nobody listens on it any more
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(server.path))
    stale.close()
    again = StatusServer(server.path, lambda m: {"fresh": True})
    again.start()
    try:
        assert request(server.path)["fresh"] is True
    finally:
        again.stop()


def test_a_regular_file_in_the_way_is_not_deleted(runtime):
    path = runtime / "seedance" / "agent.sock"
    path.parent.mkdir(mode=0o700)
    path.write_text("precious")
    with pytest.raises(BadInput, match="not a socket"):
        StatusServer(path, lambda m: {}).start()
    assert path.read_text() == "precious"


def _as_nobody(path):
    proc = subprocess.run(["/usr/bin/python3", "-c", CLIENT, str(path)], user=NOBODY, group=NOBODY,
                          extra_groups=[], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another uid (nobody) needs root to switch uid")
def test_other_uid_is_refused_by_mode_and_by_peercred(runtime, server):
    os.chmod(runtime, 0o755)  # let nobody reach the socket directory's parent
    os.chmod(server.path.parent, 0o755)
    # 1. the file mode alone: 0600 keeps nobody from connecting at all
    assert _as_nobody(server.path) == {"connect": "EACCES"}
    # 2. with the mode opened by mistake, SO_PEERCRED still refuses the foreign uid
    os.chmod(server.path, 0o666)
    result = _as_nobody(server.path)
    assert result["connect"] == "ok"
    reply = json.loads(result["reply"])
    assert reply == {"error": f"refused: uid {NOBODY} is not the agent's uid {os.getuid()}"}
    assert server.refused == 1
    assert server.calls == []  # the handler never saw the foreign request
