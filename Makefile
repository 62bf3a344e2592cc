# seedance: `make install`, `make run`, `make test`.  Each installs what it needs itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.seedance-installed
SHARE_STAMP := $(VENV)/share/seedance/.completion-installed $(VENV)/share/seedance/.examples-installed
# the CPU torch wheel lies on disk on these machines; pip finds it there first
WHEELS := $(wildcard /opt/wheels)
PIP_FIND := $(if $(WHEELS),--find-links $(WHEELS),)
APT_PACKAGES := gcc make libc6-dev python3-bpfcc bpfcc-tools linux-headers-amd64 patchelf libtree pax-utils python3-pyelftools systemd graphviz jq man-db strace podman runc skopeo umoci uidmap

.PHONY: install dashboard run test system-deps headers bench bench-churn bench-accuracy mutate clean image

install: $(STAMP) $(SHARE_STAMP) deploy/grafana-dashboard.json

# The fleet dashboard, generated with grafana-foundation-sdk (tools/grafana_dashboard.py): a
# build output, never kept in git, so it cannot fall out of step with the rules it queries
dashboard: deploy/grafana-dashboard.json
deploy/grafana-dashboard.json: tools/grafana_dashboard.py deploy/prometheus-rules.yaml | $(STAMP)
	$(BIN)/python tools/grafana_dashboard.py $@ >/dev/null

# Completion scripts and man pages generated from the parsers (shtab, argparse-manpage), and
# the example plugins built into the default plugin source, all under .venv/share:
#   source .venv/share/bash-completion/completions/seedance ; man -M .venv/share/man seedance
$(VENV)/share/seedance/.completion-installed: $(STAMP) $(wildcard agent/cli.py agent/commands/completion_files.py agent/commands/*.py)
	$(BIN)/python -m seedance.commands.completion_files install $(VENV) >/dev/null
	mkdir -p $(@D) && touch $@

$(VENV)/share/seedance/.examples-installed: $(STAMP) $(wildcard examples/plugins/*.py examples/plugins/*/* examples/plugins/*/src/*)
	$(BIN)/python examples/plugins/build.py $(VENV)/share/seedance/plugins >/dev/null
	touch $@

# As root, install the system packages: bcc (Debian's python3-bpfcc; PyPI's "bcc" is an
# unrelated package), kernel headers for it, and the peers the tests and benches compare with.
system-deps:
	@if [ "$$(id -u)" = 0 ]; then \
	  missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "seedance: apt-get install$$missing"; \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null; \
	  fi; \
	  $(MAKE) --no-print-directory headers; \
	else echo "seedance: not root: skipping system packages ($(APT_PACKAGES))"; fi

# bcc compiles against the running kernel's headers.  When the running kernel ships none
# (a custom 6.18 here), point /lib/modules/$(uname -r)/{build,source} at Debian's trees.
headers:
	@kdir=/lib/modules/$$(uname -r); \
	if [ "$$(id -u)" = 0 ] && [ ! -e $$kdir/build/include ]; then \
	  arch=$$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1); \
	  common=$$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1); \
	  if [ -n "$$arch" ] && [ -n "$$common" ]; then \
	    mkdir -p $$kdir && ln -sfn $$arch $$kdir/build && ln -sfn $$common $$kdir/source; \
	    echo "seedance: $$kdir/build -> $$arch"; \
	  fi; \
	fi; \
	if [ "$$(id -u)" = 0 ] && [ -d /sys/kernel/tracing ] && ! mountpoint -q /sys/kernel/tracing; then \
	  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true; \
	fi

# the shim is compiled by `pip install -e .`, so its sources are prerequisites too.  The
# editable install skips what a wheel's build generates (man pages, completions, example
# plugin archives): the two recipes above write them into the venv, from the working tree.
$(STAMP): pyproject.toml setup.py requirements-test.txt $(wildcard shim/src/*.c shim/src/*.h shim/src/*.def shim/include/*.h shim/*.py agent/elf/*.c agent/elf/*.h) | system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(PIP_FIND) --upgrade pip setuptools wheel
	$(BIN)/pip install -q $(PIP_FIND) -r requirements-test.txt
	$(BIN)/pip install -q $(PIP_FIND) -e .
	@# setuptools' editable hook imports pathlib at every start of every command: same mapping, lighter hook
	$(BIN)/python tools/fast_editable.py
	@# bytecode written now: with PYTHONDONTWRITEBYTECODE set (as on these machines) an editable
	@# install never caches it, and every command would compile its modules again from source
	$(BIN)/python -m compileall -q agent shim >/dev/null
	@# bcc is pure Python over libbcc (ctypes): expose only Debian's bcc package to the venv.
	@# (site-packages is asked of the venv here, inside the recipe: it may not exist at parse time)
	@# seedance-run, the C front end of `seedance run` built with the shim, on the venv's PATH
	ln -sfn $(CURDIR)/shim/seedance-run $(BIN)/seedance-run
	@# ... and `seedance` itself: as that name the launcher takes `seedance run` and execs
	@# the Python CLI for every other command (pip's script would start Python first)
	if [ -x shim/seedance-run ]; then ln -sfn $(CURDIR)/shim/seedance-run $(BIN)/seedance; fi
	@site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	if [ -d /usr/lib/python3/dist-packages/bcc ] && [ -d "$$site" ]; then ln -sfn /usr/lib/python3/dist-packages/bcc "$$site/bcc"; fi
	touch $(STAMP)

# Findings (exit 1) are the job's result, not a make failure; exit 2 (bad input) still fails.
run: install
	$(BIN)/seedance check || [ $$? -eq 1 ]

test: install
	$(BIN)/python -m pytest -q tests

# Every benchmark runs its named peer in the same run and prints the ratio (see README).
# The agent churn bench runs 10 minutes by default: `make bench-churn`.
BENCHES := bench_elf bench_ldd_parity bench_check_speed bench_relink bench_shim bench_trace bench_batching bench_accuracy bench_profiler
bench: install
	@set -e; for b in $(BENCHES); do echo "== $$b"; $(BIN)/python bench/$$b.py; done

bench-churn: install
	$(BIN)/python bench/bench_agent_churn.py

# Every accuracy corpus, the GPU ecosystem's real wheels included (a few GB, downloaded once
# into ~/.cache/seedance-corpus or $SEEDANCE_CORPUS); the table goes to bench/accuracy-results.md.
bench-accuracy: install
	$(BIN)/python bench/bench_accuracy.py --results bench/accuracy-results.md
	SEEDANCE_FIX_TEXTS=all $(BIN)/python -m pytest -q tests/integration/test_fix_texts_resolve.py

# Mutation testing, bench time, not CI: hours on two cores.  Scores per module go to
# bench/mutation-results.json; survivors are explained in bench/mutation-survivors.md.
# `make mutate MUTATE="elf resolve"` for some modules; MUTATE_ARGS="--sample 200" for an estimate.
MUTATE ?=
mutate: install
	$(BIN)/python bench/run_mutation.py $(MUTATE_ARGS) $(MUTATE)

# The DaemonSet's image, seedance:$(VERSION) (deploy/Containerfile).  The base comes from
# Debian's archive through mmdebstrap (deploy/mkbase.sh; cached as a tar in
# ~/.cache/seedance-images), the wheels from `pip wheel .` here; podman builds with runc and
# the lowered rlimits these machines need.  `make image BCC=no` leaves out python3-bpfcc
# (and LLVM with it) for nodes that run without the eBPF probes: seedance:$(VERSION)-nobpf.
# --no-cache: the wheels reach the build through a bind mount, which is no part of a layer's
# cache key, so a cached layer would still hold the previous build's wheel.
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' agent/__init__.py)
BCC ?= yes
IMAGE_PACKAGES := python3 python3-venv $(if $(filter no,$(BCC)),,python3-bpfcc)
IMAGE_TAG ?= seedance:$(VERSION)$(if $(filter no,$(BCC)),-nobpf,)
PODMAN_BUILD := podman build --no-cache --runtime /usr/sbin/runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
image: | $(STAMP)
	@set -e; base=$$(deploy/mkbase.sh seedance-base$(if $(filter no,$(BCC)),-nobpf,) $(IMAGE_PACKAGES)); \
	ctx=build/image; rm -rf $$ctx; mkdir -p $$ctx/wheels; \
	$(BIN)/pip wheel -q $(PIP_FIND) . -w $$ctx/wheels; \
	$(PODMAN_BUILD) -q -f deploy/Containerfile --build-arg BASE=$$base --build-arg VERSION=$(VERSION) \
	  -t $(IMAGE_TAG) $$ctx >/dev/null; \
	echo "$(IMAGE_TAG): $$(podman image inspect --format '{{.Size}}' $(IMAGE_TAG) | awk '{printf "%.0f MB", $$1/1e6}') (base $$base)"

clean:
	rm -rf $(VENV) build *.egg-info shim/libseedance_shim.so agent/elf/_fastelf_cffi.c shim/_shim_cffi.py
