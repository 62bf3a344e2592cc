"""The status socket: a unix stream socket, mode 0600, that answers only its own uid.

Two locks on the door: the file mode keeps other users from connecting at all (the
directory is 0700 too), and SO_PEERCRED checks the uid of whoever did connect, because
file modes do not hold against root-owned sockets handed around, a chmod by mistake, or a
process that inherited a descriptor.  One request per connection: a JSON line
{"op": "status" | "reload" | "ping"}, answered by one JSON line.

Robustness: the accept loop only accepts; each connection is answered on
its own thread (at most MAX_CLIENTS at once, more are told "busy"), so one slow client
never blocks another.  Each connection has one deadline for the whole request
(REQUEST_DEADLINE_S), not a timeout per recv: a client dribbling one byte every 1.5 s is
cut off.  Everything that answers runs under a catch-all: a request that cannot be handled
(2000 '[' make json.loads raise RecursionError, which is not a ValueError) gets an error
reply, and the server thread lives on.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Callable

from ..model.errors import BadInput, NotAvailable

_PEERCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
MAX_REQUEST = 4096
REQUEST_DEADLINE_S = 3.0   # the whole request line, however it is dribbled
MAX_CLIENTS = 16           # connections answered at once; more get a "busy" reply


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return _PEERCRED.unpack(raw)


class StatusServer:
    def __init__(self, path: Path, handler: Callable[[dict], dict],
                 on_refused: Callable[[int, int], None] | None = None):
        self.path = Path(path)
        self.handler = handler
        self.on_refused = on_refused
        self.refused = 0
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)

    def start(self) -> None:
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = directory.stat()
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(directory, 0o700) if info.st_uid == os.getuid() else None
            info = directory.stat()
            if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
                raise BadInput(f"{directory}: not a private directory of uid {os.getuid()}")
        _remove_stale(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        # The umask makes bind() create the node 0600 already: no window in which another
        # user could connect before a chmod.
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        # Blocking accept, no polling timeout: an idle agent must not wake up just to look
        # (each wake-up schedules a thread and takes the GIL, CPU a busy host's own work
        # wants).  stop() wakes it.
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="seedance-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (EINVAL)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                if self.path.is_socket():
                    self.path.unlink()
            except OSError:
                pass

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError as exc:
                if self._stopping.is_set() or exc.errno in (errno.EINVAL, errno.EBADF):
                    return  # shut down by stop()
                time.sleep(0.05)  # EMFILE, ENOBUFS...: the listener is fine, try again
                continue
            if not self._slots.acquire(blocking=False):
                self._refuse_busy(conn)
                continue
            try:
                threading.Thread(target=self._connection, args=(conn,), name="seedance-status-conn",
                                 daemon=True).start()
            except BaseException:
                self._slots.release()
                conn.close()

    def _connection(self, conn: socket.socket) -> None:
        try:
            with conn:
                try:
                    self._answer(conn)
                except OSError:
                    pass  # the client went away mid-answer, or its deadline passed
                except Exception as exc:  # noqa: BLE001 - whatever it was, the server lives on
                    try:
                        _send(conn, {"error": f"internal error: {type(exc).__name__}"})
                    except Exception:  # noqa: BLE001
                        pass
        finally:
            self._slots.release()

    def _refuse_busy(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(0.2)
                _send(conn, {"error": f"busy: {MAX_CLIENTS} requests are being answered; try again"})
            except OSError:
                pass

    def _answer(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + REQUEST_DEADLINE_S
        conn.settimeout(REQUEST_DEADLINE_S)
        pid, uid, _gid = peer_credentials(conn)
        if uid != os.getuid():
            self.refused += 1
            if self.on_refused:
                self.on_refused(pid, uid)
            # Read (and ignore) what it sent: closing with unread data would turn our answer
            # into ECONNRESET on its side.
            try:
                _read_line(conn, deadline=time.monotonic() + 0.2)
            except OSError:
                pass
            _send(conn, {"error": f"refused: uid {uid} is not the agent's uid {os.getuid()}"})
            return
        try:
            request = _read_line(conn, deadline=deadline)
        except socket.timeout:
            conn.settimeout(0.5)
            _send(conn, {"error": f"request not complete within {REQUEST_DEADLINE_S:g}s"})
            return
        try:
            message = json.loads(request) if request.strip() else {"op": "status"}
            if not isinstance(message, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError):  # 2000 '[' nest past the decoder's recursion limit
            _send(conn, {"error": "bad request: expected one JSON object line"})
            return
        conn.settimeout(10.0)  # the answer: a client that stops reading is dropped
        try:
            reply = self.handler(message)
        except Exception as exc:  # the agent must outlive a bad request
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _send(conn, reply)


def request(path: Path, op: str = "status", timeout: float = 5.0, **fields) -> dict:
    """Ask the agent; NotAvailable (one line, exit 2) when no agent listens at path."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(path))
        except FileNotFoundError:
            raise NotAvailable(f"no agent running (no status socket at {path}); start one with "
                               f"`seedance agent run` or `seedance agent install --user`") from None
        except ConnectionRefusedError:
            raise NotAvailable(f"no agent running (stale status socket at {path})") from None
        except PermissionError:
            raise NotAvailable(f"{path}: permission denied (the agent belongs to another user)") from None
        try:
            _send(sock, {"op": op, **fields})
        except BrokenPipeError:
            pass  # refused before we spoke: the refusal is already waiting to be read
        line = _read_line(sock, limit=64 << 20)
    except socket.timeout:
        raise NotAvailable(f"the agent at {path} did not answer within {timeout:g}s") from None
    finally:
        sock.close()
    if not line:
        raise NotAvailable(f"the agent at {path} closed the connection without an answer")
    try:
        reply = json.loads(line)
    except ValueError:
        raise NotAvailable(f"the agent at {path} sent something that is not JSON") from None
    if isinstance(reply, dict) and "error" in reply and len(reply) == 1:
        raise NotAvailable(f"agent: {reply['error']}")
    return reply


def agent_running(path: Path, timeout: float = 1.0) -> bool:
    """Whether an agent answers on path: `seedance run` can leave reclaiming to it."""
    try:
        return bool(request(path, "ping", timeout=timeout).get("pong"))
    except NotAvailable:
        return False


def _remove_stale(path: Path) -> None:
    """Remove a socket left by a killed agent; refuse to start beside a live one."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise BadInput(f"{path}: exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            path.unlink(missing_ok=True)
            return
        raise
    finally:
        probe.close()
    raise BadInput(f"another agent is already running (it answers on {path})")


def _send(conn: socket.socket, obj: dict) -> None:
    conn.sendall(json.dumps(obj, default=str).encode() + b"\n")


def _read_line(conn: socket.socket, limit: int = MAX_REQUEST, deadline: float | None = None) -> str:
    """One line (or what came before EOF / the size limit); socket.timeout once ``deadline``
    (time.monotonic) passes, however the bytes are dribbled."""
    chunks = []
    size = 0
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed")
            conn.settimeout(left)
        data = conn.recv(65536)
        if not data:
            break
        chunks.append(data)
        size += len(data)
        if b"\n" in data or size > limit:
            break
    return b"".join(chunks).split(b"\n", 1)[0].decode("utf-8", "replace")
