# The two commands of the README, and what they stand on.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint services-start services-stop

$(BIN)/jobsapp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

# The main job on the embedded default: SQLite, filesystem broker, local storage.
demo: $(BIN)/jobsapp
	$(BIN)/jobsapp demo

# The whole suite against real Postgres, Redis and SeaweedFS started here (and stopped).
test: $(BIN)/jobsapp
	scripts/test.sh

lint: $(BIN)/jobsapp
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

services-start:
	scripts/services.sh start

services-stop:
	scripts/services.sh stop
