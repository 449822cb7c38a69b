# The two commands of the README: `make verify LEVEL=L0` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
LEVEL  ?= L0
JOBS   ?= auto
ARGS   ?=
REGISTRY ?=
STORE  ?=
PORT   ?= 8470
VERIFY_OPTS := $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(STORE),--store $(STORE))
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: setup verify mutants test bench serve clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

verify: $(STAMP)
	$(BIN)/verify run --level $(LEVEL) -n $(JOBS) $(VERIFY_OPTS) $(ARGS)

mutants: $(STAMP)
	$(BIN)/verify run --level $(LEVEL) --backend mutants -n $(JOBS) $(VERIFY_OPTS) $(ARGS)

serve: $(STAMP)
	$(BIN)/verify serve --port $(PORT) $(if $(STORE),--store $(STORE)) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadgroup $(ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_compare.py
	$(BIN)/python benchmarks/bench_golden_memory.py
	$(BIN)/python benchmarks/bench_registry.py
	$(BIN)/python benchmarks/bench_report.py
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_ray.py

clean:
	rm -rf $(VENV) reports/*/ build *.egg-info
