# The two commands: `make demo` (the main job) and `make test` (the whole suite and the gates).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Every Python tree that the gates check (those that exist in this checkout).
CODE := $(wildcard statecore stores relay tests benchmarks examples docs)

.PHONY: demo chat matrix telegram slack discord matrix-crash telegram-crash slack-crash \
	discord-crash sim sim-real chaos-fleet test lint typecheck pytest bench clean

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

# A bot on a fake Telegram, Slack or Discord on loopback, where you play the person (or the real
# platform with its token in the environment: see docs/telegram.md, slack.md, discord.md).
telegram: $(STAMP)
	$(BIN)/python examples/telegram_bot.py $(ARGS)

slack: $(STAMP)
	$(BIN)/python examples/slack_bot.py $(ARGS)

discord: $(STAMP)
	$(BIN)/python examples/discord_bot.py $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)

typecheck: $(STAMP)
	$(BIN)/mypy --strict -p statecore -p stores -p relay
	$(BIN)/mypy --strict examples

# The suite in TEST_JOBS worker processes (pytest-xdist), a test module per worker at a time: most
# tests wait on sockets, subprocesses and servers, so two workers keep both cores busy.
TEST_JOBS ?= 2
pytest: $(STAMP)
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist loadfile

test: lint typecheck pytest

# The deterministic simulation's long campaign: make sim SEEDS=10000 (make test runs 300), in JOBS
# worker processes (0: one per core).
SEEDS ?= 10000
JOBS ?= 0
sim: $(STAMP)
	$(BIN)/python -m relay.sim --seeds $(SEEDS) --jobs $(JOBS)

# The same campaign with the real runtime (Connector, Gateway, websockets) on the deterministic
# event loop: make sim-real SEEDS=1000 (make test runs 60), in JOBS processes as well.
sim-real: $(STAMP)
	$(BIN)/python -m relay.sim --real --seeds $(SEEDS) --jobs $(JOBS)

# The fault harness: 3 gateway processes on one PostgreSQL ledger, 2 connector nodes in a cluster,
# users writing, under FAULTS seeded faults (partitions, pauses, PostgreSQL restarts and kills,
# clock offsets, SIGKILLs); the history checker's verdict and docs/chaos.md's table at the end
# (make test runs a short run).
FAULTS ?= 500
CHAOS_SEED ?= 28
chaos-fleet: $(STAMP)
	$(BIN)/python -m tests.chaos --faults $(FAULTS) --seed $(CHAOS_SEED) --results docs/chaos.md

# The Matrix crash run, long: the connector (Matrix driver) and the gateway SIGKILLed KILLS times
# each under load against a throwaway Synapse, its summary table printed (make test runs 3 each).
KILLS ?= 50
matrix-crash: $(STAMP)
	STATECORE_MATRIX_CRASH_KILLS=$(KILLS) $(BIN)/pytest -q -s tests/relay/matrix/test_crash.py

# The same crash runs against the fake Telegram, Slack and Discord (make test runs 3 kills each).
telegram-crash: $(STAMP)
	STATECORE_TELEGRAM_CRASH_KILLS=$(KILLS) $(BIN)/pytest -q -s tests/relay/telegram/test_crash.py

slack-crash: $(STAMP)
	STATECORE_SLACK_CRASH_KILLS=$(KILLS) $(BIN)/pytest -q -s tests/relay/slack/test_crash.py

discord-crash: $(STAMP)
	STATECORE_DISCORD_CRASH_KILLS=$(KILLS) $(BIN)/pytest -q -s tests/relay/discord/test_crash.py

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
