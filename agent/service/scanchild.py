"""The agent's periodic check runs here: a spawned child with an address-space cap and a deadline.

A fresh interpreter per check (spawn): the check's caches never inflate the agent's RSS,
and a crash in it cannot take the agent down.  A hostile file (a YAML alias bomb, say) can
make a check grow by gigabytes and never finish, so the child sets RLIMIT_AS on itself before the
check runs (a MemoryError becomes a failed scan, not a host swapping) and the agent kills it
once its deadline passes.  The result comes back over a pipe as ("ok", value) or
("error", one line).
"""
from __future__ import annotations

import multiprocessing
import resource
import time
from typing import Callable

SCAN_ADDRESS_SPACE = 2 << 30   # 2 GiB: a whole host check runs well within it
SCAN_TIMEOUT_S = 900.0         # a host check takes seconds; a quarter of an hour is a hang


class ScanChild:
    """One child running ``target(*args)``; poll with ready()/expired(), then result()."""

    def __init__(self, target: Callable, args: tuple = (), address_space: int = SCAN_ADDRESS_SPACE,
                 timeout: float = SCAN_TIMEOUT_S):
        ctx = multiprocessing.get_context("spawn")
        self._conn, send = ctx.Pipe(duplex=False)
        self.address_space = address_space
        self.timeout = timeout
        self.process = ctx.Process(target=_child_main, args=(send, address_space, target, tuple(args)),
                                   name="seedance-scan", daemon=True)
        self.process.start()
        send.close()  # the child holds the only writer: EOF on our side means it is gone
        self.started = time.monotonic()

    def fileno(self) -> int:
        """The result pipe's read end: readable once the result (or the child's end) is there."""
        return self._conn.fileno()

    def ready(self) -> bool:
        """A result (or the child's end) is waiting to be read."""
        return self._conn.poll()

    def expired(self) -> bool:
        return time.monotonic() - self.started > self.timeout

    def result(self):
        """The target's return value; RuntimeError with one line when it failed or died."""
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            code = self.process.exitcode
            raise RuntimeError(f"the check process died without a result (exit status {code})") from None
        finally:
            self._conn.close()
        self.process.join(timeout=5)
        if status != "ok":
            raise RuntimeError(value)
        return value

    def kill(self) -> None:
        """Stop it now (deadline passed, or the agent is stopping)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self._conn.close()


def _child_main(conn, address_space: int, target: Callable, args: tuple) -> None:
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = address_space if hard == resource.RLIM_INFINITY else min(address_space, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError):
        pass  # cannot lower it (odd container): the deadline still holds
    try:
        outcome = ("ok", target(*args))
    except MemoryError:
        outcome = ("error", f"the check needed more than {address_space >> 20} MiB of address space "
                            f"(RLIMIT_AS) and was stopped")
    except BaseException as exc:  # noqa: BLE001 - the agent gets one line, whatever it was
        outcome = ("error", " ".join(f"{type(exc).__name__}: {exc}".split()))
    try:
        conn.send(outcome)
    except MemoryError:
        conn.send(("error", "the check's report did not fit in the address-space limit"))
    finally:
        conn.close()
