"""collect/prediction_cache.py: an entry is believed only when every input is as it was,
and its pickle may name the prediction's own records and nothing else."""
from __future__ import annotations

import json
import os
import pickle
import sys
import zlib

from seedance.collect import inputs, prediction_cache, python_env


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("true",))


def _entry(path, key, payload: bytes, records: dict) -> None:
    blob = inputs.encode(records)
    header = {"key": key, "inputs": len(records), "blob": [len(blob), zlib.crc32(blob)],
              "payload": [len(payload), zlib.crc32(payload)], "meta": {}}
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(json.dumps(header).encode() + b"\n" + blob + payload)
    os.chmod(path, 0o600)


def test_an_entry_naming_other_code_or_a_changed_input_is_not_believed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SEEDANCE_CACHE", raising=False)
    interp = python_env.ask_interpreter(sys.executable)
    key = prediction_cache.key_of(interp, ["json"])
    path = prediction_cache._entry_path(prediction_cache.directory(), key)
    watched = tmp_path / "input.py"
    watched.write_text("x = 1\n")
    records = {(str(watched), True): inputs.identity(os.stat(watched))}
    computed = []

    def compute():
        computed.append(1)
        return python_env.Prediction(("fresh",), None, python_env.ImportPlan(names=("json",)), interp, True, None), []

    _entry(path, key, pickle.dumps((_RunsCode(), [])), records)
    assert prediction_cache.predict(interp, ["json"], compute)[0].names == ("fresh",)  # refused, computed again
    assert computed == [1]

    plan = python_env.ImportPlan(names=("json",))
    good = python_env.Prediction(("json",), None, plan, None, True, None)
    _entry(path, key, pickle.dumps((good, [])), records)
    found, _facts, stats = prediction_cache.predict(interp, ["json"], compute)
    assert stats["state"] == "hit" and found.plan.names == ("json",) and found.interpreter is interp
    watched.write_text("x = 22\n")  # a recorded input changed: computed again
    assert prediction_cache.predict(interp, ["json"], compute)[0].names == ("fresh",) and computed == [1, 1]
