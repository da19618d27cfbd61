#!/usr/bin/env bash
# Issue 37's prepared GPU check: one command for a lent H200 (about 8 minutes), its figures under $OUT.
#
#   bash scripts/gpu-lend.sh prepare      # here, with the package registries: the wheels the device lacks
#                                         # (.whl/) and the parts of ../shared the rows read (.lend-shared/)
#   bash scripts/gpu-lend.sh run 6 1      # there, carrying .whl and .lend-shared: those rows below, each
#                                         # with its own time limit (these two: at most 450 s, one device
#                                         # call), into $OUT/gpu-check.md and $OUT/rows-N.json; then, with
#                                         # the time left, `run 4` (at most 300 s), then `run 2 3`, `run 5`.
#                                         # A lend is 15 minutes of device time in all, start-up included:
#                                         # the first call holds the two targets never or barely measured
#   sentemb plan-check rows-N.json        # back here: the plan's price of every step measured
#
# The rows (docs/gpu/h200-2026-11-28c.md, "For the next lend"); run 6 first (its target was never measured),
# then 1 (both targets within 1% of their line), then 4 (not met, measured before the attention change):
#   1. the defaults and `update: graphed`, SimCSE BERT-base B 64 and B 512, compiled and graphed
#      (targets: B 64 <= 10 ms, B 512 >= 35% of peak)
#   2. ArcCSE's paper step, seven first-steps rows each in its own process (the steps that met no new
#      shape recorded: its first steady row for plan-check)
#   3. the STS-B dev evaluation as the loop runs it (the plan's DEV_EVAL_SECONDS are an older row's)
#   4. counter masks at B 512 compiled and graphed, outside the compiled code and traced with it,
#      whole and in chunks of 128 (target: chunks <= 1.5x)
#   5. where the chunked step's time goes (profile)
#   6. RoBERTa-large compiled and graphed at B 512 (target: >= 45% of peak), 200 s
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}

if [ "$mode" = prepare ]; then
  shared=${2:-../shared}
  rm -rf .lend-shared && mkdir -p .lend-shared/models/all-MiniLM-L6-v2 .lend-shared/data/senteval/STS \
    .lend-shared/nltk_data/corpora
  for f in config.json tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt; do
    cp "$shared/models/all-MiniLM-L6-v2/$f" .lend-shared/models/all-MiniLM-L6-v2/
  done
  cp "$shared/data/wiki1m_head.txt" .lend-shared/data/
  cp -r "$shared/data/senteval/STS/STSBenchmark" .lend-shared/data/senteval/STS/
  cp -r "$shared/nltk_data/corpora/stopwords" .lend-shared/nltk_data/corpora/
  rm -rf .whl && mkdir -p .whl
  for p in nltk rake-nltk jsonschema jsonschema-specifications referencing rpds-py; do  # the device has the rest
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "$p" || echo "warning: no wheel for $p" >&2
  done
  du -sh .whl .lend-shared
  exit 0
fi

[ "$mode" = run ] || { echo "usage: bash scripts/gpu-lend.sh prepare [SHARED] | run [ROW ...]" >&2; exit 2; }
shift
wanted=" ${*:-1 2 3 4 5 6} "
OUT=${OUT:-/tmp/sentemb-gpu-lend}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SENTEMB_SHARED="$PWD/.lend-shared"
export NLTK_DATA="$PWD/.lend-shared/nltk_data"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu-check.md"
git log -1 --format='checkout %h %s' 2>/dev/null | tee -a "$OUT/gpu-check.md"

row() {  # row N SECONDS [VAR=value ...] -- gpu-check arguments
  local n=$1 limit=$2; shift 2
  case "$wanted" in *" $n "*) ;; *) return 0 ;; esac
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "## $n: ${envs[*]} sentemb gpu-check $*" | tee -a "$OUT/gpu-check.md"
  local t=$SECONDS
  env "${envs[@]}" timeout "$limit" python3 -m sentemb gpu-check --only-host --no-dag --no-epoch --shared .lend-shared \
    --rows-json "$OUT/rows-$n.json" "$@" 2>>"$OUT/stderr.log" | tee -a "$OUT/gpu-check.md"
  echo "(row $n: exit ${PIPESTATUS[0]}, $((SECONDS - t)) s)" | tee -a "$OUT/gpu-check.md"
}

# rows run in this order, whatever the order asked (row 6 first: its target was never measured)
row 6 200 SENTEMB_TUNE_BATCHES=512 SENTEMB_TUNE='[{}, {"update": "graphed"}]' -- --model roberta-large --host-parts tune --method simcse
row 1 250 SENTEMB_TUNE='[{}, {"update": "graphed"}]' -- --model bert-base-uncased --host-parts tune --method simcse
row 2 250 -- --model bert-base-uncased --host-parts first_steps --method arccse
row 3 90 -- --model bert-base-uncased --host-parts dev_eval --method simcse
row 4 300 SENTEMB_TUNE_BATCHES=512 SENTEMB_TUNE='[{"dropout_rng": "counter", "update": "fused"},
  {"dropout_rng": "counter", "update": "fused", "counter_kernel": "inline"},
  {"dropout_rng": "counter", "update": "fused", "chunk_size": 128},
  {"dropout_rng": "counter", "update": "fused", "counter_kernel": "inline", "chunk_size": 128}]' \
  -- --model bert-base-uncased --host-parts tune --method simcse
row 5 300 SENTEMB_PROFILE='[{"dropout_rng": "counter", "update": "fused"},
  {"dropout_rng": "counter", "update": "fused", "chunk_size": 128},
  {"dropout_rng": "counter", "update": "fused", "counter_kernel": "inline"},
  {"dropout_rng": "counter", "update": "fused", "counter_kernel": "inline", "chunk_size": 128}]' \
  -- --model bert-base-uncased --host-parts profile --method simcse
echo "done: $OUT/gpu-check.md, $OUT/rows-*.json (sentemb plan-check each)" | tee -a "$OUT/gpu-check.md"
