# The two commands of the README. Both start from nothing: the first run
# creates .venv (scripts/bootstrap.sh) and the default model.
VENV   := .venv
STAMP  := $(VENV)/.installed
VLA    := $(VENV)/bin/vla-edge
DEMO_SECONDS ?= 20
# CPU machines run the demo with a smaller KV cache: config/cpu_demo.yaml says why.
DEMO_PARAMS ?= config/cpu_demo.yaml

.PHONY: demo test venv clean
venv: $(STAMP)

$(STAMP): requirements.txt setup.py scripts/bootstrap.sh
	bash scripts/bootstrap.sh

models/tiny/config.json: $(STAMP)
	$(VLA) make-model tiny --out models/tiny

demo: $(STAMP) models/tiny/config.json
	$(VLA) demo --seconds $(DEMO_SECONDS) --params $(DEMO_PARAMS) --json out/demo.json --png out/demo_timeline.png

test: $(STAMP)
	ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST $(VENV)/bin/python -m pytest test -q

clean:
	rm -rf $(VENV) models out build install log
