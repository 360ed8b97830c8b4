#!/usr/bin/env bash
# One-GPU checks for a lent GPU machine (not part of make test; docs/pytorch.md "On a GPU" records what they showed).
# Runs with whatever python3 holds a CUDA torch there; writes its log to ${OUT:-/tmp}/gpu_check.log.
# 1. the digits hooks on CUDA (DDP over nccl, the GPU's loader defaults), 2. the GPT hooks on CUDA with and without
# --bf16 (one GPU is one rank: FSDP needs two GPUs, nccl refuses two ranks on one device), 3. SIGTERM to a GPU job's
# whole process group with loader workers (pinned memory): the step is committed and the job exits 143, 4. the restart
# resumes from it, 5. the suite's GPU tests (marker gpu) and its preemption test with loader workers, on the GPU,
# 6. --compile's cache: the same job run again on a fresh disk loads it (the ledger's start-up of both attempts).
# STEPS="5" (say) runs only those steps.
set -u
STEPS=${STEPS:-"1 2 3 4 5 6"}
LOG=${OUT:-/tmp}/gpu_check.log
J=$(mktemp -d)
export PYTHONUNBUFFERED=1
exec > >(tee "$LOG") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
GPT=(--framework pytorch --module tests.pytorch.sharded_hooks --log-every 10 --checkpoint-every 10)
step "the machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
if want 1; then
step "1. digits on CUDA: DDP over nccl"
timeout 180 python3 -m entrypoint run --framework pytorch --module trainers.digits_torch --job-dir "$J/ddp" \
  --epochs 3 --log-every 20; echo "exit $?"
python3 -c "import json; s = json.load(open('$J/ddp/model/training_summary.json')); \
print({k: s.get(k) for k in ('strategy', 'world_size', 'final_step', 'metrics', 'device', 'backend')})"
fi
if want 2; then
step "2. the GPT hooks on CUDA, fp32 then --bf16 (one GPU: world 1)"
for bf16 in "" --bf16; do
  timeout 200 python3 -m entrypoint run "${GPT[@]}" $bf16 --epochs 1 --job-dir "$J/gpt$bf16" \
    -- --width 512 --layers 6 --heads 8 --block 128 --windows 8192 2>&1 | grep -E "strategy|samples/s|exported" | tail -n 4
  python3 -c "import json; s = json.load(open('$J/gpt$bf16/model/training_summary.json')); \
print({k: s.get(k) for k in ('strategy', 'world_size', 'final_step', 'device', 'backend', 'samples_per_second')})"
done
fi
if want 3; then
step "3. SIGTERM to the whole process group, 2 loader workers, pinned memory"
setsid python3 -m entrypoint run --framework pytorch --module tests.pytorch.faults --job-dir "$J/pre" --log-every 2 \
  --data-workers 2 --epochs 2 -- --step-sleep 0.05 > "$J/pre.log" 2>&1 &
PID=$!
for _ in $(seq 1 240); do grep -q "step 1[0-9]/" "$J/pre.log" && break; sleep 0.5; done
kill -TERM -- "-$PID"; wait "$PID"; echo "exit $? (143 expected)"
grep -E "pin|worker|stopped by|preempted|killed by signal|error" "$J/pre.log" | tail -n 6
ls "$J/pre/checkpoints"
fi
if want 4; then
step "4. the restart resumes from the committed step"
timeout 180 python3 -m entrypoint run --framework pytorch --module tests.pytorch.faults --job-dir "$J/pre" \
  --log-every 50 --data-workers 2 --epochs 2 -- --step-sleep 0.05 2>&1 | grep -E "resumed|exported|error"; \
  echo "exit ${PIPESTATUS[0]} (0 expected)"
fi
if want 5; then
step "5. the suite's preemption tests with loader workers, on this GPU"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/pytorch 2>&1 | tail -n 8
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/pytorch/test_reseed.py \
  "tests/pytorch/test_real_jobs.py::test_sigterm_to_the_process_group_with_loader_workers_commits_the_step_and_exits_143" \
  2>&1 | tail -n 6
fi
if want 6; then
step "6. --compile: the first run compiles, a rerun on a fresh disk (TMPDIR, TRITON_HOME) loads the job's cache, a third
on a fresh disk without it (moved aside) compiles again; the ledger's start-up through the first step of each"
for epochs in 1 2 3; do
  disk=$(mktemp -d)
  [ "$epochs" = 3 ] && mv "$J/cc/compile_cache" "$J/kept"
  TMPDIR=$disk TRITON_HOME=$disk timeout 170 python3 -m entrypoint run "${GPT[@]}" --compile --bf16 --log-every 100 \
    --checkpoint-every 100 --epochs "$epochs" --job-dir "$J/cc" -- --width 512 --layers 6 --heads 8 --block 128 \
    --windows 2048 2>&1 | grep -E "compile cache|Error" | cut -c1-260; echo "run $epochs exit ${PIPESTATUS[0]}"
done
python3 -m entrypoint goodput "$J/cc" --json | python3 -c "import json, sys; \
print([(a['replica'], a['startup_seconds'], a['cause']) for a in json.load(sys.stdin)['attempts']])"
cat "$J"/kept/*.json
fi
step "done"
