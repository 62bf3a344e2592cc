"""seedance: what the build does beyond pyproject.toml, which holds the metadata, the
dependencies and the package mapping.

Only what a declarative file cannot say is here, all of it made at build time:
  * the C parts: the CUDA shim (libseedance_shim.so) with its launcher seedance-run
    (shim/build_shim.py), and the C ELF reader (agent/elf/build_fastelf.py), whose cffi
    sources are generated from their headers first.  Both are optional: without a C
    compiler the pure-Python parts still install (check and ldd work; run says why not);
  * seedance-run in the scripts directory, as well as beside the shim;
  * the man pages and bash/zsh completion scripts generated from the parsers (shtab,
    argparse-manpage: build requirements only), installed where man(1), bash-completion and
    zsh's fpath look below the install prefix;
  * the example plugins, built (gcc; nvcc where present) into plugin archives inside the
    package, the default source of `seedance plugin install NAME`.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

try:
    from setuptools.command.build_scripts import build_scripts
except ImportError:  # setuptools keeps distutils' command under its own name
    from distutils.command.build_scripts import build_scripts

ROOT = os.path.dirname(os.path.abspath(__file__))


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_shim = _load("_seedance_build_shim", "shim", "build_shim.py")
build_fastelf = _load("_seedance_build_fastelf", "agent", "elf", "build_fastelf.py")

# What cffi generates from the headers (the C reader's wrapper, the shim's pre-parsed ABI
# module) is written by every build, before any file is compiled or copied, and never kept
# in git (.gitignore): cffi is a build requirement (pyproject.toml).
build_fastelf.write_wrapper()
build_shim.write_ffi_module()

# The repository layout shows the architecture (agent/, shim/, probes/, rules/); the
# installed import names are all under `seedance`, so nothing generic such as `agent` or
# `probes` lands in site-packages.  Each sub-package of agent/ installs as seedance.<name>.
PACKAGE_DIRS = {"seedance": "agent", "seedance.probes": "probes", "seedance.rules_data": "rules",
                "seedance.shim": "shim"}
PACKAGES = sorted([*PACKAGE_DIRS, *(f"seedance.{entry.name}" for entry in os.scandir(os.path.join(ROOT, "agent"))
                                    if os.path.isfile(os.path.join(entry.path, "__init__.py")))])

# Filled by BuildPy with the generated man pages and completion scripts; install_data reads
# this same list object after the build has run.
DATA_FILES = []
SHARE_DIRS = {"man": "share/man/man1", "bash": "share/bash-completion/completions",
              "zsh": "share/zsh/site-functions"}


class BuildPy(build_py):
    """The pure-Python build, then the files generated from it."""

    def run(self):
        super().run()
        if self.editable_mode:
            # `make install` writes both into the venv itself (completion_files, build.py)
            return
        self.generate_share()
        self.build_example_plugins()

    def generate_share(self):
        """Man pages and completion scripts from the parsers just copied to build_lib: the
        package imported from there by a child interpreter, which has the build
        requirements (shtab, argparse-manpage) on its path, as this one does."""
        prefix = os.path.join(self.get_finalized_command("build").build_base, "seedance-share")
        shutil.rmtree(prefix, ignore_errors=True)
        code = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "from seedance.commands.completion_files import install; "
                "[print(i.kind, i.path) for i in install(sys.argv[2])]")
        with tempfile.TemporaryDirectory() as elsewhere:  # no seedance.py of the cwd first
            out = subprocess.run([sys.executable, "-c", code, os.path.abspath(self.build_lib),
                                  os.path.abspath(prefix)], cwd=elsewhere, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"generating the man pages and completion scripts failed:\n{out.stderr}")
        grouped = {}
        for line in out.stdout.splitlines():
            kind, path = line.split(" ", 1)
            grouped.setdefault(SHARE_DIRS[kind], []).append(os.path.relpath(path, ROOT))
        DATA_FILES[:] = sorted((where, sorted(files)) for where, files in grouped.items())

    def build_example_plugins(self):
        """The example plugins as .tar.gz plugin archives (the form `plugin install` reads):
        their libraries are the traps seedance finds (a libstdc++ newer than any system's, a
        libcudart the host may lack), so they travel as plugin payloads rather than as ELF
        files of the wheel, which auditwheel would judge as the wheel's own."""
        examples = _load("_seedance_build_examples", "examples", "plugins", "build.py")
        out_dir = os.path.join(self.build_lib, "seedance", "plugins", "examples")
        shutil.rmtree(out_dir, ignore_errors=True)
        try:
            built, skipped = examples.build_archives(out_dir)
        except (OSError, RuntimeError) as exc:
            reason = " ".join(str(exc).split())[:300]
            self.warn(f"the example plugins are not built ({reason}): `seedance plugin install NAME` needs "
                      f"--from DIR then")
            shutil.rmtree(out_dir, ignore_errors=True)
            return
        for name, why in skipped:
            self.warn(f"example plugin {name} not built: {why}")


class BuildScripts(build_scripts):
    """seedance-run, built by build_ext beside the shim, copied into the scripts directory as
    the binary it is (distutils' copy reads a script as text to adjust its #! line)."""

    def get_source_files(self):
        return []  # built, not a source: never in the sdist

    def run(self):
        self.mkpath(self.build_dir)
        built_ext = self.get_finalized_command("build_ext")
        ext = next(e for e in built_ext.extensions if e.name == "seedance.shim.libseedance_shim")
        launcher = os.path.join(os.path.dirname(built_ext.get_ext_fullpath(ext.name)), build_shim.LAUNCHER)
        if not os.path.isfile(launcher):
            return  # not built (no compiler): build_ext said so
        target = os.path.join(self.build_dir, build_shim.LAUNCHER)
        self.copy_file(launcher, target)
        self._change_modes([target])


setup(
    package_dir=PACKAGE_DIRS,
    packages=PACKAGES,
    ext_modules=[build_shim.extension(), build_fastelf.extension()],
    cmdclass={"build_ext": build_shim.make_build_ext(build_ext), "build_py": BuildPy,
              "build_scripts": BuildScripts},
    # the placeholder that makes setuptools run build_scripts and install_scripts;
    # BuildScripts supplies the built file
    scripts=[os.path.join("shim", build_shim.LAUNCHER)],
    data_files=DATA_FILES,
)
