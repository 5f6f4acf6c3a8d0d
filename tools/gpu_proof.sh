#!/usr/bin/env bash
# The device check of the GPU paths, as one short script (issue 12 item 6), run from the repo root on a
# machine with an NVIDIA GPU and torch: the real-NVML test, the CUDA-event timer test, then
# tools/gpu_proof.py (a traced single-GPU NCCL job, its records checked, then the declared watermarks
# of a traced GPU job), then tools/gpu_overhead.py (the tracer's cost, part by part; OVERHEAD_SECONDS=0
# skips it). Results go to $OUT
# (default /tmp/gpu-proof). Packages missing there (msgspec) travel as wheels in .whl/ (see the
# device tool's README); the repo is imported as `eroica` through a symlink, no install needed.
set -u
OUT=${OUT:-/tmp/gpu-proof}
SECONDS_RUN=${PROOF_SECONDS:-40}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/eroica
export PYTHONPATH=/tmp/pkgroot:$PYTHONPATH
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
  python3 -c "import torch, pynvml; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } 2>&1 | tee "$OUT/env.txt"
# --noconftest: the root conftest loads the Kafka/ClickHouse fixtures, which need packages this check does not
python3 -m pytest -q --noconftest -p no:cacheprovider -rs producers/counters/test_gpu.py \
  producers/tracer/test_torch_hooks.py::test_cuda_timer_resolves_events_against_an_anchor tests/test_gpu_proof.py \
  2>&1 | tee "$OUT/pytest.txt" | tail -8
PYTHONUNBUFFERED=1 timeout $((3 * SECONDS_RUN + 200)) python3 tools/gpu_proof.py --out /tmp/proof \
  --seconds "$SECONDS_RUN" --watermark-seconds "$SECONDS_RUN" >"$OUT/gpu_proof.txt" 2>&1
echo "gpu_proof rc=$?" >>"$OUT/gpu_proof.txt"
cp /tmp/proof/gpu_proof.json "$OUT/" 2>/dev/null
wc -l /tmp/proof/run.jsonl 2>/dev/null
tail -c 3000 "$OUT/gpu_proof.txt"
OVERHEAD_SECONDS=${OVERHEAD_SECONDS:-12}
if [ "$OVERHEAD_SECONDS" != 0 ]; then
  PYTHONUNBUFFERED=1 timeout $((8 * OVERHEAD_SECONDS + 200)) python3 tools/gpu_overhead.py --out /tmp/overhead \
    --seconds "$OVERHEAD_SECONDS" --micro >"$OUT/gpu_overhead.txt" 2>&1
  echo "gpu_overhead rc=$?" >>"$OUT/gpu_overhead.txt"
  tail -c 2500 "$OUT/gpu_overhead.txt"
fi
# the device tool brings back at most 8 files: the logs and the head of the records travel as one archive
head -c 4000000 /tmp/proof/run.jsonl >/tmp/proof/run_head.jsonl 2>/dev/null
tar czf "$OUT/logs.tgz" -C /tmp proof/run_head.jsonl proof/watermark_writes.json $(cd /tmp && ls proof/*.log overhead/*.json 2>/dev/null) 2>/dev/null
