"""seedance: build and install.

The repository layout shows the architecture (agent/, shim/, probes/, rules/); the
installed import names are all under ``seedance`` so nothing generic such as ``agent`` or
``probes`` lands in site-packages.
"""
from setuptools import setup

# The CUDA preload shim: a plain C library built through setuptools' compiler
# at install time (also for `pip install -e .`); shim/build_shim.py holds the details.
import importlib.util as _ilu
import os as _os
from setuptools.command.build_ext import build_ext as _build_ext

_spec = _ilu.spec_from_file_location(
    "_seedance_build_shim", _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "shim", "build_shim.py"))
_build_shim = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_build_shim)
# The C ELF reader: a cffi extension (agent/elf/build_fastelf.py); optional:
# without a compiler read_elf uses the Python reader, with the same answers.
_spec = _ilu.spec_from_file_location(
    "_seedance_build_fastelf", _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "agent", "elf",
                                             "build_fastelf.py"))
_build_fastelf = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_build_fastelf)

# What cffi generates from the headers (the C reader's wrapper, the shim's pre-parsed ABI
# module) is written by every build, before any file is compiled or copied, and never kept
# in git (.gitignore): cffi is a build requirement (pyproject.toml).
_build_fastelf.write_wrapper()
_build_shim.write_ffi_module()

PACKAGE_DIRS = {
    "seedance": "agent",
    "seedance.commands": "agent/commands",
    "seedance.files": "agent/files",
    "seedance.run": "agent/run",
    "seedance.render": "agent/render",
    "seedance.judge": "agent/judge",
    "seedance.model": "agent/model",
    "seedance.elf": "agent/elf",
    "seedance.resolve": "agent/resolve",
    "seedance.collect": "agent/collect",
    "seedance.fix": "agent/fix",
    "seedance.plugins": "agent/plugins",
    "seedance.service": "agent/service",
    "seedance.rules_data": "rules",
    "seedance.probes": "probes",
    "seedance.trace": "agent/trace",
    "seedance.shim": "shim",
    "seedance.profile": "agent/profile",
    "seedance.quota": "agent/quota",
}

setup(
    name="seedance",
    version="0.1.0",
    description="Find and fix the hidden traps that waste GPU compute and break GPU plugins",
    python_requires=">=3.9",
    package_dir=PACKAGE_DIRS,
    packages=sorted(PACKAGE_DIRS),
    package_data={"seedance": ["schemas/*.json"], "seedance.probes": ["*.bpf.c", "*.h"], "seedance.rules_data": ["*.yaml", "README.md"],
                  "seedance.shim": ["include/*.h", "src/*.c", "src/*.h", "src/*.def"]},
    ext_modules=[_build_shim.extension(), _build_fastelf.extension()],
    cmdclass={"build_ext": _build_shim.make_build_ext(_build_ext)},
    install_requires=[
        "pyelftools>=0.31",
        "lief>=0.15",
        "cffi>=1.16",
        "PyYAML>=6",
        "ruamel.yaml>=0.18",
        "jsonschema>=4",
        "common-expression-language>=0.10",
        "packaging>=23",
        "nvidia-ml-py>=12",
        "prometheus_client>=0.20",
        # fatbin images are LZ4 (CUDA <= 12) or Zstandard (CUDA 12.8+/13) compressed: reading
        # their kernels needs both; pure-Python LZ4 remains the fallback
        "zstandard>=0.20",
        "lz4>=4",
        # closure pictures (check --graph) and call graphs (profile calls): the Python
        # package writes DOT, Debian's graphviz renders it (Makefile APT_PACKAGES)
        "graphviz>=0.20",
        # completion scripts and man pages generated from the parsers (`seedance completion`,
        # make install): static scripts, no import of seedance on every <TAB>
        "shtab>=1.6",
        "argparse-manpage>=4",
    ],
    # `seedance agent run --otlp-endpoint`: imported only when an endpoint is configured
    extras_require={"otlp": ["opentelemetry-sdk>=1.20", "opentelemetry-exporter-otlp-proto-http>=1.20"]},
    entry_points={
        "console_scripts": [
            "seedance=seedance.cli:console",
            "seedance-check=seedance.cli:check_alias",
            "seedance-fix=seedance.cli:fix_alias",
            "seedance-plugin=seedance.cli:plugin_alias",
            "seedance-bench=seedance.cli:bench_alias",
            "seedance-profiler=seedance.cli:profiler_alias",
        ]
    },
)
