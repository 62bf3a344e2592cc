"""Apply WorkloadQuotaPolicies to labelled workloads, burst them on low pressure, undo it all.

State lives in two places, both written atomically:
  $XDG_CONFIG_HOME/seedance/quota/NAME.yaml   the policies, as the user wrote them
  $XDG_STATE_HOME/seedance/quota/state.json   each placed workload: its policy, the cgroups
                                              we created and where it ran before, burst state
One flock serialises `quota apply/remove`, `seedance run --label` and the agent's loop.

Bursting (notes 2.4): a burstable workload is raised to its burst CPU while the chosen
pressure stays below the policy's threshold, and lowered again once it reaches it.  The
hysteresis band keeps it from flapping at the edge: after a lowering it is raised again
only when pressure falls HYSTERESIS points (at most a quarter of the threshold) below it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from ..model.errors import BadInput
from ..fix.atomic import atomic_write
from . import cgroups, psi
from .policy import Policy, parse_policy
from .workloads import find_workloads

HYSTERESIS = 5.0


def _xdg(name: str, fallback: str) -> Path:
    value = os.environ.get(name, "")
    base = Path(value) if value and os.path.isabs(value) else Path(os.path.expanduser("~")) / fallback
    return base / "seedance" / "quota"


def load_policy_text(text: str, source: str) -> Policy:
    import yaml

    from ..files import yamlio
    try:
        document = yamlio.load(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"{source}:{where} not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    return parse_policy(document, source=source)


class QuotaStore:
    def __init__(self, config_dir: Path | None = None, state_dir: Path | None = None):
        self.config_dir = Path(config_dir) if config_dir else _xdg("XDG_CONFIG_HOME", ".config")
        self.state_dir = Path(state_dir) if state_dir else _xdg("XDG_STATE_HOME", ".local/state")

    @contextlib.contextmanager
    def locked(self):
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.state_dir / "lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def policies(self) -> dict[str, Policy]:
        out = {}
        if self.config_dir.is_dir():
            for path in sorted(self.config_dir.glob("*.yaml")):
                from ..files import yamlio
                policy = load_policy_text(yamlio.read_text(path), str(path))
                out[policy.name] = policy
        return out

    def save_policy(self, policy: Policy, text: str) -> Path:
        self.config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.config_dir / f"{policy.name}.yaml"
        atomic_write(str(path), text.encode("utf-8", "surrogateescape"), mode=0o600)
        return path

    def delete_policy(self, name: str) -> bool:
        try:
            (self.config_dir / f"{name}.yaml").unlink()
            return True
        except FileNotFoundError:
            return False

    def state(self) -> dict:
        try:
            data = json.loads((self.state_dir / "state.json").read_text())
        except FileNotFoundError:
            return {"workloads": {}}
        except (ValueError, OSError) as exc:
            raise BadInput(f"{self.state_dir / 'state.json'}: damaged quota state ({exc}); "
                           "move it aside to start over") from None
        if not isinstance(data, dict) or not isinstance(data.get("workloads"), dict):
            raise BadInput(f"{self.state_dir / 'state.json'}: damaged quota state (no workloads map)")
        return data

    def save_state(self, state: dict) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(str(self.state_dir / "state.json"), (json.dumps(state, indent=1) + "\n").encode(), mode=0o600)


def _group_name(policy: Policy, workload_id: str) -> str:
    return f"seedance-{policy.name}-{workload_id}"


class QuotaController:
    """One pass (tick) places new workloads, re-checks bursts and forgets ended ones."""

    def __init__(self, store: QuotaStore, backend: cgroups.Backend | None = None, read_pressure=None,
                 proc: str = "/proc"):
        self.store = store
        self._backend = backend
        self._read_pressure = read_pressure
        self.proc = proc
        self.counters = {"placed": 0, "burst": 0, "unburst": 0, "released": 0}

    @property
    def backend(self) -> cgroups.Backend:
        if self._backend is None:
            from . import systemd
            self._backend = systemd.detect()
        return self._backend

    def _pressure(self, placement: cgroups.Placement, key: str) -> float:
        if self._read_pressure is not None:
            return psi.pressure_value(self._read_pressure, key)
        return psi.pressure_value(lambda resource: psi.read_pressure(
            self.backend.pressure_file(placement, resource)), key)

    def tick(self, only_policy: str | None = None) -> list[dict]:
        with self.store.locked():
            policies = self.store.policies()
            state = self.store.state()
            events = self._tick(policies, state, only_policy)
            self.store.save_state(state)
        return events

    def _tick(self, policies: dict, state: dict, only_policy: str | None) -> list[dict]:
        events = []
        workloads = {w.id: w for w in find_workloads(self.proc)}
        placed = state["workloads"]
        # 1. forget workloads that ended, or whose policy is gone
        for wid in list(placed):
            entry = placed[wid]
            placement = cgroups.Placement.from_dict(entry["placement"])
            if wid not in workloads or entry["policy"] not in policies:
                self.backend.remove(placement)
                del placed[wid]
                self.counters["released"] += 1
                events.append({"event": "released", "policy": entry["policy"], "workload": wid})
        # 2. place new workloads (the first matching policy by name wins: sorted, deterministic)
        for wid, workload in sorted(workloads.items()):
            entry = placed.get(wid)
            if entry is None:
                policy = next((p for _, p in sorted(policies.items())
                               if p.matches(workload.labels) and (only_policy in (None, p.name))), None)
                if policy is None:
                    continue
                placement = self.backend.place(workload.pids[0], _group_name(policy, wid))
                limits = self.backend.set_limits(placement, policy.cpu_millicores, policy.memory_bytes)
                self.backend.move(workload.pids, placement)
                entry = placed[wid] = {"policy": policy.name, "placement": placement.to_dict(),
                                       "bursting": False, "cpu_millicores": policy.cpu_millicores,
                                       "labels": workload.labels, "since": time.time()}
                self.counters["placed"] += 1
                event = {"event": "placed", "policy": policy.name, "workload": wid,
                         "pids": list(workload.pids), "limits": limits}
                if hasattr(self.backend, "enforcement"):
                    event["enforced"], event["enforcement"] = self.backend.enforcement(placement)
                events.append(event)
            else:
                # processes of the workload that were started before it was placed
                placement = cgroups.Placement.from_dict(entry["placement"])
                stray = set(workload.pids) - self.backend.members(placement)
                if stray:
                    self.backend.move(sorted(stray), placement)
            policy = policies[entry["policy"]]
            if policy.burstable:
                event = self._burst(policy, wid, entry)
                if event:
                    events.append(event)
        return events

    def _burst(self, policy: Policy, wid: str, entry: dict) -> dict | None:
        placement = cgroups.Placement.from_dict(entry["placement"])
        try:
            pressure = self._pressure(placement, policy.pressure_key)
        except (OSError, KeyError) as exc:
            return {"event": "pressure-unreadable", "policy": policy.name, "workload": wid, "reason": str(exc)}
        threshold = policy.pressure_below
        band = min(HYSTERESIS, threshold / 4)
        if not entry["bursting"] and pressure < threshold - band:
            cpu, name = policy.burst_cpu_millicores, "burst"
        elif entry["bursting"] and pressure >= threshold:
            cpu, name = policy.cpu_millicores, "unburst"
        else:
            return None
        limits = self.backend.set_limits(placement, cpu, None)
        entry["bursting"] = name == "burst"
        entry["cpu_millicores"] = cpu
        self.counters[name] += 1
        return {"event": name, "policy": policy.name, "workload": wid, "pressure_key": policy.pressure_key,
                "pressure": pressure, "threshold": threshold, "cpu_millicores": cpu, "limits": limits}

    def join(self, labels: dict) -> "Joined | None":
        """`seedance run --label`: put the calling process in the cgroup of the first policy
        (by name) selecting ``labels``; the program it then starts inherits it at fork."""
        policies = self.store.policies() if self.store.config_dir.is_dir() else {}
        policy = next((p for _, p in sorted(policies.items()) if p.matches(labels)), None)
        if policy is None:
            return None
        pid = os.getpid()
        with self.store.locked():
            placement = self.backend.place(pid, _group_name(policy, f"run{pid}"))
            self.backend.set_limits(placement, policy.cpu_millicores, policy.memory_bytes)
            self.backend.move([pid], placement)
        return Joined(self, policy, placement, labels)

    def remove(self, name: str) -> list[dict]:
        """Undo one policy: members go back to their cgroups, ours are removed, the policy file goes."""
        with self.store.locked():
            policies = self.store.policies()
            state = self.store.state()
            if name not in policies and not any(e["policy"] == name for e in state["workloads"].values()):
                raise BadInput(f"quota remove: no policy named {name!r} (see seedance quota list)")
            events = []
            for wid, entry in list(state["workloads"].items()):
                if entry["policy"] != name:
                    continue
                self.backend.remove(cgroups.Placement.from_dict(entry["placement"]))
                del state["workloads"][wid]
                events.append({"event": "released", "policy": name, "workload": wid})
            self.store.delete_policy(name)
            self.store.save_state(state)
        return events

    def listing(self) -> list[dict]:
        policies = self.store.policies()
        state = self.store.state()
        out = []
        for name, policy in sorted(policies.items()):
            members = []
            for wid, entry in sorted(state["workloads"].items()):
                if entry["policy"] != name:
                    continue
                placement = cgroups.Placement.from_dict(entry["placement"])
                try:
                    limits = self.backend.limits(placement)
                    pids = sorted(self.backend.members(placement))
                except Exception:  # a cgroup removed behind our back: show what is known
                    limits, pids = {}, []
                members.append({"workload": wid, "pids": pids, "bursting": entry["bursting"],
                                "cpu_millicores": entry["cpu_millicores"], "groups": placement.groups,
                                "limits": limits})
            out.append({**policy.to_dict(), "workloads": members})
        return out


class Joined:
    """A `seedance run --label` workload placed before its program started."""

    def __init__(self, controller: QuotaController, policy: Policy, placement: cgroups.Placement, labels: dict):
        self.controller, self.policy, self.placement, self.labels = controller, policy, placement, labels
        self.workload_id: str | None = None

    def record(self, child_pid: int) -> None:
        """Enter the program as the workload (its id is what find_workloads will compute)."""
        from .workloads import _stat

        stat = _stat(child_pid, self.controller.proc)
        if stat is None:
            return  # it has already exited
        self.workload_id = f"{child_pid}-{stat[1]}"
        store = self.controller.store
        with store.locked():
            state = store.state()
            state["workloads"][self.workload_id] = {
                "policy": self.policy.name, "placement": self.placement.to_dict(), "bursting": False,
                "cpu_millicores": self.policy.cpu_millicores, "labels": self.labels, "since": time.time()}
            store.save_state(state)

    def release(self) -> None:
        """The program ended: leave the cgroup and remove it (an agent may have done so)."""
        store = self.controller.store
        with store.locked():
            state = store.state()
            entry = state["workloads"].pop(self.workload_id, None) if self.workload_id else None
            placement = cgroups.Placement.from_dict(entry["placement"]) if entry else self.placement
            try:
                self.controller.backend.remove(placement)
            except BadInput:
                pass  # removed behind our back, or still busy: the next tick releases it
            store.save_state(state)
