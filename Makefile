# gpuwarden: `make run` and `make test` set up everything they need on Debian 12 (as root, or with sudo).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PREFIX ?= /opt/gpuwarden
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# command that must exist -> Debian package that provides it
BUILD_NEEDS := cc:gcc pkg-config:pkg-config
TEST_NEEDS := promtool:prometheus prometheus:prometheus systemd-analyze:systemd journalctl:systemd unshare:util-linux \
	nsenter:util-linux prometheus-node-exporter:prometheus-node-exporter taskset:util-linux setpriv:util-linux \
	tmux:tmux useradd:passwd pgrep:procps ss:iproute2 prometheus-alertmanager:prometheus-alertmanager \
	amtool:prometheus-alertmanager dockerd:docker.io debootstrap:debootstrap systemd-nspawn:systemd-container \
	rsvg-convert:librsvg2-bin chromium:chromium jq:jq man:man-db git:git

.PHONY: run test lint bench install uninstall system-deps test-deps peers nspawn clean

# `make run CONFIG=my.toml` runs with your file; without it, on the built-in defaults. It installs what the
# daemon runs with, as `make install` does (the journal extra), and none of the test tools.
run: $(VENV)/.runtime
	$(VENV)/bin/gpuwarden $(if $(CONFIG),--config $(abspath $(CONFIG))) run

# The engines and the nspawn root build (niced) while the tests that need neither run; then the tests that need
# them (tests/run.sh). `make peers nspawn` builds them alone.
test: test-deps $(VENV)/.installed
	$(VENV)/bin/ruff check src tests bench
	VENV=$(VENV) MAKE="$(MAKE)" bash tests/run.sh

# Real engines for the end-to-end tests (vLLM, llama.cpp), cached outside the checkout in $(PEERS_CACHE):
# the first run builds them (about 10 minutes), later runs find them in a second.
PEERS_CACHE ?= $(or $(GPUWARDEN_PEERS),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gpuwarden-peers)
peers: system-deps
	@GPUWARDEN_PEERS=$(PEERS_CACHE) PYTHON=$(PYTHON) bash tests/peers/install.sh

# A Debian 12 root with systemd for tests/integration/test_real_systemd.py, cached outside the checkout in
# $(NSPAWN_CACHE): the first run makes it with debootstrap (1.5 to 4 minutes, 600 MB), later runs find it at once.
NSPAWN_CACHE ?= $(or $(GPUWARDEN_NSPAWN),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gpuwarden-nspawn)
nspawn: test-deps
	@GPUWARDEN_NSPAWN=$(NSPAWN_CACHE) bash tests/nspawn/install.sh

# Each bench prints its figures as FIGURE lines; bench/report.py runs them and writes the table of figures into
# docs/benchmarks.md and README.md. Under the heavy-work lock: the figures are only worth the machine's quiet.
bench: $(VENV)/.installed
	flock /tmp/gpuwarden-heavy.lock $(VENV)/bin/python bench/report.py

system-deps:
	@bash .ci/apt-needs $(BUILD_NEEDS)
	@pkg-config --exists libsystemd || bash .ci/apt-needs --package libsystemd-dev
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || bash .ci/apt-needs --package python3-venv
	@$(PYTHON) -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
		|| bash .ci/apt-needs --package python3-dev

test-deps: system-deps
	@bash .ci/apt-needs $(TEST_NEEDS)
	@bash .ci/apt-needs --package libfuse2 fonts-dejavu-core

$(VENV)/.runtime: pyproject.toml | system-deps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[journal]'
	touch $@

$(VENV)/.installed: pyproject.toml | system-deps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

# `make install DESTDIR=/tmp/stage PREFIX=/usr/lib/gpuwarden` stages it for a package: the virtualenv in
# $(DESTDIR)$(PREFIX), then `gpuwarden install` places the unit (its ExecStart names $(PREFIX), not the stage),
# the configuration (0600; an existing one is kept, only tightened), the man page and the bash completion
# (below $(DESTDIR)$(DATAPREFIX)/share) and gpuwarden on PATH ($(DATAPREFIX)/bin, a link). A virtualenv names its
# own path inside: staged elsewhere, it runs only once it is at $(PREFIX).
DESTDIR ?=
DATAPREFIX ?= /usr/local
install: system-deps
	$(SUDO) $(PYTHON) -m venv $(DESTDIR)$(PREFIX)
	$(SUDO) $(DESTDIR)$(PREFIX)/bin/pip install -q --upgrade pip
	$(SUDO) $(DESTDIR)$(PREFIX)/bin/pip install -q '.[journal]'  # the service reads the journal's catch-up (system-deps has its build needs)
	$(SUDO) $(DESTDIR)$(PREFIX)/bin/gpuwarden install --root "$(or $(DESTDIR),/)" --prefix $(DATAPREFIX) \
		--exec $(PREFIX)/bin/gpuwarden
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then $(SUDO) systemctl daemon-reload; fi

uninstall:
	-@[ -d /run/systemd/system ] && $(SUDO) systemctl disable --now gpuwarden 2>/dev/null; true
	$(SUDO) rm -f $(DESTDIR)/etc/systemd/system/gpuwarden.service $(DESTDIR)$(DATAPREFIX)/share/man/man1/gpuwarden.1 \
		$(DESTDIR)$(DATAPREFIX)/share/bash-completion/completions/gpuwarden
	if [ -L $(DESTDIR)$(DATAPREFIX)/bin/gpuwarden ]; then $(SUDO) rm -f $(DESTDIR)$(DATAPREFIX)/bin/gpuwarden; fi  # ours: a link
	$(SUDO) rm -rf $(DESTDIR)$(PREFIX)
	-@[ -d /run/systemd/system ] && $(SUDO) systemctl daemon-reload; true
	@echo "kept /etc/gpuwarden (your configuration) and /var/lib/gpuwarden (the event store)"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
