#!/usr/bin/env bash
# GPU readiness of every method's default config (lit_iclr/core/plan_devicecheck.py holds the checks).
#
#   scripts/gpu_check.sh [--steps 50] [--tolerance 0.1] [config ...]
#       On a GPU: each config (default: every configs/<m>.yaml) runs `--steps` steps with `--trainer.accelerator gpu
#       --trainer.precision bf16-mixed` and the same steps on the CPU in fp32 (same seed, same data order); their logged
#       loss curves (every 5 steps) must agree within the tolerance (mean |loss_gpu - loss_cpu| / mean |loss_cpu|,
#       default 0.1: bf16's 8-bit mantissa moves a 50-step curve by a few percent); prints samples/s on both and the
#       GPU's MFU (step FLOPs counted as `cli.py plan` counts them, over the device's peak bf16 rate).
#   scripts/gpu_check.sh --dry-run [--steps 4] [config ...]
#       On the CPU, no GPU needed: no CPU-only kernel outside core/onednn_linear.py (which falls back to F.linear off the
#       CPU), and the host syncs (.item(), .cpu(), .tolist(), numpy, bool(t), value-dependent shapes) the project's code
#       makes in each training step, counted over `--steps` batches of each config's tiny twin (tests/configs/<m>.yaml;
#       default: every default config that has one). Fails if a step syncs more than --max-syncs times (default 0).
# Results also go to runs/gpu_check/results.json. Exit status 1 when any config fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

dry=0; steps=""; args=(); configs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --steps) steps=$2; shift ;;
    --tolerance|--max-syncs|--run-dir) args+=("$1" "$2"); shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) configs+=("$1") ;;
  esac
  shift
done

# the default configs: configs/<m>.yaml (not the trainer overlays nor configs/paper/)
defaults() { for c in configs/*.yaml; do echo "$c"; done; }

if [ "$dry" = 1 ]; then
  if [ ${#configs[@]} -eq 0 ]; then
    while read -r c; do
      twin="tests/configs/$(basename "$c")"
      [ -f "$twin" ] && configs+=("$twin")
    done < <(defaults)
  fi
  "$PY" -m lit_iclr.core.plan_devicecheck kernels
  exec "$PY" -m lit_iclr.core.plan_devicecheck dry-run "${configs[@]}" --steps "${steps:-4}" \
    --json runs/gpu_check/dry_run.json "${args[@]}"
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check.sh: no CUDA device visible (run with --dry-run on the CPU)" >&2
  exit 2
fi
[ ${#configs[@]} -eq 0 ] && mapfile -t configs < <(defaults)
mkdir -p runs/gpu_check
exec "$PY" -m lit_iclr.core.plan_devicecheck compare "${configs[@]}" --steps "${steps:-50}" \
  --json runs/gpu_check/results.json "${args[@]}"
