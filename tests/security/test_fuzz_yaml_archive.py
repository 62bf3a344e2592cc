"""Fuzz runs of the bounded YAML loader and the plugin extractor (issue 10, "a fuzz run").

Hypothesis feeds each one thousands of inputs: random YAML-ish text, alias graphs, deep
nesting, and random archives (names with '..', '/', links, chains, hard links, devices,
odd modes) plus byte-flipped ones.  For every input the test counts:
  hangs      an input that took longer than PER_INPUT_S (SIGALRM),
  tracebacks anything raised that is not the one-line BadInput (or, for the loader alone,
             the library's own YAMLError that every caller words as one line),
  outside    files that appeared anywhere but the extraction root.
All three must stay 0.  `pytest -s` prints the counts (the figures issue 10 asks for).
"""
from __future__ import annotations

import io
import os
import signal
import stat
import tarfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError as RuamelError

from seedance.files import yamlio
from seedance.model.errors import BadInput, SeedanceError
from seedance.plugins import archive

PER_INPUT_S = 30  # ruamel's scanner alone may take ~3 s on a shared CPU for a legal file
YAML_EXAMPLES = int(os.environ.get("SEEDANCE_FUZZ_YAML", "400"))
ARCHIVE_EXAMPLES = int(os.environ.get("SEEDANCE_FUZZ_ARCHIVE", "500"))
FUZZ = settings(deadline=None, database=None, derandomize=False, print_blob=True,
                suppress_health_check=list(HealthCheck))


class Hang(Exception):
    pass


@contextmanager
def _alarm(seconds: int):
    def ring(_sig, _frame):
        raise Hang()
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


COUNTS: dict = {}


def _count(kind: str, key: str) -> None:
    COUNTS.setdefault(kind, {"inputs": 0, "hangs": 0, "tracebacks": 0, "outside": 0})
    COUNTS[kind][key] += 1


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    for kind, counts in sorted(COUNTS.items()):
        print(f"\nfuzz {kind}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


# --- YAML -------------------------------------------------------------------------------------

YAML_CHARS = st.sampled_from(list("[]{}:,-&*!|>'\"#?%@`\n \t") + ["a", "b", "x", "1", "&a ", "*a", "&b ", "*b",
                                                                   "<<: ", "- ", "  ", "\n  ", "---\n", "!!str ",
                                                                   "\xe9", "\ufeff", "\x00"])


@st.composite
def alias_graphs(draw):
    levels = draw(st.integers(1, 12))
    fanout = draw(st.integers(1, 12))
    flow = draw(st.booleans())
    lines = ["a0: &a0 [" + ",".join(["x"] * fanout) + "]"]
    for i in range(1, levels):
        refs = [f"*a{draw(st.integers(0, i - 1))}" for _ in range(fanout)]
        if flow:
            lines.append(f"a{i}: &a{i} [" + ",".join(refs) + "]")
        else:
            lines.append(f"a{i}: &a{i}\n" + "".join(f"  - {r}\n" for r in refs).rstrip("\n"))
    if draw(st.booleans()):
        lines.append(f"self: &s [*s]")
    return "\n".join(lines) + "\n"


@st.composite
def nestings(draw):
    depth = draw(st.integers(1, 4000))
    style = draw(st.sampled_from(["flow-seq", "flow-map", "block-seq", "block-map", "mixed"]))
    if style == "flow-seq":
        return "[" * depth + "]" * depth
    if style == "flow-map":
        return "{a: " * depth + "1" + "}" * depth
    if style == "block-seq":
        return "".join("  " * i + "- \n" for i in range(min(depth, 2000)))
    if style == "block-map":
        return "".join("  " * i + f"k{i}:\n" for i in range(min(depth, 2000)))
    return "a: " + "[{b: " * (depth // 2) + "1" + "}]" * (depth // 2) + "\n"


YAML_INPUTS = st.one_of(st.lists(YAML_CHARS, max_size=300).map("".join), alias_graphs(), nestings(),
                        st.text(max_size=200))


def _walk_size(node, depth=0) -> int:
    """Expanded size of a loaded document (what a careless consumer would walk)."""
    assert depth <= yamlio.MAX_DEPTH + 2
    if isinstance(node, dict):
        return 1 + sum(_walk_size(k, depth + 1) + _walk_size(v, depth + 1) for k, v in node.items())
    if isinstance(node, (list, tuple)):
        return 1 + sum(_walk_size(v, depth + 1) for v in node)
    return 1


def _yaml_sites(text: str, tmp: Path) -> None:
    """The loader and every read site that takes YAML text or a file."""
    from seedance.collect.config import BadYaml, config_facts
    from seedance.judge.engine import load_rules
    from seedance.fix.envleak import parse_or_refuse
    from seedance.plugins.manifest import load_manifest
    from seedance.service.config import read_config_file

    for call in (lambda: yamlio.load(text, "f.yaml"), lambda: yamlio.roundtrip_load(YAML(typ="rt"), text, "f.yaml")):
        try:
            doc = call()
        except (BadInput, yaml.YAMLError, RuamelError):
            continue
        assert _walk_size(doc) <= 2 * yamlio.MAX_NODES + 1
    path = tmp / "f.yaml"
    path.write_text(text, errors="surrogateescape")
    rules = tmp / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "r.yaml").write_text(text, errors="surrogateescape")
    for call in (lambda: config_facts(str(path)), lambda: load_rules(rules), lambda: parse_or_refuse(str(path), text),
                 lambda: load_manifest(path, text=text), lambda: read_config_file(path)):
        try:
            call()
        except (SeedanceError, BadYaml):
            pass


@settings(FUZZ, max_examples=YAML_EXAMPLES)
@given(text=YAML_INPUTS)
def test_fuzz_yaml_loader_and_read_sites(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("y")
    _count("yaml", "inputs")
    try:
        with _alarm(PER_INPUT_S):
            _yaml_sites(text, tmp)
    except Hang:
        _count("yaml", "hangs")
        raise AssertionError(f"hang on {text[:200]!r}")
    except AssertionError:
        raise
    except BaseException as exc:
        _count("yaml", "tracebacks")
        raise AssertionError(f"{type(exc).__name__}: {exc} on {text[:200]!r}") from exc


# --- archives ---------------------------------------------------------------------------------

COMPONENTS = st.sampled_from(["..", ".", "a", "b", "pkg", "l1", "l2", "l3", "", "manifest.yaml", "x" * 300,
                              "dev", "sub", "\\", "c:"])


def _names(canary: str):
    rel = st.lists(COMPONENTS, min_size=1, max_size=5).map("/".join)
    return st.one_of(rel, rel.map(lambda n: "/" + n), st.just(canary + "/planted"),
                     st.builds(lambda k, n: "../" * k + n, st.integers(1, 12), rel))


@st.composite
def tar_members(draw, canary):
    names = _names(canary)
    members = [("pkg/manifest.yaml", "file", b"name: t\nversion: 1.0.0\n", 0o644)]
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["file", "file", "dir", "sym", "sym", "sym", "hard", "chr", "fifo"]))
        target = draw(st.one_of(names, st.just(canary), st.sampled_from(["..", ".", "l1/..", "l2/..", "../.."])))
        members.append((draw(names), kind, target, draw(st.integers(0, 0o7777))))
    return members


def _build_tar(members, compress=True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if compress else "w", format=tarfile.GNU_FORMAT) as tar:
        for name, kind, target, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "file":
                data = b"payload " + name.encode("utf-8", "surrogateescape")[:50]
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            if kind in ("sym", "hard"):
                info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def _build_zip(members) -> bytes:
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
        warnings.simplefilter("ignore")  # duplicate names are part of the attack
        for name, kind, target, mode in members:
            info = zipfile.ZipInfo(name + ("/" if kind == "dir" else ""))
            fmt = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "sym": stat.S_IFLNK, "hard": stat.S_IFREG,
                   "chr": stat.S_IFCHR, "fifo": stat.S_IFIFO}[kind]
            info.external_attr = (fmt | (mode & 0o7777)) << 16
            zf.writestr(info, target.encode("utf-8", "surrogateescape") if kind == "sym" else b"payload")
    return buf.getvalue()


def _flip(data: bytes, flips) -> bytes:
    out = bytearray(data)
    for pos, value in flips:
        if out:
            out[pos % len(out)] = value
    return bytes(out)


def _snapshot(box: Path, skip: Path) -> set:
    seen = set()
    for base, dirs, files in os.walk(box):
        if Path(base) == skip:
            dirs[:] = []
            continue
        for name in dirs + files:
            seen.add(os.path.join(base, name))
    return seen


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    root = tmp_path_factory.mktemp("archive-fuzz")
    (root / "canary").mkdir()
    return root


@settings(FUZZ, max_examples=ARCHIVE_EXAMPLES)
@given(data=st.data())
def test_fuzz_archive_extractor(box, data):
    canary = box / "canary"
    members = data.draw(tar_members(str(canary)))
    fmt = data.draw(st.sampled_from(["tar.gz", "whl", "zip", "tar.gz-flipped", "whl-flipped"]))
    blob = _build_tar(members) if fmt.startswith("tar") else _build_zip(members)
    if fmt.endswith("flipped"):
        blob = _flip(blob, data.draw(st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)),
                                              min_size=1, max_size=8)))
    _count("archive", "inputs")
    case = box / f"case{COUNTS['archive']['inputs']}"
    deep = case / "store" / ".staging" / "a" / "b"
    deep.mkdir(parents=True)
    src = case / f"plugin.{fmt.split('-')[0]}"
    src.write_bytes(blob)
    before = _snapshot(box, deep)
    try:
        with _alarm(PER_INPUT_S):
            root = archive.extract(src, deep)
            assert root.is_relative_to(deep)
    except Hang:
        _count("archive", "hangs")
        raise AssertionError(f"hang on {fmt} {members!r}")
    except BadInput as exc:
        assert "\n" not in str(exc)
    except AssertionError:
        raise
    except BaseException as exc:
        _count("archive", "tracebacks")
        raise AssertionError(f"{type(exc).__name__}: {exc} on {fmt} {members!r}") from exc
    finally:
        after = _snapshot(box, deep)
        new = sorted(after - before)
        if new or any(canary.iterdir()):
            _count("archive", "outside")
            raise AssertionError(f"written outside the staging root: {new[:5]} {list(canary.iterdir())[:5]}")
        real_deep = os.path.realpath(deep)
        for base, dirs, files in os.walk(deep):
            for name in dirs + files:
                path = os.path.join(base, name)
                if os.path.islink(path):
                    real = os.path.realpath(path)
                    if not (real == real_deep or real.startswith(real_deep + os.sep)):
                        _count("archive", "outside")
                        raise AssertionError(f"a link left the root: {path} -> {os.readlink(path)}")
        import shutil
        shutil.rmtree(case, ignore_errors=True)

