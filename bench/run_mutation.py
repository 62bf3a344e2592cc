#!/usr/bin/env python3
"""Mutation testing of seedance's core: `make mutate`, bench time, not CI.

    .venv/bin/python bench/run_mutation.py                 # every module, one after another
    .venv/bin/python bench/run_mutation.py elf resolve     # some of them
    .venv/bin/python bench/run_mutation.py --report        # scores of the last runs only
    .venv/bin/python bench/run_mutation.py elf --sample 80 --seed 2026 --fresh   # a new sample of every mutant
    .venv/bin/python bench/run_mutation.py elf --retime 9  # its timeouts again with a 9x limit
    .venv/bin/python bench/run_mutation.py elf --recheck   # its survivors against the kill tests of now

Why mutmut 3 runs in a staged copy, not in the checkout:
  * mutmut 3 names a mutant after the file's path (agent/elf/reader.py -> agent.elf.reader.x_f__mutmut_1)
    but its trampoline looks the mutant up by the function's ``__module__`` at run time, which is
    ``seedance.elf.reader`` (setup.py maps the package seedance to the directory agent/ with
    package_dir).  Run on the checkout, every mutant would be "no tests" (mutmut 3.8 stops
    early saying so).  The stage copies agent/ to seedance/, so path and import name agree,
    and mutmut's own sys.path set-up (mutants/ first) makes the tests import the mutants.
  * mutmut writes mutants/ beside the sources; the checkout is shared by people editing it.
  * cosmic-ray would handle the layout but rewrites the files in place and starts a fresh
    interpreter per mutant; mutmut forks from a warmed-up process and runs only the tests
    that reached the mutated function, which is what makes this affordable on two cores.
The stage lives outside the repository ($SEEDANCE_MUTATION_DIR or ~/.cache/seedance-mutation).

Subprocesses: PYTHONPATH points at mutants/ too, so a test that runs the CLI in a child
python runs the mutant (the trampoline reads MUTANT_UNDER_TEST from the environment).

The rule conditions (rules/*.yaml, CEL) are not Python, so mutmut cannot mutate them: the
"rules" module is a small CEL mutator here (negate, && <-> ||, drop a !, == <-> !=, > <-> >=,
drop one operand of a top-level &&/||), each mutant run against the rule tests in a child.

Scores: killed / (mutants - "no tests" is NOT excused: a mutant no test reaches counts as
survived).  Timeouts count as killed (mutmut's convention: the mutant made the code loop).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = Path(sys.executable)
STAGE = Path(os.environ.get("SEEDANCE_MUTATION_DIR", Path.home() / ".cache" / "seedance-mutation"))
RESULTS = ROOT / "bench" / "mutation-results.json"

# module -> (files to mutate, relative to agent/ (globs), the fast tests that exercise them)
MODULES = {
    # test_elf_fatbin_oracle.py (cuobjdump) is left out: its nvcc builds take ~50 s, and a
    # fresh pytest session per mutant would rebuild them for every fatbin mutant
    "elf": (["elf/*"], ["tests/unit/test_elf_reader.py", "tests/unit/test_collect_fatbin.py",
                        "tests/unit/test_elf_fatbin.py", "tests/unit/test_mutation_kills_elf.py",
                        "tests/unit/test_elf_fastread.py", "tests/unit/test_resolve_hwcaps_cpu_isa_level.py",
                        "tests/unit/test_mutation_kills_elf_sample2027.py"]),
    "resolve": (["resolve/*"], ["tests/unit/test_resolve_hwcaps.py", "tests/unit/test_resolve_ldcache.py",
                                "tests/unit/test_resolve_scenarios.py", "tests/unit/test_resolve_symbols.py",
                                "tests/unit/test_collect_closure.py", "tests/unit/test_resolve_process.py",
                                "tests/unit/test_mutation_kills_resolve.py",
                                "tests/unit/test_mutation_kills_resolve_sample2027.py",
                                "tests/unit/test_mutation_kills_resolve_timeouts2027.py",
                                "tests/unit/test_resolve_ldcache_compat_hwcaps.py", "tests/unit/test_resolve_ldcache_isa_level.py",
                                "tests/unit/test_resolve_short_files.py"]),
    "journal": (["fix/journal.py"], ["tests/unit/test_fix_journal.py", "tests/integration/test_fix_crash.py",
                                     "tests/unit/test_mutation_kills_journal.py",
                                     "tests/unit/test_mutation_kills_journal_sample2027.py"]),
    "atomic": (["fix/atomic.py"], ["tests/unit/test_fix_atomic.py", "tests/unit/test_plugins_store.py",
                                   "tests/unit/test_mutation_kills_atomic.py"]),
    "collect": (["collect/*"], ["tests/unit/test_collect_closure.py", "tests/unit/test_collect_config.py",
                                "tests/unit/test_collect_cuda.py", "tests/unit/test_collect_cxxabi.py",
                                "tests/unit/test_collect_fatbin.py", "tests/unit/test_collect_host.py",
                                "tests/unit/test_collect_process.py", "tests/unit/test_collect_scan.py",
                                "tests/unit/test_collect_torch_ext.py", "tests/unit/test_mutation_kills_collect.py",
                                "tests/unit/test_mutation_kills_collect_practice.py",
                                "tests/unit/test_mutation_kills_collect_scan.py",
                                # bundle.py's only tests (8 s); without them its mutants are all "no tests".
                                "tests/integration/test_bundle.py",
                                # 3.4 s on an idle machine (84 s was measured at load 6-9, with a cold venv)
                                "tests/unit/test_collect_python_env.py",
                                "tests/unit/test_mutation_kills_collect_python.py",
                                "tests/unit/test_mutation_kills_collect_python_torch.py",
                                "tests/unit/test_mutation_kills_collect_bundle.py",
                                "tests/unit/test_mutation_kills_collect_survivors.py"]),
}
RULE_TESTS = ["tests/unit/test_judge_engine.py", "tests/unit/test_collect_config.py", "tests/unit/test_collect_process.py",
              "tests/unit/test_collect_closure.py", "tests/unit/test_collect_cuda.py",
              "tests/unit/test_service_gpu.py", "tests/unit/test_plugins_verify.py",
              "tests/unit/test_collect_fatbin.py", "tests/unit/test_collect_torch_ext.py",
              "tests/unit/test_mutation_kills_rules.py", "tests/unit/test_profile_launches.py",
              "tests/unit/test_resolve_hwcaps_cpu_isa_level.py", "tests/integration/test_check_scenarios.py"]
ORDER = ["elf", "resolve", "atomic", "journal", "collect", "rules"]
KILLED = {"killed", "timeout", "segfault", "suspicious"}


def repo_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files (what a commit would hold), plus the built shim."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    files = [f for f in out.decode("utf-8", "surrogateescape").split("\0") if f]
    if (ROOT / "shim" / "libseedance_shim.so").exists():
        files.append("shim/libseedance_shim.so")
    return files


def _carry_built_reader(where: Path) -> None:
    """The built C ELF reader (a build output, not tracked) into the stage: elf/fastread.py's
    mutants are reached only through it (tests call fastread directly; SEEDANCE_ELF_READER=python
    keeps read_elf on the Python reader, whose mutants would otherwise go unreached)."""
    for built in (ROOT / "agent" / "elf").glob("_fastelf*.so"):
        shutil.copy2(built, where / "seedance" / "elf" / built.name)


def stage(module: str) -> Path:
    """A fresh copy of the checkout with agent/ renamed seedance/ and mutmut's config."""
    where = STAGE / module
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    for rel in repo_files():
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted in the work tree but still tracked
        dest = where / ("seedance" + rel[len("agent"):] if rel.startswith("agent/") else rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
    _carry_built_reader(where)
    # the installed layout's data subpackages (setup.py package_dir)
    for name, src in (("rules_data", "rules"), ("probes", "probes"), ("shim", "shim")):
        if (where / src).is_dir():
            shutil.copytree(where / src, where / "seedance" / name, dirs_exist_ok=True)
    # tests that read checkout paths (agent/schemas/...) find them through agent -> seedance;
    # tests that run ROOT/.venv/bin/seedance get the real venv, whose python imports the
    # staged package through PYTHONPATH
    (where / "agent").symlink_to("seedance")
    if (ROOT / ".venv").is_dir():
        (where / ".venv").symlink_to(ROOT / ".venv")
    if module != "rules":
        globs, tests = MODULES[module]
        top = sorted({p.parts[0] for p in where.iterdir() for p in [p.relative_to(where)]}
                     - {"seedance", "agent", ".venv", "setup.py", "setup.cfg", "pyproject.toml"})
        lines = ["[mutmut]", "source_paths = seedance",
                 "only_mutate =\n" + "".join(f"    seedance/{g}\n" for g in globs).rstrip("\n"),
                 "also_copy =\n" + "".join(f"    {t}\n" for t in top).rstrip("\n"),
                 "pytest_add_cli_args_test_selection =\n"
                 + "".join(f"    {t}\n" for t in tests if (where / t).exists()).rstrip("\n"),
                 "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -p\n    no:randomly",
                 "use_git_change_detection = false",
                 # mutmut limits a mutant to (tests' time + constant) * multiplier * 2 seconds of CPU;
                 # under load the measured wall time already exceeds the CPU time a test needs
                 "timeout_multiplier = 1.5",
                 "timeout_constant = 5.0",
                 "debug = " + ("true" if os.environ.get("MUTMUT_DEBUG") else "false")]
        (where / "setup.cfg").write_text("\n".join(lines) + "\n")
    return where


def _mutmut_env(where: Path) -> dict:
    # mutants/ must exist before mutmut starts: a PYTHONPATH entry that does not exist yet is
    # cached by the import system as "no finder" and later inserts of the same path are ignored
    # (the tests then import the original package through the editable install: 0 hits).
    (where / "mutants").mkdir(exist_ok=True)
    # tests that run ROOT/.venv/bin/seedance get the real venv (whose python then imports
    # the mutants through PYTHONPATH)
    if not (where / "mutants" / ".venv").exists() and (ROOT / ".venv").is_dir():
        (where / "mutants" / ".venv").symlink_to(ROOT / ".venv")
    if not (where / "mutants" / "agent").exists():
        (where / "mutants" / "agent").symlink_to("seedance")
    # SEEDANCE_ELF_READER=python: the mutants are in the Python reader, the reference; the
    # C reader (seedance.elf._fastelf, tested equal to it) would otherwise answer read_elf
    # in the tests and leave most of reader.py's mutants unreached
    return {**os.environ, "PYTHONPATH": str(where / "mutants"), "PYTHONDONTWRITEBYTECODE": "1",
            "SEEDANCE_ELF_READER": "python"}


def mutmut_status(where: Path) -> dict:
    """mutant name -> mutmut's verdict ("killed", "survived", "no tests", "not checked", ...)."""
    results = subprocess.run([str(PYTHON.parent / "mutmut"), "results", "--all", "true"], cwd=where,
                             env=_mutmut_env(where), capture_output=True, text=True, errors="replace")
    status = {}
    for line in results.stdout.splitlines():
        match = re.match(r"\s*(\S+__mutmut_\d+): (.+)$", line)
        if match:
            status[match.group(1)] = match.group(2).strip()
    return status


def run_mutmut(module: str, where: Path, log, sample: int | None = None, prior: dict | None = None,
               seed: int = 17) -> dict:
    """Every mutant, or (sample) a seeded uniform sample of those a prior run did not kill.

    A sample is how the whole set fits in bench time on a small machine: the score is then
    the exact kills of the prior run plus the sample's kill rate applied to the rest."""
    env = _mutmut_env(where)
    mutmut = str(PYTHON.parent / "mutmut")
    children = os.environ.get("MUTMUT_CHILDREN", "1")
    started = time.time()
    chosen = []
    if sample:
        # generate the mutants and the per-test coverage; the name matches nothing, so it stops there
        subprocess.run([mutmut, "run", "--max-children", children, "__seedance_generate_only__"], cwd=where,
                       env=env, stdout=log, stderr=subprocess.STDOUT)
        names = sorted(mutmut_status(where))
        prior = {k: v for k, v in (prior or {}).items() if k in names}
        pool = [n for n in names if prior.get(n) not in KILLED]
        chosen = sorted(random.Random(seed).sample(pool, min(sample, len(pool))))
        # the names, for --collect --sample-names while it runs (a sample can outlast a session)
        (STAGE / f"{module}.sample").write_text("".join(n + "\n" for n in chosen))
        rc = subprocess.run([mutmut, "run", "--max-children", children, *chosen], cwd=where, env=env,
                            stdout=log, stderr=subprocess.STDOUT).returncode if chosen else 0
        status = mutmut_status(where)
        sampled = {n: status.get(n, "not checked") for n in chosen}
        result = summarise(module, sampled, rc, time.time() - started)
        carried = sum(1 for n in names if prior.get(n) in KILLED)
        rate = (result["killed"] / len(chosen)) if chosen else 1.0
        estimate = carried + rate * len(pool)
        result.update({"total": len(names), "killed_by_prior_run": carried, "pool": len(pool),
                       "sample": len(chosen), "sample_killed": result["killed"],
                       "killed": round(estimate), "score": round(100.0 * estimate / len(names), 1) if names else None,
                       "estimated": True, "seed": seed,
                       "sample_survivors": {n: v for n, v in sampled.items() if v not in KILLED}})
        return result
    rc = subprocess.run([mutmut, "run", "--max-children", children], cwd=where, env=env, stdout=log,
                        stderr=subprocess.STDOUT).returncode
    return summarise(module, mutmut_status(where), rc, time.time() - started)


def summarise(module: str, status: dict, rc: int, elapsed: float) -> dict:
    counts: dict = {}
    for value in status.values():
        counts[value] = counts.get(value, 0) + 1
    total = len(status)
    killed = sum(n for s, n in counts.items() if s in KILLED)
    survivors = sorted(name for name, s in status.items() if s not in KILLED)
    return {"module": module, "rc": rc, "seconds": round(elapsed), "total": total, "killed": killed,
            "score": round(100.0 * killed / total, 1) if total else None, "counts": counts,
            "survivors": {name: status[name] for name in survivors}, "status": status}


# -- rule conditions (CEL in YAML) -------------------------------------------------------------
CEL_SWAPS = [("&&", "||"), ("||", "&&"), ("!=", "=="), ("==", "!="), (">=", ">"), ("<=", "<"),
             (" > ", " >= "), (" < ", " <= ")]


def cel_mutants(condition: str) -> list[str]:
    out = [f"!({condition})"]
    for old, new in CEL_SWAPS:
        start = 0
        while (index := condition.find(old, start)) >= 0:
            out.append(condition[:index] + new + condition[index + len(old):])
            start = index + len(old)
    for match in re.finditer(r"!(?!=)", condition):
        out.append(condition[:match.start()] + condition[match.end():])
    for op in ("&&", "||"):
        parts = [p.strip() for p in condition.split(op)]
        if len(parts) > 1 and all(p.count("(") == p.count(")") for p in parts):
            for drop in range(len(parts)):
                out.append(f" {op} ".join(p for i, p in enumerate(parts) if i != drop))
    return list(dict.fromkeys(m for m in out if m != condition))


def run_rules(where: Path, log, sample: int | None = None, seed: int = 17) -> dict:
    tests = [t for t in RULE_TESTS if (where / t).exists()]
    env = {**os.environ, "PYTHONPATH": str(where), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [str(PYTHON), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    started = time.time()
    base = subprocess.run(cmd, cwd=where, env=env, stdout=log, stderr=subprocess.STDOUT)
    if base.returncode != 0:
        return summarise("rules", {}, base.returncode, time.time() - started) | {"error": "rule tests fail unmutated"}
    mutants = []  # (file, start, end, prefix, rule id, n, mutated condition)
    for path in sorted((where / "rules").glob("*.yaml")):
        text = path.read_text()
        for match in re.finditer(r'^(\s*condition:\s*)"(.*)"\s*$', text, re.M):
            rule = re.findall(r"^\s*-?\s*id:\s*(\S+)", text[:match.start()], re.M)
            for n, mutant in enumerate(cel_mutants(match.group(2))):
                mutants.append((path, match.start(), match.end(), match.group(1), rule[-1] if rule else "?", n, mutant))
    everything = len(mutants)
    if sample and sample < len(mutants):
        mutants = random.Random(seed).sample(mutants, sample)
    status = {}
    for path, start, end, prefix, rule_id, n, mutant in mutants:
        text = path.read_text()
        path.write_text(text[:start] + f'{prefix}"{mutant}"' + text[end:])
        shutil.copy2(path, where / "seedance" / "rules_data" / path.name)
        try:
            proc = subprocess.run(cmd, cwd=where, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=900)
            verdict = "survived" if proc.returncode == 0 else "killed"
        except subprocess.TimeoutExpired:
            verdict = "timeout"
        finally:
            path.write_text(text)
            shutil.copy2(path, where / "seedance" / "rules_data" / path.name)
        name = f"rules/{path.name}:{rule_id}:{n}: {mutant}"
        status[name] = verdict
        print(f"{verdict:9} {name}", file=log, flush=True)
    result = summarise("rules", status, 0, time.time() - started)
    if sample and len(mutants) < everything:
        result.update({"total": everything, "sample": len(mutants), "sample_killed": result["killed"], "seed": seed,
                       "killed": round(result["killed"] * everything / len(mutants)), "estimated": True})
    return result


def collect(module: str, prior: dict, sample_file: Path | None) -> dict:
    """The verdicts of a staged run as they are now (it may still be running), merged over the
    stored ones; with the names a --sample run was given, the estimate from those checked."""
    now = mutmut_status(STAGE / module)
    merged = dict(prior)
    for name, verdict in now.items():
        if verdict != "not checked" or name not in merged:
            merged[name] = verdict
    result = summarise(module, merged, 0, 0.0)
    result["partial"] = True
    if sample_file:
        chosen = [n for n in sample_file.read_text().split() if n]
        checked = [n for n in chosen if now.get(n, "not checked") != "not checked"]
        killed = sum(1 for n in checked if now[n] in KILLED)
        sampled = set(chosen)  # the stored verdicts of the sample itself are not "prior"
        carried = sum(1 for n in now if n not in sampled and prior.get(n) in KILLED)
        pool = len(now) - carried
        rate = killed / len(checked) if checked else 0.0
        estimate = carried + rate * pool
        result.update({"total": len(now), "killed_by_prior_run": carried, "pool": pool, "sample": len(chosen),
                       "sample_checked": len(checked), "sample_killed": killed, "killed": round(estimate),
                       "score": round(100.0 * estimate / len(now), 1) if now else None, "estimated": True,
                       "sample_survivors": {n: now[n] for n in checked if now[n] not in KILLED}})
    return result


def retime(module: str, stored: dict, multiplier: float, log) -> dict:
    """The stored run's timeouts run again in its stage with a larger time limit.

    mutmut counts a timeout as a kill, but on a loaded machine a mutant whose tests build
    with nvcc or gcc can pass the limit without looping; only a timeout that repeats under
    ``multiplier`` (mutmut's timeout_multiplier) stays a kill.  The sample's estimate is
    recomputed from the new verdicts."""
    where = STAGE / module
    names = sorted(n for n, v in (stored.get("status") or {}).items() if v == "timeout")
    cfg = where / "setup.cfg"
    cfg.write_text(re.sub(r"^timeout_multiplier = .*$", f"timeout_multiplier = {multiplier}", cfg.read_text(),
                          flags=re.M))
    if names:
        subprocess.run([str(PYTHON.parent / "mutmut"), "run", "--max-children", "1", *names], cwd=where,
                       env=_mutmut_env(where), stdout=log, stderr=subprocess.STDOUT)
    now = mutmut_status(where)
    retimed = {n: now.get(n, "not checked") for n in names}
    stored = dict(stored)
    stored["status"] = {**stored["status"], **retimed}
    stored["retimed"] = {"multiplier": multiplier, "verdicts": retimed}
    chosen = [n for n in (STAGE / f"{module}.sample").read_text().split() if n] \
        if (STAGE / f"{module}.sample").exists() else []
    if stored.get("estimated") and chosen:
        verdicts = {n: stored["status"].get(n, "not checked") for n in chosen}
        killed = sum(1 for v in verdicts.values() if v in KILLED)
        estimate = stored.get("killed_by_prior_run", 0) + killed / len(chosen) * stored.get("pool", len(chosen))
        stored.update({"sample_killed": killed, "killed": round(estimate),
                       "score": round(100.0 * estimate / stored["total"], 1),
                       "sample_survivors": {n: v for n, v in verdicts.items() if v not in KILLED},
                       "survivors": {n: v for n, v in verdicts.items() if v not in KILLED}})
    return stored


def recheck_rules(names: list) -> dict:
    """Each named condition mutant ("rules/<file>:<rule id>:<n>: <condition>") written into
    the rules stage in turn and run against the rule tests (RULE_TESTS, the run's selection,
    with tests/unit/test_mutation_kills_rules.py) as they are in the checkout now; the rule file
    is restored after each.  They must pass on the unmutated rules first."""
    where = stage("rules")  # a fresh copy: the rule stage keeps no state between runs
    tests = [t for t in RULE_TESTS if (where / t).exists()]
    env = {**os.environ, "PYTHONPATH": str(where), "PYTHONDONTWRITEBYTECODE": "1"}
    base = subprocess.run([str(PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "300", *tests],
                          cwd=where, env=env, capture_output=True, text=True, errors="replace")
    if base.returncode != 0:
        raise SystemExit("run_mutation: error: the rule tests fail on the unmutated rules: "
                         + " | ".join(base.stdout.strip().splitlines()[-3:]))
    verdicts = {}
    for name in names:
        head, _, mutant = name.partition(": ")
        rel, rule_id, _n = head.rsplit(":", 2)
        path = where / rel
        text = path.read_text()
        start = text.find(f"id: {rule_id}\n")
        match = re.compile(r'^(\s*condition:\s*)"(.*)"\s*$', re.M).search(text, start) if start >= 0 else None
        if match is None:
            verdicts[name] = "not applied: rule or condition not found"
            continue
        try:
            path.write_text(text[:match.start()] + f'{match.group(1)}"{mutant}"' + text[match.end():])
            shutil.copy2(path, where / "seedance" / "rules_data" / path.name)
            proc = subprocess.run([str(PYTHON), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                   "--timeout", "300", *tests], cwd=where, env=env,
                                  capture_output=True, text=True, errors="replace")
            verdicts[name] = "killed" if proc.returncode == 1 else "survived" if proc.returncode == 0 \
                else f"error (pytest exit {proc.returncode})"
        finally:
            path.write_text(text)
            shutil.copy2(path, where / "seedance" / "rules_data" / path.name)
        print(f"{verdicts[name]:9} {name}", flush=True)
    return verdicts


def recheck(module: str, names: list, only: list | None = None) -> dict:
    """Each named mutant applied to the stage's source in turn (mutmut apply) and run against
    tests/unit/test_mutation_kills_<module>*.py as they are in the checkout now: which of them the
    tests written for the survivors kill.  The stage's source is restored after each.  (collect's
    kill tests are several files, one per part of the package, so that people can write them at
    the same time.)  `only`: pytest node ids to run instead of the whole files.

    The tests first run on the unmutated stage and must pass there: the stage holds the source
    of the run, and a test written against newer source fails on it whatever the mutant, which
    would count every survivor killed."""
    where = STAGE / module
    kill_files = sorted((ROOT / "tests" / "unit").glob(f"test_mutation_kills_{module}*.py"))
    for tests in kill_files:
        shutil.copy2(tests, where / "tests" / "unit" / tests.name)
    _carry_built_reader(where)  # a stage staged before stage() carried it
    env = {**os.environ, "PYTHONPATH": str(where), "PYTHONDONTWRITEBYTECODE": "1"}
    # as in the run, read_elf answers from the Python reader, where elf's mutants live; only
    # resolve's recheck leaves the C reader on: resolver._read_elf's fallback from it is
    # reachable only so
    env.pop("SEEDANCE_ELF_READER", None)
    if module != "resolve":
        env["SEEDANCE_ELF_READER"] = "python"
    selected = only or [str(Path("tests") / "unit" / t.name) for t in kill_files]
    base = subprocess.run([str(PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "300", *selected],
                          cwd=where, env=env, capture_output=True, text=True, errors="replace")
    if base.returncode != 0:
        tail = " | ".join(base.stdout.strip().splitlines()[-3:])
        raise SystemExit(f"run_mutation: error: the kill tests fail on the unmutated {module} stage (older source "
                         f"than the tests?): {tail}; stage afresh, or name the tests that apply with --only")
    print(f"baseline: {base.stdout.strip().splitlines()[-1]} on the unmutated stage", flush=True)
    verdicts = {}
    for name in names:
        source = where / Path(*name.split(".")[:-1]).with_suffix(".py")
        saved = source.read_bytes()
        try:
            subprocess.run([str(PYTHON.parent / "mutmut"), "apply", name], cwd=where, env=_mutmut_env(where),
                           capture_output=True, check=True)
            proc = subprocess.run([str(PYTHON), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout", "120",
                                   *selected], cwd=where, env=env,
                                  capture_output=True, text=True, errors="replace")
            # a pytest killed by a signal under the mutant (the baseline passed) caught it too:
            # mutmut's "segfault" verdict, a kill
            verdicts[name] = "killed" if proc.returncode == 1 else "survived" if proc.returncode == 0 \
                else f"killed (signal {-proc.returncode})" if proc.returncode < 0 \
                else f"error (pytest exit {proc.returncode})"
        except subprocess.CalledProcessError as exc:
            verdicts[name] = f"not applied: {exc.stderr.decode(errors='replace').strip()[-200:]}"
        finally:
            source.write_bytes(saved)
        print(f"{verdicts[name]:9} {name}", flush=True)
    return verdicts


def report(results: dict) -> None:
    print(f"{'module':10} {'mutants':>8} {'killed':>7} {'score':>7} {'time':>7}  survivors  sample after --recheck")
    for module in ORDER:
        r = results.get(module)
        if not r:
            continue
        score = "-" if r["score"] is None else f"{r['score']:.1f}%"
        after = ""
        if r.get("sample") and "recheck_killed" in r and "sample_killed" in r:
            n, k = r["sample"], r["sample_killed"] + r["recheck_killed"]
            after = f"  {k}/{n} = {100.0 * k / n:.0f}% ±{100.0 / n ** 0.5:.0f} (seed {r.get('seed', 17)})"
        elif not r.get("estimated") and r.get("recheck_killed") and r.get("total"):
            k = r["killed"] + r["recheck_killed"]  # an exact run: every survivor rechecked
            after = f"  {k}/{r['total']} = {100.0 * k / r['total']:.1f}% (exact)"
        print(f"{module:10} {r['total']:8} {r['killed']:7} {score:>7} {r['seconds']:6}s  {len(r['survivors']):9}{after}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"some of {', '.join(ORDER)} (default: all)")
    parser.add_argument("--report", action="store_true", help="print the stored scores and exit")
    parser.add_argument("--sample", type=int, metavar="N",
                        help="run a seeded sample of N of the mutants the stored run did not kill "
                             "(the stored run's kills are kept; the score is then an estimate)")
    parser.add_argument("--seed", type=int, default=17,
                        help="the sample's random seed (default 17; a new seed draws a new sample)")
    parser.add_argument("--fresh", action="store_true",
                        help="with --sample: draw from every mutant, ignoring the stored verdicts (stored "
                             "kills of older code may name other mutants now); the score is the sample's rate")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the existing stage (its mutants, coverage and verdicts) instead of copying afresh")
    parser.add_argument("--sample-names", type=Path, metavar="FILE",
                        help="with --collect: the mutants (one a line) a --sample run was given, for its estimate")
    parser.add_argument("--recheck", action="store_true",
                        help="apply each stored survivor to the stage and run the module's kill tests on it")
    parser.add_argument("--only", nargs="+", metavar="NODEID",
                        help="with --recheck: run these pytest node ids (tests/unit/test_mutation_kills_*.py::name) "
                             "instead of every kill file, e.g. when a newer test needs newer source than the stage")
    parser.add_argument("--retime", type=float, metavar="X",
                        help="run the stored run's timeouts again in its stage with mutmut's timeout_multiplier X "
                             "(slow tests on a loaded machine time out without looping) and recompute the estimate")
    parser.add_argument("--collect", action="store_true",
                        help="store the verdicts of the staged run as they are now (it may still be running)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in ORDER]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}: choose from {', '.join(ORDER)}")
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if args.report:
        report(results)
        return 0
    for module in args.modules or ORDER:
        if args.recheck:
            stored = results.get(module) or {}
            names = sorted(stored.get("sample_survivors") or stored.get("survivors") or {})
            # a mutant an earlier recheck killed stays killed (the kill tests only grow): only
            # the others are run again
            previous = {n: v for n, v in (stored.get("recheck") or {}).items() if n in names}
            todo = [n for n in names if not previous.get(n, "").startswith("killed")]
            stored["recheck"] = {**previous, **(recheck_rules(todo) if module == "rules" else
                                                 recheck(module, todo, args.only))}
            stored["recheck_killed"] = sum(1 for v in stored["recheck"].values() if v.startswith("killed"))
            merged = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
            merged[module] = stored
            RESULTS.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
            results = merged
            continue
        if args.retime:
            with open(STAGE / f"{module}.log", "a") as log:
                stored = retime(module, results.get(module) or {}, args.retime, log)
            merged = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
            merged[module] = stored
            RESULTS.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
            results = merged
            report({module: stored})
            continue
        if args.collect:
            result = collect(module, (results.get(module) or {}).get("status") or {}, args.sample_names)
        else:
            prior = (results.get(module) or {}).get("status") if args.sample and not args.fresh else None
            reuse = args.reuse and (STAGE / module / "mutants").is_dir()
            where = STAGE / module if reuse else stage(module)
            with open(STAGE / f"{module}.log", "a" if reuse else "w") as log:
                print(f"== {module}: staged in {where}, log {STAGE / (module + '.log')}", flush=True)
                result = run_rules(where, log, args.sample, args.seed) if module == "rules" else \
                    run_mutmut(module, where, log, sample=args.sample, prior=prior, seed=args.seed)
            if args.sample and prior:
                merged_status = dict(prior)
                merged_status.update(result["status"])
                result["status"] = merged_status
        result["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                          text=True).stdout.strip()
        results[module] = result
        # re-read: another module may have finished in a parallel invocation meanwhile
        merged = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        old = merged.get(module) or {}
        # the figures of the run this one replaces, so an earlier sample's estimate is not lost
        result["earlier"] = {k: old[k] for k in ("commit", "score", "sample", "sample_killed", "recheck_killed",
                                                  "seed", "total", "killed_by_prior_run") if k in old}
        merged[module] = result
        RESULTS.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
        results = merged
        report({module: result})
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
