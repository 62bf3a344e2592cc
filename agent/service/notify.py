"""sd_notify(3) without libsystemd: one datagram per state change on $NOTIFY_SOCKET.

The protocol is newline-separated KEY=VALUE lines in a single AF_UNIX datagram.  A socket
name starting with '@' lives in the abstract namespace (leading NUL byte), which is what
systemd uses inside containers and what `systemd-notify` accepts.  Without NOTIFY_SOCKET
(run by hand, under a Type=simple unit) every call is a no-op.
"""
from __future__ import annotations

import os
import socket
from typing import Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] = os.environ):
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self.address = address if address and (address[0] in "/\0") else ""
        self._sock: socket.socket | None = None
        self.watchdog_usec = _watchdog_usec(env)
        self.sent = 0
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings: half of WatchdogSec, as sd_watchdog_enabled(3) advises."""
        if not self.watchdog_usec:
            return None
        return self.watchdog_usec / 2 / 1_000_000

    def send(self, **fields) -> bool:
        """Send KEY=VALUE lines; False (never an exception) when systemd is not listening."""
        if not self.address:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            if self._sock is None:
                # Non-blocking: a datagram to a receiver whose queue is full (net.unix.
                # max_dgram_qlen, 10 by default) blocks a blocking sender forever, and the
                # agent's loop must never wait on its manager.  A dropped STATUS is harmless.
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                                           | socket.SOCK_NONBLOCK)
            self._sock.sendto(payload, self.address)
        except BlockingIOError:
            self.dropped += 1
            return False
        except OSError:
            # The manager went away (or this is a stale variable): the service keeps running.
            return False
        self.sent += 1
        return True

    def ready(self, status: str = "") -> bool:
        fields = {"READY": 1, "MAINPID": os.getpid()}
        if status:
            fields["STATUS"] = _one_line(status)
        return self.send(**fields)

    def status(self, text: str) -> bool:
        return self.send(STATUS=_one_line(text))

    def reloading(self) -> bool:
        return self.send(RELOADING=1, STATUS="reloading rules and config")

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def stopping(self, status: str = "stopping") -> bool:
        return self.send(STOPPING=1, STATUS=_one_line(status))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_usec(env: Mapping[str, str]) -> int:
    # WATCHDOG_PID names the process the manager expects pings from; a child that inherited
    # the environment must not ping on the parent's behalf.
    pid = env.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return 0
    try:
        return max(0, int(env.get("WATCHDOG_USEC", "0")))
    except ValueError:
        return 0


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
