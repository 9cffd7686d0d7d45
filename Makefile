# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU build of torch; a bare `torch` requirement would download a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
# Where torch comes from: empty = pip's own configuration; elsewhere, for the CPU build,
# TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: install demo test lint bench clean system-deps

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/preflight run manifests/pilote.yaml

# System packages the tests need (a real sshd for the remote tests; Blender for the render
# pilot tests, Debian's CPU-only build), through apt-get when it can; one clear line when it
# cannot (the sshd tests then fail naming what is missing; the Blender tests are skipped
# with a reason naming the missing `blender` binary).
SYSTEM_PACKAGES := openssh-server blender
system-deps:
	@missing=""; \
	for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing system packages:$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing >/dev/null) \
	    || echo "warning: could not install$$missing with apt-get; the tests that need them will fail" >&2; \
	else \
	  echo "warning: cannot install$$missing (needs apt-get as root); install them yourself" >&2; \
	fi

test: $(STAMP) system-deps
	$(BIN)/ruff check bot runner tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check bot runner tests bench
	$(BIN)/mypy

bench: $(STAMP)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
