# The two commands a newcomer needs: `make demo` and `make test`. Each builds its own virtualenv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test system-deps lint bench bench-drain bench-durability bench-compare bench-http bench-clients bench-cluster bench-waiting-room bench-bridge bench-notices bench-history bench-token-cache soak rehearse-hosts check-deploy lock clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	scripts/system-deps --demo
	$(BIN)/seckill demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/lint-imports

# The suite's system packages (Redis 7, Chromium): installed as root, else the command to run.
system-deps:
	scripts/system-deps

# One test process per core (each starts its own Redis servers and SQL databases); a module's
# tests stay together, in order, and share its servers.
test: system-deps lint
	$(BIN)/pytest -n auto --dist loadscope --durations=15 $(PYTEST_ARGS)

# The image's locks (deploy/): pyproject's runtime dependencies (requirements.lock) and its build
# backend (build.lock), pinned with hashes for CPython 3.11 on Linux; the aarch64 resolution must
# match the x86-64 one. Pins already there are kept: LOCK_ARGS=--upgrade takes the newest.
LOCK := $(BIN)/uv pip compile --quiet --generate-hashes --python-version 3.11 \
	--custom-compile-command 'make lock' $(LOCK_ARGS)
lock: $(STAMP)
	$(LOCK) --python-platform x86_64-manylinux_2_36 -o deploy/requirements.lock pyproject.toml
	cp deploy/requirements.lock $(VENV)/requirements-aarch64.lock
	$(LOCK) --python-platform aarch64-manylinux_2_36 -o $(VENV)/requirements-aarch64.lock pyproject.toml
	diff -u deploy/requirements.lock $(VENV)/requirements-aarch64.lock
	$(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')" \
	  | $(LOCK) --python-platform x86_64-manylinux_2_36 -o deploy/build.lock -

# The deploy assets, offline: compose and the Kubernetes manifests rendered and checked against
# their schemas and against the product (settings, command lines, probes, ports). kubectl from
# scripts/system-deps.
check-deploy: system-deps $(STAMP)
	$(BIN)/pytest tests/deploy -q

bench: $(STAMP)
	$(BIN)/python -m benchmarks.engine

bench-drain: $(STAMP)  # MariaDB and PostgreSQL: SECKILL_TEST_MARIADB_URL, SECKILL_TEST_POSTGRES_URL
	$(BIN)/python -m benchmarks.drain

bench-durability: $(STAMP)  # starts its own primaries and a replica on free ports
	$(BIN)/python -m benchmarks.durability

bench-compare: $(STAMP)  # needs a MariaDB: SECKILL_TEST_MARIADB_URL, default root@127.0.0.1:3306
	$(BIN)/python -m benchmarks.compare $(BENCH_ARGS)

bench-http: $(STAMP)  # starts its own redis-server and servers on free ports; uses wrk if installed
	$(BIN)/python -m benchmarks.http $(BENCH_ARGS)

bench-clients: $(STAMP)  # skips a client that is not installed (coredis, valkey-glide)
	$(BIN)/python -m benchmarks.redis_clients $(BENCH_ARGS)

bench-cluster: $(STAMP)  # starts its own redis-server and a local cluster on free ports
	$(BIN)/python -m benchmarks.cluster $(BENCH_ARGS)

bench-waiting-room: $(STAMP)  # starts its own redis-server and servers on free ports; uses wrk if installed
	$(BIN)/python -m benchmarks.waiting_room $(BENCH_ARGS)

bench-bridge: $(STAMP)  # starts its own redis-server; RabbitMQ and NATS: SECKILL_TEST_AMQP_URL, SECKILL_TEST_NATS_URL
	$(BIN)/python -m benchmarks.bridge $(BENCH_ARGS)

soak: $(STAMP)  # a Redis Cluster, NATS and processes of its own; PostgreSQL: SECKILL_TEST_POSTGRES_URL
	$(BIN)/python -m benchmarks.soak $(BENCH_ARGS)

rehearse-hosts: $(STAMP)  # as root: network namespaces as hosts with a Redis Cluster, a PostgreSQL behind PgBouncer, APIs and workers of their own, started as deploy.md's first deploy
	$(BIN)/python -m benchmarks.hosts $(BENCH_ARGS)

bench-notices: $(STAMP)  # starts its own redis-server, API and persister; SQLite unless BENCH_ARGS='--database-url URL'
	$(BIN)/python -m benchmarks.notices $(BENCH_ARGS)

bench-history: $(STAMP)  # starts its own redis-servers, SQLite databases and servers on free ports
	$(BIN)/python -m benchmarks.history $(BENCH_ARGS)

bench-token-cache: $(STAMP)  # memory, counted by tracemalloc: the same figure on a busy machine
	$(BIN)/python -m benchmarks.token_cache $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .seckill .pytest_cache .mypy_cache .ruff_cache
