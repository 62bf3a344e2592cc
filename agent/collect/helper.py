"""A forked copy of the check that runs one kind of job beside the root loop, on a second core.

In a check of site-packages with torch, the C++ ABI check of torch's extensions and test
programs (reading their c10/at/torch imports and torch's exports) is a large share of the
work, and it needs nothing the root loop computes after it but the paths of the closure.
bench/bench_check_speed.py times the check with and without the helper (SEEDANCE_JOBS=1):
without a gain there it has no place.  The
loop hands each such job to this helper and carries on; the results are put back where the
loop would have put them, so the report is the same fact for fact, in the same order.

Why a fork and not multiprocessing or threads: the job is Python (the GIL would serialise
threads), the helper needs the scan's state as it stands (resolver, torch caches), and
multiprocessing's import alone costs what a small check takes.

Nothing is lost when the helper fails: a fork that fails (EAGAIN), a helper that dies, a
job that raised there or an answer that cannot be read, and those jobs run here, inline,
as they would have without it.  SEEDANCE_JOBS=1 keeps every job inline.
"""
from __future__ import annotations

import os

# pickle and struct are imported where a helper is forked: pickle imports _compat_pickle,
# copyreg and the _pickle extension, a start-up every check would otherwise pay though most
# never fork a helper


def cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available() -> bool:
    """A second core to fork a helper onto, and SEEDANCE_JOBS not 1."""
    return os.environ.get("SEEDANCE_JOBS", "") != "1" and cores() >= 2


def wanted(jobs_expected: int, minimum: int) -> bool:
    """A helper pays for its fork (a few ms) only with enough jobs, and when available()."""
    return jobs_expected >= minimum and available()


class Helper:
    """``run(job) -> result``, in a forked child once started, inline otherwise.

    submit() returns a ticket; finish() returns {ticket: result} for every job submitted,
    each computed once: by the helper, or here when the helper could not answer for it.
    Jobs and results must pickle."""

    def __init__(self, run, warm=None):
        self._run = run
        self._warm = warm  # called in the helper first: what its jobs will all need, read ahead
        self._jobs: list = []  # every job submitted, by ticket, for an inline rerun
        self._pid = None
        self._to_helper = None  # our end of the jobs pipe (a buffered file)
        self._from_helper = None  # fd of the answer pipe
        self._inline: dict = {}  # ticket -> result computed here

    @property
    def running(self) -> bool:
        return self._pid is not None

    def start(self) -> bool:
        """Fork the helper; False (jobs then run inline) when the system refuses."""
        if self._pid is not None:
            return True
        jobs_r, jobs_w = os.pipe()
        forked = _fork(lambda: self._serve(jobs_r), child_closes=(jobs_w,))
        os.close(jobs_r)
        if forked is None:
            os.close(jobs_w)
            return False
        self._pid, self._from_helper = forked
        self._to_helper = os.fdopen(jobs_w, "wb")
        return True

    def _serve(self, jobs_fd: int) -> list:
        """In the helper: [(ticket, result)] of every job, answered at once after the last
        job is read, so neither side ever waits on a full pipe while the other does."""
        import pickle

        answers = []
        if self._warm is not None:
            try:
                self._warm()
            except Exception:  # a cache left cold: the jobs read it themselves
                pass
        with os.fdopen(jobs_fd, "rb") as jobs:
            while True:
                try:
                    # one load per dump: each dump numbers its memo from 0, and one
                    # Unpickler over them all would read a later job's references
                    # into an earlier job's objects
                    ticket, job = pickle.load(jobs)
                except EOFError:
                    return answers
                try:
                    answers.append((ticket, self._run(job)))
                except Exception:  # run here again: it raises there too, as it would have
                    continue

    def submit(self, job) -> int:
        import pickle

        ticket = len(self._jobs)
        self._jobs.append(job)
        if self._pid is None:
            self._inline[ticket] = self._run(job)
            return ticket
        try:
            pickle.dump((ticket, job), self._to_helper, protocol=pickle.HIGHEST_PROTOCOL)
            self._to_helper.flush()  # the helper works while we go on
        except (OSError, pickle.PicklingError):
            self.abandon()  # the helper is gone: this job and the rest are answered in finish()
        return ticket

    def finish(self) -> dict:
        """{ticket: result} for every job; the helper is waited for and gone after."""
        answers = self._collect() if self._pid is not None else {}
        results = {}
        for ticket, job in enumerate(self._jobs):
            if ticket in self._inline:
                results[ticket] = self._inline[ticket]
            elif ticket in answers:
                results[ticket] = answers[ticket]
            else:
                results[ticket] = self._run(job)
        return results

    def _collect(self) -> dict:
        try:
            self._to_helper.close()  # EOF: the helper answers
        except OSError:
            pass
        answers = _reap(self._pid, self._from_helper)
        self._pid = self._to_helper = self._from_helper = None
        # none (the helper died, or was cut short writing): every job runs here
        return dict(answers) if isinstance(answers, list) else {}

    def abandon(self) -> None:
        """The caller failed or was interrupted, or the helper is gone: it is killed, not
        waited for, and what it answered is dropped."""
        if self._to_helper is not None:
            try:
                self._to_helper.close()
            except OSError:
                pass
        if self._from_helper is not None:
            os.close(self._from_helper)
        if self._pid is not None:
            _kill(self._pid)
        self._pid = self._to_helper = self._from_helper = None


def share(items: list, run, minimum: int) -> list:
    """[run(item) for item in items], the items shared with a forked helper: each process
    takes the next item off one queue (a pipe of 4-byte indices: a read of 4 bytes from a
    pipe is whole), so a slow item does not hold the other process up.  The helper's
    results come back at its end; any it could not give are computed here.  Fewer than
    ``minimum`` items, one core or SEEDANCE_JOBS=1: all here, in order."""
    count = len(items)
    if count > MAX_SHARED or not wanted(count, minimum):
        return [run(item) for item in items]
    import struct

    queue_r, queue_w = os.pipe()
    os.write(queue_w, b"".join(struct.pack("=I", index) for index in range(count)))  # < one pipe's room
    os.close(queue_w)  # empty queue: EOF for both
    forked = _fork(lambda: _take(items, run, queue_r, stop_on_error=False))
    if forked is None:
        os.close(queue_r)
        return [run(item) for item in items]
    pid, answer_fd = forked
    try:
        mine = _take(items, run, queue_r, stop_on_error=True)
    except BaseException:  # an error or Ctrl-C here: the helper's pieces are not waited for
        os.close(answer_fd)
        _kill(pid)
        raise
    finally:
        os.close(queue_r)
    theirs = _reap(pid, answer_fd)
    if not isinstance(theirs, dict):
        theirs = {}  # the helper died, or was cut short writing
    return [mine[index] if index in mine else theirs[index] if index in theirs else run(items[index])
            for index in range(count)]


_WITH_INPUTS = "seedance.collect.inputs/v1"  # marks an answer that carries the helper's recorded inputs
MAX_SHARED = 8192  # indices in the queue pipe: 32 KB, within the 64 KB a pipe holds unread


def _fork(work, child_closes: tuple = ()):
    """(pid, fd to read its answer from) of a forked helper that closes ``child_closes``
    (our ends of other pipes), runs work() and writes its result, pickled, on that pipe;
    None when the system refuses the fork.  The helper ends with os._exit: no atexit, no
    flushing of our buffers; an error in it (a result that does not pickle, say) leaves
    the pipe empty."""
    answer_r, answer_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(answer_r)
        os.close(answer_w)
        return None
    if pid == 0:  # the helper: never returns
        status = 1
        try:
            import pickle

            os.close(answer_r)
            for fd in child_closes:
                os.close(fd)
            from . import inputs

            # a check being recorded for the cache (inputs.py): what this copy read goes
            # back with its answer, or the cache would not know those files
            mark = inputs.mark() if inputs.recording() else None
            result = work()
            if mark is not None:
                result = (_WITH_INPUTS, result, inputs.since(mark))
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(answer_w, "wb") as out:
                out.write(data)
            status = 0
        finally:
            os._exit(status)
    os.close(answer_w)
    return pid, answer_r


def _kill(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _take(items: list, run, queue_fd: int, stop_on_error: bool) -> dict:
    import struct

    done = {}
    while True:
        token = os.read(queue_fd, 4)
        if len(token) < 4:
            return done
        index = struct.unpack("=I", token)[0]
        try:
            done[index] = run(items[index])
        except Exception:
            if stop_on_error:
                raise  # here, as the one-process run would (after the helper is reaped)
            continue  # in the helper: left for the caller, which meets the same error


def _reap(pid: int, answer_fd: int):
    """What the helper wrote on ``answer_fd`` until it closed it, unpickled (None when it
    wrote nothing, having died first, or its answer does not unpickle, cut short); the fd
    is closed and the helper reaped."""
    import pickle

    chunks = []
    try:
        while True:
            chunk = os.read(answer_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        answer = pickle.loads(b"".join(chunks)) if chunks else None
        if isinstance(answer, tuple) and len(answer) == 3 and answer[0] == _WITH_INPUTS:
            from . import inputs

            inputs.merge(answer[2])
            answer = answer[1]
        return answer
    except Exception:
        return None
    finally:
        os.close(answer_fd)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
