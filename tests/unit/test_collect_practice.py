"""rules/context/*.yaml: the package context is validated when loaded, one line per problem,
and a bad file stops a check with exit 2; a package's explicit preload step is judged as
ld.so sees it (gcc-built libraries laid out as onnxruntime and an NVIDIA wheel)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.collect import package_context, practice
from seedance.collect.scan import CheckOptions, Scanner
from seedance.model.errors import RuleError

GCC = shutil.which("gcc")


def test_shipped_context_files_are_valid_and_every_entry_has_a_source():
    assert all(entry["source"] for entry in package_context.packages())
    assert all(entry["source"] and entry["requirement"] for entry in package_context.libraries())


@pytest.mark.parametrize("doc,says", [
    ({"packages": [{"package": "torch", "loads_first": ["nvidia-wheels"], "how": "loads {provider}"}]},
     "'source' must be a non-empty string"),
    ({"packages": [{"package": "x", "loads_first": ["conda"], "how": "{provider}", "source": "s"}]},
     "loads_first must be among"),
    ({"packages": [{"package": "x", "imports_first": "torch", "source": "s", "colour": 1}]}, "unknown field(s) colour"),
    ({"packages": [{"package": "x", "source": "s"}]}, "says nothing the package does"),
    ({"packages": [{"package": "x", "source": "s", "variants": {"files": "lib(.*)", "picked_by": "torch",
                                                                 "source": "s"}}]}, "needs the groups"),
    ({"pkgs": []}, "expected a mapping with a 'packages:' list"),
])
def test_a_bad_packages_entry_is_one_line(doc, says):
    with pytest.raises(RuleError) as raised:
        package_context.validate_packages(doc, "packages.yaml")
    assert says in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("entry,says", [
    ({"soname": "libx", "requirement": "x --no-binary x", "source": "s"}, "is not a plain"),
    ({"soname": "libx", "requirement": "x; rm -rf /", "source": "s"}, "is not a plain"),
    ({"soname": "lib(", "requirement": "x", "source": "s"}, "bad regex"),
    ({"soname": "libx", "requirement": "x", "source": "s", "cuda": "12"}, "cuda must be a CUDA major"),
])
def test_a_bad_library_entry_is_one_line(entry, says):
    with pytest.raises(RuleError) as raised:
        package_context.validate_libraries({"libraries": [entry]}, "pip_distributions.yaml")
    assert says in str(raised.value)


@pytest.mark.skipif(GCC is None, reason="gcc not installed")
def test_a_bad_context_file_stops_a_check_with_exit_2(tmp_path):
    """The rules directory is copied with a broken packages.yaml; check exits 2 with one line."""
    import seedance.judge.engine as engine

    rules = tmp_path / "rules"
    shutil.copytree(engine.default_rules_dir(), rules)
    (rules / "context" / "packages.yaml").write_text("packages:\n  - package: torch\n")
    site = tmp_path / "site-packages" / "torch" / "lib"
    site.mkdir(parents=True)
    # a library with a NEEDED nothing resolves: the package context is read to judge it
    (tmp_path / "m.c").write_text("int m(void) { return 1; }\n")
    subprocess.run([GCC, "-shared", "-fPIC", tmp_path / "m.c", "-o", tmp_path / "libmissing.so"], check=True)
    subprocess.run([GCC, "-shared", "-fPIC", tmp_path / "m.c", "-o", site / "libx.so", f"-L{tmp_path}",
                    "-Wl,--no-as-needed", "-lmissing"], check=True)
    code = ("import sys, seedance.judge.engine as e; e.RULES_DIR = sys.argv[1]; "
            "from seedance.cli import main; sys.exit(main(['check', '--no-cache', sys.argv[2]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(rules), str(site)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "packages.yaml#0" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.skipif(GCC is None, reason="gcc not installed")
def test_a_library_found_only_after_the_preload_step_says_so(tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    wheel = site / "nvidia" / "cu13" / "lib"
    capi = site / "onnxruntime" / "capi"
    wheel.mkdir(parents=True)
    capi.mkdir(parents=True)
    (tmp_path / "b.c").write_text("int blas(void) { return 3; }\n")
    subprocess.run([GCC, "-shared", "-fPIC", tmp_path / "b.c", "-o", wheel / "libcublas.so.13",
                    "-Wl,-soname,libcublas.so.13"], check=True)
    (tmp_path / "p.c").write_text("int blas(void); int provider(void) { return blas(); }\n")
    provider = capi / "libonnxruntime_providers_cuda.so"
    subprocess.run([GCC, "-shared", "-fPIC", tmp_path / "p.c", "-o", provider, f"-L{wheel}", "-l:libcublas.so.13"],
                   check=True)
    # the oracle: alone it does not load; after the step's RTLD_GLOBAL load of the wheel it does
    code = ("import ctypes, os, sys\n[ctypes.CDLL(p, os.RTLD_NOW | os.RTLD_GLOBAL) for p in sys.argv[2:]]\n"
            "ctypes.CDLL(sys.argv[1], os.RTLD_NOW)")
    alone = subprocess.run([sys.executable, "-c", code, str(provider)], capture_output=True, text=True)
    after = subprocess.run([sys.executable, "-c", code, str(provider), str(wheel / "libcublas.so.13")])
    assert alone.returncode != 0 and "libcublas.so.13" in alone.stderr and after.returncode == 0
    report = Scanner(CheckOptions(targets=[str(site)])).run()
    found = [(f.rule, f.severity) for f in report.findings if f.subject.get("path") == str(provider)]
    assert found == [("needed-after-preload-step", "warning")]
    message = next(f for f in report.findings if f.rule == "needed-after-preload-step").message
    assert "loads only after onnxruntime.preload_dlls()" in message
    # without the wheel it is an error, and the hint pins the CUDA 13 build that ships it
    shutil.rmtree(site / "nvidia")
    report = Scanner(CheckOptions(targets=[str(site)])).run()
    errors = [f for f in report.findings if f.severity == "error"]
    assert [f.rule for f in errors] == ["needed-unresolved"]
    assert "pip install 'nvidia-cublas==13.*' ships it" in errors[0].message


def test_a_package_that_imports_torch_first_gets_torch_preloads(tmp_path):
    site = tmp_path / "site-packages"
    provider = site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
    provider.parent.mkdir(parents=True)
    provider.write_bytes(b"\x7fELF")
    plan = practice.preload_plan(str(site / "torchvision" / "_C.so"), {"libcudart.so.12"})
    assert list(plan) == [str(provider)]
    assert plan[str(provider)][0].startswith("torchvision imports torch first (torchvision/extension.py")
    assert practice.preload_plan(str(site / "numpy" / "x.so"), {"libcudart.so.12"}) == {}
