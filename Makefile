# The two commands: `make demo` (the main job) and `make test` (the whole suite and the gates).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Every Python tree that the gates check (those that exist in this checkout).
CODE := $(wildcard statecore stores relay tests benchmarks examples docs)

.PHONY: demo chat matrix matrix-crash sim sim-real test lint typecheck pytest bench clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need Python 3.11+ on PATH (or make PYTHON=...)"; exit 1; }
	@echo "==> creating $(VENV)/ with $(PYTHON)"
	@$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	@echo "==> installing statecore and its test tools into $(VENV)/ (the first time takes about half a minute)"
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)
	@echo "==> installed: the statecore command is $(BIN)/statecore (or: source $(BIN)/activate)"

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# A live bot with the web chat and the dashboard, until Ctrl-C.
chat: $(STAMP)
	$(BIN)/python examples/chat.py

# A bot on a throwaway Matrix homeserver (or yours: make matrix ARGS="--homeserver URL --user ID"),
# with the person's login printed for any Matrix client, until Ctrl-C.
matrix: $(STAMP)
	$(BIN)/python examples/matrix_bot.py $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)

typecheck: $(STAMP)
	$(BIN)/mypy --strict -p statecore -p stores -p relay
	$(BIN)/mypy --strict examples

pytest: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck pytest

# The deterministic simulation's long campaign: make sim SEEDS=10000 (make test runs 300).
SEEDS ?= 10000
sim: $(STAMP)
	$(BIN)/python -m relay.sim --seeds $(SEEDS)

# The same campaign with the real runtime (Connector, Gateway, websockets) on the deterministic
# event loop: make sim-real SEEDS=1000 (make test runs 60).
sim-real: $(STAMP)
	$(BIN)/python -m relay.sim --real --seeds $(SEEDS)

# The Matrix crash run, long: the connector (Matrix driver) and the gateway SIGKILLed KILLS times
# each under load against a throwaway Synapse, its summary table printed (make test runs 3 each).
KILLS ?= 50
matrix-crash: $(STAMP)
	STATECORE_MATRIX_CRASH_KILLS=$(KILLS) $(BIN)/pytest -q -s tests/relay/matrix/test_crash.py

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
