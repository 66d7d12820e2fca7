# The two commands of the README. Both start from nothing: the first run
# creates .venv (scripts/bootstrap.sh) and the default model.
VENV   := .venv
STAMP  := $(VENV)/.installed
VLA    := $(VENV)/bin/vla-edge
DEMO_SECONDS ?= 20
# A machine whose driver sees a GPU runs the robot's setup (config/gpu_demo.yaml: the Qwen2.5-1.5B
# shape in bf16 on PyCUDA, 4096 KV slots); a CPU machine the tiny model with a smaller KV cache
# (config/cpu_demo.yaml says why).
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_GPU),yes)
DEMO_PARAMS ?= config/gpu_demo.yaml
DEMO_MODEL  ?= models/qwen2.5-1.5b-random
DEMO_MODEL_KIND := qwen2.5-1.5b-random --dtype bf16
else
DEMO_PARAMS ?= config/cpu_demo.yaml
DEMO_MODEL  ?= models/tiny
DEMO_MODEL_KIND := tiny
endif

.PHONY: demo test venv clean
venv: $(STAMP)

$(STAMP): requirements.txt setup.py scripts/bootstrap.sh
	bash scripts/bootstrap.sh

$(DEMO_MODEL)/config.json: $(STAMP)
	$(VLA) make-model $(DEMO_MODEL_KIND) --out $(DEMO_MODEL)

demo: $(STAMP) $(DEMO_MODEL)/config.json
	$(VLA) demo --seconds $(DEMO_SECONDS) --params $(DEMO_PARAMS) --model $(DEMO_MODEL) --json out/demo.json --png out/demo_timeline.png

test: $(STAMP)
	ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST $(VENV)/bin/python -m pytest test -q

clean:
	rm -rf $(VENV) models out build install log
