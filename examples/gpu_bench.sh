#!/usr/bin/env bash
# Benchmark on one or two CUDA GPUs and print the report.
#
#   examples/gpu_bench.sh                                  # the embedded pair on one GPU
#   examples/gpu_bench.sh /models/Qwen3-8B /models/qwen3-sidecar   # any HF target + sidecar, local dirs
#   examples/gpu_bench.sh Qwen/Qwen3-8B SIDECAR -- --limit 20       # extra args go to `oospec bench`
#
# Two or more GPUs: the target on cuda:0, the sidecar on cuda:1. One GPU: both on cuda:0.
# Environment (all optional):
#   DATA=FILE.jsonl   records (default: ../shared/data/toolcalls/dev.jsonl)   BFCL=DIR   BFCL's own data dir instead
#   LIMIT=60  OUT=bench-out/gpu  DTYPE=bfloat16  MAX_NEW_TOKENS=256  PYTHON=python
#   METHODS=...       default: all seven; `assisted` only when a draft model is known
#   ASSISTANT=REF     draft model for `assisted` sharing the target's tokenizer (e.g. /models/Qwen3-0.6B);
#                     with the embedded target it defaults to the embedded base model.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${1:-embedded}
SIDECAR=${2:-}
shift $(( $# < 2 ? $# : 2 ))
[[ "${1:-}" == "--" ]] && shift
PYTHON=${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}

NGPU=$("$PYTHON" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if (( NGPU == 0 )); then
  echo "gpu_bench.sh: no CUDA GPU visible to $PYTHON (torch.cuda.device_count() == 0)" >&2
  exit 1
fi
SIDECAR_DEVICE=$( (( NGPU >= 2 )) && echo cuda:1 || echo cuda:0 )

# Local directories need no hub: stay offline so a typo fails fast instead of trying a download.
for ref in "$TARGET" "$SIDECAR" "${ASSISTANT:-}"; do
  if [[ -n "$ref" && -d "$ref" ]]; then export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1; fi
done

METHODS=${METHODS:-ar,hf_generate,prompt_lookup,assisted,toolspec,oospec,oracle}
if [[ "$TARGET" != embedded && -z "${ASSISTANT:-}" && ! -f "$SIDECAR/config.json" ]]; then
  echo "gpu_bench.sh: no draft model for 'assisted' (set ASSISTANT=...); running without it" >&2
  METHODS=$(echo "$METHODS" | sed -E 's/(^|,)assisted(,|$)/\1/; s/,$//; s/,,/,/')
fi

if [[ -n "${BFCL:-}" ]]; then SRC=(--bfcl "$BFCL"); else SRC=(--data "${DATA:-../shared/data/toolcalls/dev.jsonl}"); fi
ARGS=(bench "${SRC[@]}" --limit "${LIMIT:-60}" --methods "$METHODS" --out "${OUT:-bench-out/gpu}"
      --target "$TARGET" --target-device cuda:0 --sidecar-device "$SIDECAR_DEVICE"
      --max-new-tokens "${MAX_NEW_TOKENS:-256}")
[[ -n "$SIDECAR" ]] && ARGS+=(--sidecar "$SIDECAR")
[[ -n "${ASSISTANT:-}" ]] && ARGS+=(--assistant "$ASSISTANT")
[[ -n "${DTYPE:-}" ]] && ARGS+=(--dtype "$DTYPE")

echo "GPUs: $NGPU ($("$PYTHON" -c "import torch; print(', '.join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"))"
echo "target $TARGET on cuda:0, sidecar ${SIDECAR:-(engine default)} on $SIDECAR_DEVICE"
exec "$PYTHON" -m oospec_agents.cli "${ARGS[@]}" "$@"
