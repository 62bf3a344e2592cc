"""The prediction cache: `check --imports` of the same names, in the same interpreter, over
files that have not changed, answers from the prediction it made last time.

Predicting `import torch` reads about a thousand Python sources and the symbol tables of
libtorch's libraries; the answer is a function of those files, of the directories listed on
the way, of the interpreter's start-up facts and of the loader's environment.  So the
check cache's machinery (check_cache.py, inputs.py) keys it the same way:

- every file and directory the prediction opened, listed or stat'ed, recorded as it ran,
  each stat'ed again (dev, inode, mode, size, mtime_ns, ctime_ns) before the entry is
  believed;
- the interpreter's facts, asked afresh on every run (sys.path, the modules and extension
  modules of its start-up, its dlopen flags, its marker values): a changed PYTHONPATH or a
  new .pth file is another key;
- the names, the working directory, the user, the environment a check reads, this boot,
  the kernel, glibc and seedance's own files, as for a check;
- what the interpreter's meta-path finders (an editable install's) answered for names no
  sys.path directory holds: asked again, in one start of the interpreter, on a hit.

The entry holds the prediction and its facts as a pickle that only the classes of the
process model and the facts may appear in (_Unpickler); it is read only when it is a
regular file of this user's that nobody else can write (files/private.py).  A prediction
that ran something whose reads are not recorded, or read a file changed within RACY_S of
the start, is not stored.  `--no-cache` or SEEDANCE_CACHE=0 turns it off.
"""
from __future__ import annotations

import json
import os
import pickle
import time

from . import check_cache, inputs

FORMAT = 1
MAX_BYTES = 64 << 20

# what an entry's pickle may name: the prediction's own records and plain containers
_ALLOWED = {
    ("seedance.collect.python_env", "Prediction"), ("seedance.collect.import_plan", "ImportPlan"),
    ("seedance.collect.import_plan", "ExtensionLoad"), ("seedance.collect.static_values", "_Path"),
    ("seedance.collect.static_values", "_Flags"),
    ("seedance.resolve.process", "ProcessModel"), ("seedance.resolve.process", "LoadStep"),
    ("seedance.resolve.process", "Load"), ("seedance.resolve.process", "Edge"),
    ("seedance.resolve.process", "Shadowing"), ("seedance.resolve.process", "Binding"),
    ("seedance.model.report", "Fact"),
    ("builtins", "set"), ("builtins", "frozenset"),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a prediction")
        return super().find_class(module, name)


def directory() -> str | None:
    from ..files.private import cache_home

    base = cache_home()
    return os.path.join(base, "imports") if base is not None else None


def enabled(disabled: bool = False) -> bool:
    return not disabled and os.environ.get("SEEDANCE_CACHE", "") != "0"


def key_of(interp, names) -> dict:
    uname = os.uname()
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        glibc = None
    env = {k: v for k, v in os.environ.items()
           if k.startswith(check_cache.ENV_PREFIXES) or k in check_cache.ENV_NAMES}
    facts = {"python": interp.python, "executable": interp.executable, "path": list(interp.path),
             "builtins": sorted(interp.builtins), "suffixes": list(interp.suffixes),
             "dlopenflags": interp.dlopenflags, "modules": sorted(interp.modules),
             "startup_extensions": [list(x) for x in interp.startup_extensions],
             "platform": interp.platform, "version": list(interp.version),
             "implementation": interp.implementation, "markers": interp.markers}
    return {"format": FORMAT, "names": list(names), "interpreter": facts, "cwd": os.getcwd(),
            "uid": os.geteuid(), "env": env, "boot": check_cache._boot_id(), "kernel": uname.release,
            "glibc": glibc, "code": check_cache._code_stamp()}


def _entry_path(where: str, key: dict) -> str:
    import zlib

    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return os.path.join(where, f"imports-{zlib.crc32(text.encode('utf-8', 'surrogateescape')):08x}.bin")


def _lookup(path: str, key: dict, interp):
    """(prediction, facts, inputs) from the entry at ``path`` when it answers ``key`` now,
    else None."""
    import zlib

    from ..files.private import read_private
    from .python_env import meta_path_answers

    data = read_private(path, MAX_BYTES)
    if data is None:
        return None
    line, sep, rest = data.partition(b"\n")
    try:
        header = json.loads(line.decode("utf-8", "surrogateescape")) if sep else None
        if not isinstance(header, dict) or header.get("key") != key:
            return None
        blob_len, blob_crc = header["blob"]
        payload_len, payload_crc = header["payload"]
        blob, payload = rest[:blob_len], rest[blob_len:]
        if len(blob) != blob_len or zlib.crc32(blob) != blob_crc or len(payload) != payload_len \
                or zlib.crc32(payload) != payload_crc:
            return None
        if inputs.changed(blob, header["inputs"]) is not None:
            return None
        meta = header.get("meta") or {}
        if meta and {n: _plain(v) for n, v in meta_path_answers(interp, list(meta)).items()} != meta:
            return None
        import io

        prediction, facts = _Unpickler(io.BytesIO(payload)).load()
    except (KeyError, TypeError, ValueError, pickle.UnpicklingError, EOFError, AttributeError,
            IndexError, RecursionError):
        return None
    prediction.interpreter = interp  # its environment is not kept: the one asked now
    return prediction, facts, header["inputs"]


def _plain(value):
    """A meta-path answer as JSON gives it back (tuples are lists)."""
    return json.loads(json.dumps(value))


def _store(path: str, key: dict, prediction, facts, records: dict, started_ns: int) -> str:
    import zlib

    from ..files.private import write_private

    if inputs.opaque() is not None:
        return f"not stored: the prediction ran something whose reads are not recorded ({inputs.opaque()})"
    if inputs.newest_change(records) >= started_ns - int(check_cache.RACY_S * 1e9):
        return "not stored: an input changed just before the prediction"
    interp = prediction.interpreter
    prediction.interpreter = None  # its environment is this process's, not data to keep
    try:
        payload = pickle.dumps((prediction, facts), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return "not stored: the prediction does not pickle"
    finally:
        prediction.interpreter = interp
    blob = inputs.encode(records)
    meta = prediction.plan.meta_answers if prediction.plan is not None else {}
    header = json.dumps({"key": key, "inputs": len(records), "blob": [len(blob), zlib.crc32(blob)],
                         "payload": [len(payload), zlib.crc32(payload)], "meta": _plain(meta)},
                        separators=(",", ":"))
    try:
        write_private(path, header.encode("utf-8", "surrogateescape") + b"\n" + blob + payload)
        _prune(os.path.dirname(path))
    except (OSError, ValueError):
        return "not stored: the cache directory cannot be written"
    return "stored"


def _prune(where: str) -> None:
    try:
        entries = [e for e in os.scandir(where) if e.name.startswith("imports-") and e.name.endswith(".bin")]
        if len(entries) <= check_cache.MAX_ENTRIES:
            return
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
        for entry in entries[:len(entries) - check_cache.MAX_ENTRIES]:
            os.unlink(entry.path)
    except OSError:
        pass


def predict(interp, names, compute, disabled: bool = False) -> tuple:
    """(prediction, facts, cache stats): ``compute()`` -> (prediction, facts), answered from
    the cache when every input is as it was; the stats' state is 'hit', 'stored', 'off' or
    why not stored, and its inputs how many files and directories were recorded."""
    where = directory() if enabled(disabled) else None
    if where is None:
        prediction, facts = compute()
        return prediction, facts, {"state": "off", "inputs": 0}
    key = key_of(interp, names)
    path = _entry_path(where, key)
    found = _lookup(path, key, interp)
    if found is not None:
        return found[0], found[1], {"state": "hit", "inputs": found[2]}
    started_ns = time.time_ns()
    # seedance's own cache files are not inputs (each checks itself against what it was made from)
    inputs.start(skip=(os.path.dirname(where),))
    try:
        prediction, facts = compute()
    finally:
        records = inputs.stop()
    state = _store(path, key, prediction, facts, records, started_ns)
    return prediction, facts, {"state": state, "inputs": len(records)}
