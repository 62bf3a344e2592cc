"""sd_notify against a real AF_UNIX datagram socket bound by the test."""
import os
import socket

import pytest

from seedance.service.notify import Notifier


def _receive(sock):
    sock.settimeout(2)
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines())


@pytest.fixture(params=["path", "abstract"])
def listener(request, tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        address = str(tmp_path / "notify.sock")
        sock.bind(address)
        env_value = address
    else:
        name = f"seedance-test-{os.getpid()}-{id(sock)}"
        sock.bind("\0" + name)
        env_value = "@" + name
    yield sock, env_value
    sock.close()


def test_ready_status_watchdog_stopping(listener):
    sock, address = listener
    notifier = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "4000000"})
    assert notifier.enabled
    assert notifier.watchdog_interval() == 2.0
    assert notifier.ready("serving 0 instances")
    message = _receive(sock)
    assert message["READY"] == "1" and message["STATUS"] == "serving 0 instances"
    assert message["MAINPID"] == str(os.getpid())
    assert notifier.status("line one\nline two")
    assert _receive(sock) == {"STATUS": "line one line two"}
    assert notifier.watchdog()
    assert _receive(sock) == {"WATCHDOG": "1"}
    assert notifier.stopping()
    assert _receive(sock)["STOPPING"] == "1"
    notifier.close()


def test_without_socket_nothing_is_sent():
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.watchdog_interval() is None


def test_gone_manager_is_not_an_error(tmp_path):
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert notifier.ready() is False


def test_watchdog_meant_for_another_pid_is_ignored():
    notifier = Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid() + 1)})
    assert notifier.watchdog_interval() is None
    assert Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_interval() == 0.5


def test_a_manager_that_does_not_read_never_blocks_the_sender(listener):
    sock, address = listener  # bound, never read: its queue fills after max_dgram_qlen
    notifier = Notifier({"NOTIFY_SOCKET": address})
    results = [notifier.status(f"line {i}") for i in range(200)]
    assert results[0] is True
    assert results.count(False) > 0 and notifier.dropped == results.count(False)
    sock.settimeout(2)
    assert sock.recv(4096) == b"STATUS=line 0"  # what was queued is intact
