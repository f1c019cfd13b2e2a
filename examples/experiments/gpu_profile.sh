#!/usr/bin/env bash
# Cost tables of the shipped target configs on cuda:0 and of the embedded sidecar config on cuda:1 (cuda:0
# with one GPU), then the projection of a committed CPU bench run's acceptance traces with each (#17).
#
#   examples/experiments/gpu_profile.sh                      # about 3-5 minutes on one H100/H200-class GPU
#   RESULTS=bench-out/validate/results.json examples/experiments/gpu_profile.sh
#
# Needs: one or two CUDA GPUs, torch and transformers 5.x, and this package's core imports (jsonschema:
# `import oospec_agents` loads the engine). No weights, no model files, no network: every model is built
# from a shipped config (oospec_agents/configs/) with random weights. Qwen3-32B in bf16 needs ~66 GB of
# GPU memory; on a smaller GPU its profile fails and the others go on.
# Environment (all optional): OUT=bench-out/gpu-profile  DTYPE=bfloat16  K=1,2,4,8,16,32,48,64
#   CONTEXT=256,1024,4096  CONFIGS="qwen3-8b llama-3.1-8b qwen2.5-7b qwen3-32b"
#   RESULTS=docs/reports/bench-validate-60-results.json  (a results.json of `oospec bench` with acceptance traces)
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-bench-out/gpu-profile}
DTYPE=${DTYPE:-bfloat16}
K=${K:-1,2,4,8,16,32,48,64}
CONTEXT=${CONTEXT:-256,1024,4096}
CONFIGS=${CONFIGS:-qwen3-8b llama-3.1-8b qwen2.5-7b qwen3-32b}
RESULTS=${RESULTS:-docs/reports/bench-validate-60-results.json}

NGPU=$("$PYTHON" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)") || NGPU=0
if (( NGPU == 0 )); then
  echo "gpu_profile.sh: no CUDA GPU visible to $PYTHON" >&2; exit 1
fi
if ! err=$("$PYTHON" -c "import oospec_agents.costmodel.profile, oospec_agents.verify" 2>&1); then
  echo "gpu_profile.sh: this package does not import with $PYTHON: ${err##*$'\n'}" >&2
  echo "  it needs torch, transformers>=5.17 and the core dependencies in pyproject.toml (jsonschema, ...)" >&2
  exit 1
fi
SIDECAR_DEVICE=$( (( NGPU >= 2 )) && echo cuda:1 || echo cuda:0 )
mkdir -p "$OUT"
echo "GPUs: $NGPU ($("$PYTHON" -c "import torch; print(', '.join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"))"
SECONDS=0
failed=()
profile() {  # NAME DEVICE
  echo "== profile $1 on $2 ($DTYPE) [${SECONDS}s]"
  "$PYTHON" -m oospec_agents.cli profile --config "$1" --device "$2" --dtype "$DTYPE" --k "$K" \
    --context "$CONTEXT" --out "$OUT/cost-$1.json" || failed+=("$1")
}
profile embedded "$SIDECAR_DEVICE"
for name in $CONFIGS; do profile "$name" cuda:0; done

if [[ ! -f "$RESULTS" ]]; then
  echo "no $RESULTS: profiles only. Project later with" >&2
  echo "  oospec project --results RESULTS.json --cost $OUT/cost-NAME.json --sidecar-cost $OUT/cost-embedded.json" >&2
else
  for name in embedded $CONFIGS; do
    [[ -f "$OUT/cost-$name.json" ]] || continue
    echo "== project $RESULTS with $name [${SECONDS}s]"
    "$PYTHON" -m oospec_agents.cli project --results "$RESULTS" --cost "$OUT/cost-$name.json" \
      --sidecar-cost "$OUT/cost-embedded.json" --out "$OUT/projection-$name.md" --quiet || failed+=("project:$name")
  done
  # one line per target: the headline figures of each projection
  "$PYTHON" - "$OUT" embedded $CONFIGS <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("\nPROJECTION from CPU acceptance traces (not a measurement): decode / e2e speedup over ar")
for name in sys.argv[2:]:
    f = out / f"projection-{name}.json"
    if f.exists():
        p = json.loads(f.read_text())
        figs = ", ".join(f"{m} {v['speedup_decode']:.2f}x / {v['speedup_e2e']:.2f}x" for m, v in p["methods"].items() if m != "ar")
        s = p.get("sidecar") or {}
        print(f"  {name:14s} {figs}; hints in time {s.get('in_time')}/{s.get('waves')}")
PY
fi
echo "done in ${SECONDS}s; files in $OUT"
if (( ${#failed[@]} )); then echo "failed: ${failed[*]}" >&2; exit 1; fi
