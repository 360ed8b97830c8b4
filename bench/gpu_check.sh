#!/usr/bin/env bash
# One-GPU checks for a lent GPU machine (not part of make test; docs/pytorch.md "On a GPU" records what they showed).
# Runs with whatever python3 holds a CUDA torch there; writes its log to ${OUT:-/tmp}/gpu_check.log.
# 1. the digits hooks on CUDA (DDP over nccl, the GPU's loader defaults), 2. the GPT hooks on CUDA with and without
# --bf16 (one GPU is one rank: FSDP needs two GPUs, nccl refuses two ranks on one device), 3. SIGTERM to a GPU job's
# whole process group with loader workers (pinned memory): the step is committed and the job exits 143, 4. the restart
# resumes from it, 5. the suite's GPU tests (marker gpu) and its preemption test with loader workers, on the GPU.
# Steps 6-9 (issue #58; docs/benchmarks.md "On a GPU" and docs/fabric.md "On a GPU" record what they showed) each
# write a JSON of their figures to $OUT: 6. `doctor` (doctor.json: its report and seconds), 7. the fabric step against a real NCCL
# (fabric.json: a stray NCCL_NET=gIB with --fabric off and with the default, a plain node, a fake TCPXO tree sourced;
# bench/nccl_probe.py all-reduces over nccl in each), 8. the sharded asynchronous checkpoint with CUDA tensors
# (ckpt.json: bench/sharded_ckpt.py --device cuda; preempt.json: SIGTERM to a GPU job's group while a save is written,
# then its restart), 9. MFU (mfu.json: bench/gpu_mfu.py, the entrypoint's loop beside a hand-written one, compiled and
# eager), 10. --compile's cache: the same job run again on a fresh disk loads it (the ledger's start-up of both
# attempts). Every step runs under its own `timeout`; without a GPU (CUDA) the same steps run small on CPU, to test them.
# DEADLINE (seconds since the epoch) bounds step 9, which runs last and writes its JSON after each variant;
# MFU_ONLY=1,4 runs only those of its variants, PREEMPT=0 leaves out step 8's SIGTERM and restart.
# Run from the checkout's root (PYTHONPATH set to it). STEPS="5" (say) runs only those steps; the default is all.
set -u
STEPS=${STEPS:-"1 2 3 4 5 6 7 8 9 10"}
OUT=${OUT:-/tmp}
LOG=$OUT/gpu_check.log
J=$(mktemp -d)
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$J/inductor}
exec > >(tee "$LOG") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
GPT=(--framework pytorch --module tests.pytorch.sharded_hooks --log-every 10 --checkpoint-every 10)
if python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then GPU=1; else GPU=0; fi
step "the machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi | grep -m 1 "CUDA Version"
timeout 60 python3 - "$OUT/machine.json" <<'PY'
import json, os, platform, shutil, subprocess, sys, torch
found = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
         "cpus": os.cpu_count(), "kernel": platform.release(), "cc": shutil.which("cc"), "gpu": torch.cuda.is_available()}
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    found.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1), sms=props.multi_processor_count,
                 nccl=".".join(map(str, torch.cuda.nccl.version())), capability=list(torch.cuda.get_device_capability()))
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    found["nvidia_smi"] = smi
try:
    import triton
    found["triton"] = triton.__version__
except ImportError:
    pass
print(found)
open(sys.argv[1], "w").write(json.dumps(found, indent=1))
PY
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
step "6. doctor on this node: what it reports and how long it takes"
python3 - "$OUT/doctor.json" "$J/doctor" <<'PY'
import json, os, subprocess, sys, time
found = {}
for name, extra, env in (("plain", [], {}), ("json", ["--json"], {}), ("stray NCCL_NET=gIB", [], {"NCCL_NET": "gIB"})):
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "entrypoint", "doctor", "--framework", "pytorch", "--job-dir",
                           sys.argv[2], *extra], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    found[name] = {"seconds": round(time.perf_counter() - started, 2), "exit": proc.returncode,
                   "stdout": proc.stdout[-6000:], "stderr": proc.stderr[-2000:]}
    print(f"--- doctor {' '.join(extra)} {env or ''}: exit {proc.returncode} in {found[name]['seconds']} s")
    print(proc.stdout[-3000:] if name != "json" else "(json in doctor.json)", proc.stderr[-1000:])
open(sys.argv[1], "w").write(json.dumps(found, indent=1))
PY
fi
if want 7; then
step "7. the fabric step against NCCL: a stray NCCL_NET=gIB (off, default), a plain node, a fake TCPXO tree"
probe() {  # name, then the entrypoint's flags; its environment as given
  local name=$1; shift
  timeout 90 python3 -m entrypoint run --framework pytorch --job-dir "$J/fab-$name" --timeout 60 "$@" \
    --script bench/nccl_probe.py -- "$J/fab-$name.json" > "$J/fab-$name.log" 2>&1
  echo $? > "$J/fab-$name.exit"
}
NCCL_DEBUG=WARN NCCL_NET=gIB probe stray-off --fabric off & P1=$!
NCCL_DEBUG=WARN NCCL_NET=gIB probe stray-auto & P2=$!
NCCL_DEBUG=WARN probe plain & P3=$!
wait $P1 $P2 $P3  # these three (a bare wait would wait for the log's tee too)
# The fake tree at its real paths on a GPU machine (root, a bare machine given back afterwards; removed below before
# anything else runs), under a directory of its own elsewhere (TRAINER_FABRIC_ROOT, as the unit tests do).
ROOT=$J/root; [ "$GPU" = 1 ] && [ "$(id -u)" = 0 ] && [ ! -e /usr/local/nccl-plugin ] && ROOT=/
python3 -c "import sys; from pathlib import Path; from tests import fabric_trees; fabric_trees.build(Path(sys.argv[1]), 'a3mega-gke')" "$ROOT"
NCCL_DEBUG=WARN TRAINER_FABRIC_ROOT=$ROOT probe tcpxo
[ "$ROOT" = / ] && rm -rf /usr/local/nccl-plugin /dev/aperture_devices
python3 - "$OUT/fabric.json" "$J" <<'PY'
import json, sys
from pathlib import Path
j, found = Path(sys.argv[2]), {}
for name in ("stray-off", "stray-auto", "plain", "tcpxo"):
    log = (j / f"fab-{name}.log").read_text(errors="replace") if (j / f"fab-{name}.log").exists() else ""
    lines = log.splitlines()
    probe = j / f"fab-{name}.json"
    found[name] = {"exit": int((j / f"fab-{name}.exit").read_text()), "last_line": lines[-1] if lines else "",
                   "fabric_lines": [l for l in lines if "fabric" in l][:12],
                   "nccl_lines": [l for l in lines if "NCCL" in l and ("WARN" in l or "error" in l.lower())][:12],
                   "probe": json.loads(probe.read_text()) if probe.exists() else None}
    print(f"--- {name}: exit {found[name]['exit']}; all-reduce ok: {(found[name]['probe'] or {}).get('ok')}")
    print("\n".join(found[name]["fabric_lines"] + found[name]["nccl_lines"][:6] + [found[name]["last_line"]]))
open(sys.argv[1], "w").write(json.dumps(found, indent=1))
PY
fi
if want 8; then
step "8. the sharded asynchronous checkpoint with CUDA tensors: blocked vs written, then SIGTERM mid-save"
if [ "$GPU" = 1 ]; then CK=(--device cuda --config 100m --repeats 2 --warmup 1); PRE=100m; else
  CK=(--device cpu --config tiny --repeats 1 --warmup 0); PRE=tiny; fi
timeout 120 python3 -m entrypoint run --framework pytorch --script bench/sharded_ckpt.py --nproc-per-node 1 \
  --job-dir "$J/ck" -- "${CK[@]}" --verify --dir "$J/ckpts" --result "$OUT/ckpt.json" 2>&1 | tail -n 5
echo "exit ${PIPESTATUS[0]}"
python3 -c "
import json, statistics, sys
r = json.load(open(sys.argv[1]))
print(r['device_name'], r['params'], 'parameters, verified:', r['verified'])
for kind, pairs in r['seconds'].items():
    runs = pairs[r['warmup']:]
    print(f'{kind}: blocked {statistics.median(b for b, _ in runs):.4f} s, written {statistics.median(w for _, w in runs):.3f} s,'
          f' blocked/written {statistics.median(b / w for b, w in runs if w):.4f}')
" "$OUT/ckpt.json"
if [ "${PREEMPT:-1}" = 1 ]; then
# A GPU job stopped while a save is written: SIGTERM to its whole group (as tini -g delivers a preemption) at the first
# progress line after a checkpoint was handed to the background writer; then the restart. PREEMPT=0 skips it.
HOOKS=(--framework pytorch --module bench.gpt_hooks --strategy fsdp --bf16 --job-dir "$J/pre" --batch-size 8
       --checkpoint-every 20 -- --config $PRE --steps 120 --batch 8 --warmup 0)
setsid python3 -m entrypoint run --log-every 1 "${HOOKS[@]}" > "$J/pre.log" 2>&1 &
PID=$!
(sleep 100; kill -KILL -- "-$PID") 2>/dev/null &  # a watchdog, in place of timeout (which would signal twice)
WATCHDOG=$!
for _ in $(seq 1 1200); do grep -q "step 2[1-9]/" "$J/pre.log" && break; sleep 0.1; done
kill -TERM -- "-$PID"; wait "$PID"; echo "exit $? (143 expected)" | tee "$J/pre.exit"
kill "$WATCHDOG" 2>/dev/null
ls "$J/pre/checkpoints" > "$J/pre.ls"  # what the stop committed (the restart's own saves replace them)
timeout 100 python3 -m entrypoint run --log-every 1000 "${HOOKS[@]}" > "$J/pre2.log" 2>&1; echo "restart exit $?" | tee "$J/pre2.exit"
python3 - "$OUT/preempt.json" "$J" <<'PY'
import json, sys
from pathlib import Path
from entrypoint.outputs import checkpoints
j = Path(sys.argv[2])
first, second = (j / "pre.log").read_text(errors="replace"), (j / "pre2.log").read_text(errors="replace")
found = {"exit": (j / "pre.exit").read_text().split()[1], "restart_exit": (j / "pre2.exit").read_text().split()[2],
         "last_line": first.splitlines()[-1] if first else "", "restart_last_line": second.splitlines()[-1] if second else "",
         "strategy": [l for l in first.splitlines() if "strategy" in l][:2],
         "checkpoint_lines": [l for l in first.splitlines() if "checkpoint" in l or "SIGTERM" in l][-8:],
         "resumed": [l for l in second.splitlines() if "resumed from" in l][:2],
         "after_stop": (j / "pre.ls").read_text().split(),
         "committed": [s for s, _ in checkpoints.committed(j / "pre" / "checkpoints", warn=False)]}
print(json.dumps(found, indent=1))
open(sys.argv[1], "w").write(json.dumps(found, indent=1))
PY
fi
fi
if want 9; then
step "9. model FLOPs utilisation: the entrypoint's loop beside a hand-written loop, compiled and eager"
if [ "$GPU" = 1 ]; then MFU=(--config 700m --steps 40 --warmup 10 --batch 8 --timeout 150); else
  MFU=(--config tiny --steps 6 --warmup 2 --batch 2 --timeout 300); fi
LEFT=$(( ${DEADLINE:-$(( $(date +%s) + 335 ))} - $(date +%s) - 5 ))
echo "$LEFT s left for it"
timeout "$LEFT" python3 -m bench.gpu_mfu "${MFU[@]}" ${MFU_ONLY:+--only "$MFU_ONLY"} --out "$OUT/mfu.json"
echo "exit $?"
fi
if want 10; then
step "10. --compile: the first run compiles, a rerun on a fresh disk (TMPDIR, TRITON_HOME) loads the job's cache, a third
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
