#!/usr/bin/env bash
# The checks only a CUDA machine can run, in one pass (a lent GPU's time is short): the CUDA tests, NCCL under
# torchrun (generation and training), GPU generation against the CPU's numbers, and the GPU figures of the
# generation and training benchmarks. Writes its logs and JSON records under $OUT (default ./device-out).
#
# Needs: a python3 with CUDA PyTorch, h5py, scipy, matplotlib, tqdm, jaxtyping, pytest; the rest (omegaconf,
# beartype, the benchmark peers) can come as wheels in .whl/ (installed with --no-deps into /tmp/site).
# neuraloperator imports wandb at import time and never calls it with logging off: a stand-in module is put on
# the path for the benchmark run only.
#
# The wheels used on 2026-11-26 (an H100 image with torch 2.11, jax 0.11.2, h5py, scipy, pytest already there),
# fetched here with `pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl NAME==VERSION`:
# omegaconf==2.4.0 beartype==0.23.1 exponax==0.2.0 neuraloperator==2.0.0 tensorly==0.10.0 tensorly-torch==0.5.0
# configmypy==0.2.0 ruamel.yaml==0.19.1 zencfg==1.0.0 (.whl/ is listed in .git/info/exclude).
#
#   OUT=/tmp/out bash scripts/device_checks.sh [tests,torchrun,same,randomcnn,generate,train]
# (GENERATE_SECONDS and TRAIN_SECONDS cap those two parts; each part writes what it finished.)
set -u
OUT=${OUT:-device-out}
PARTS=${1:-tests,torchrun,same,randomcnn,generate,train}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: wheel install failed"; exit 2; }
fi
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
part() { [[ ",$PARTS," == *",$1,"* ]]; }

{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1
  nproc
} 2>&1 | tee "$OUT/tests.log"

if part tests; then
  echo "== CUDA tests"
  timeout 150 python3 -m pytest -p no:cacheprovider -q -rs \
    tests/integration/test_cuda_paths.py tests/integration/test_two_phase_cuda.py \
    tests/integration/test_rollout_cuda_graph.py tests/unit/test_generation_device.py tests/unit/test_capture.py \
    tests/integration/test_store_layout.py tests/unit/test_precision_ema_checkpoint.py 2>&1 | tee -a "$OUT/tests.log" | tail -30
fi

if part torchrun; then
  echo "== torchrun (NCCL): generate on cuda:LOCAL_RANK, verify against the CPU, train on the GPU"
  work=$(mktemp -d)
  {
    timeout 90 torchrun --nproc-per-node=1 -m dynaforge.cli generate configs/tiny.yaml dataset.device=cuda \
      --out "$work/gpu-data" --no-progress && echo "generate rc 0"
    timeout 45 python3 -m dynaforge.cli verify "$work/gpu-data" --samples all --tolerance 1e-5 --json
    echo "verify rc $?"
    timeout 45 python3 -m dynaforge.cli verify "$work/gpu-data" --samples all --json
    echo "verify (identical bytes) rc $?"
    timeout 120 torchrun --nproc-per-node=1 -m dynaforge.cli train configs/tiny.yaml train.device=cuda \
      --data "$work/gpu-data" --out "$work/run" --no-progress && echo "train rc 0"
    grep -h -i -E "nccl|backend|world|rank" "$work"/run/*.log 2>/dev/null | head -5
    tail -2 "$work/run/metrics.jsonl"
  } 2>&1 | tee "$OUT/torchrun.log" | tail -40
fi

if part same; then
  echo "== same numbers on the GPU: a sample's trajectory whatever the batch; GPU against CPU"
  timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/same.log"
import math, torch
from dynaforge.config import load_config
from dynaforge.systems import build_system
import numpy as np
for name, extra in [("burgers", ["system.resolution=256"]), ("ks", []), ("navier_stokes", ["system.resolution=64"])]:
    system = build_system(load_config(None, [f"system.name={name}", "system.steps=50", "system.save_every=10", *extra]).system)
    params, initial = system.draw_samples([np.random.default_rng([7, i]) for i in range(300)])
    with torch.inference_mode():
        full = system.rollout(initial.cuda(), params.cuda()).fields.cpu()
        parts = [system.rollout(initial[s].cuda(), params[s].cuda()).fields.cpu() for s in (slice(0, 1), slice(1, 8), slice(8, 300))]
        cpu = system.rollout(initial, params).fields
    same = torch.equal(full, torch.cat(parts))
    rel = ((full - cpu).abs().max() / cpu.abs().max()).item()
    print(f"{name}: batch 300 vs 1+7+292 on the GPU identical: {same}; max |GPU - CPU| / max |CPU| = {rel:.2e}; block {system.block_samples(torch.device('cuda'))}")
PY
fi

if part randomcnn; then
  echo "== random CNN on the GPU against the straightforward loop on the same GPU"
  # Two architectures (few-architectures space): the fused engine compiles once per architecture.
  timeout "${RANDOM_CNN_SECONDS:-180}" python3 benchmarks/generate_random_cnn.py --device cuda --space few-architectures \
    --operators 64 --steps 64 --resolution 128 --repeats 3 --out "$OUT/generate_random_cnn.gpu.json" 2>&1 \
    | tee "$OUT/random_cnn.log" | tail -8
fi

if part generate; then
  echo "== generate_pde on the GPU (dynaforge on torch cuda, exponax on jax's GPU; --fused: system.fused too)"
  # The fused step compiles its stages once per case (its first call, reported apart); the file is written
  # after every case, so a run cut by the timeout keeps the cases it finished.
  timeout "${GENERATE_SECONDS:-300}" python3 benchmarks/generate_pde.py --device cuda --samples-scale 16 --repeats 3 \
    --fused --out "$OUT/generate_pde.gpu.json" 2>&1 | tee "$OUT/generate_pde.log" \
    | grep -E "ratio|batched|Error|error|eager|fused" | tail -60
fi

if part train; then
  echo "== train_fno on the GPU"
  stub=$(mktemp -d); mkdir -p "$stub/wandb"; echo '"""stand-in: neuralop imports wandb; logging is off."""' >"$stub/wandb/__init__.py"
  # The eager and captured variants (the compiled ones spend their first minute compiling: not in a
  # 15-minute lease).
  PYTHONPATH="$PYTHONPATH:$stub" timeout "${TRAIN_SECONDS:-220}" python3 benchmarks/train_fno.py --device cuda \
    --repeats 1 --variants "dynaforge eager fp32;dynaforge eager bf16;dynaforge eager fp32, CUDA graph;dynaforge eager bf16, CUDA graph;dynaforge eager fp16" \
    --out "$OUT/train_fno.gpu.json" 2>&1 | tee "$OUT/train_fno.log" | tail -30
fi
ls -la "$OUT"
