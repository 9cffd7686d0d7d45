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

.PHONY: install demo test test-cluster lint bench clean system-deps report-screenshot

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The pilot of 12 documents, then its volume's forecast and the command that approves it:
# the 3,000 documents of data/corpus are made here, the same bytes every time (not committed).
demo: $(STAMP)
	$(BIN)/python data/make_corpus.py data/corpus 3000
	$(BIN)/preflight run manifests/demo.yaml

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

# Four pytest workers (pytest-xdist) on two cores: the suite waits far more than it
# computes (subprocesses, sshd, Ray starts, sleeps that stand for device time: 45% CPU with
# two workers), so four fill the cores. Each test file runs whole on one worker (a session
# fixture, e.g. the remote tests' sshd, is set up once per worker); the files that start a
# Ray run in two lanes, one after another within each (tests/conftest.py). PYTEST_ARGS=
# runs the suite in one process as before.
# The 4 x 8 simulated cluster through the service (two dispatches of four nodes, 32 card
# proofs; about 4 min alone on 2 cores, 8 min under load) would take make test past its
# 8 minutes: it runs with `make test-cluster` (its card stages, test_cluster_kit.py, stay).
PYTEST_ARGS ?= -n 4 --dist loadfile -m "not cluster"
test: $(STAMP) system-deps
	$(BIN)/ruff check bot runner tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-cluster: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -s -m cluster tests/cluster_kit

lint: $(STAMP)
	$(BIN)/ruff check bot runner tests bench
	$(BIN)/mypy

bench: $(STAMP)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

# A picture of a report, for people (not part of `make test`): the demo pilot with a volume
# and a lease that began this hour, approved, then its report.html rendered by headless
# Chromium (Debian's `chromium`) into docs/report-screenshot.png (palette PNG, top of the page).
SHOT_HOME := .report-screenshot
SHOT_PNG  := docs/report-screenshot.png
report-screenshot: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || { echo "report-screenshot needs Debian's chromium (apt-get install chromium)" >&2; exit 1; }
	rm -rf $(SHOT_HOME) && mkdir -p $(SHOT_HOME)/manifests
	cp -r data requirements-rebuild.txt $(SHOT_HOME)/
	{ cat manifests/pilote.yaml; \
	  printf 'volume:\n  inputs: {dir: data/pilote, pattern: "doc-*.txt", expected_count: 12}\n'; \
	  printf 'lease:\n  starts_at: "%s"\n' "$$(date -u +%Y-%m-%dT%H:00:00Z)"; } > $(SHOT_HOME)/manifests/pilote.yaml
	cd $(SHOT_HOME) && export PREFLIGHT_HOME="$$PWD" && \
	  ../$(BIN)/preflight run manifests/pilote.yaml </dev/null >/dev/null; \
	  run=$$(../$(BIN)/preflight runs --json | ../$(BIN)/python -c "import json,sys; print(json.load(sys.stdin)[0]['id'])") && \
	  ../$(BIN)/preflight decide $$run approve --reason "11 accepted, doc-07 refused as expected" --by alice >/dev/null && \
	  ../$(BIN)/preflight report $$run | head -1 > report-path
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
	  --window-size=1000,1900 --screenshot=$(CURDIR)/$(SHOT_HOME)/full.png "file://$$(cat $(SHOT_HOME)/report-path)" 2>/dev/null
	$(BIN)/python -c "from PIL import Image; Image.open('$(SHOT_HOME)/full.png').convert('RGB').quantize(64).save('$(SHOT_PNG)', optimize=True)"
	@ls -l $(SHOT_PNG)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
