#!/bin/bash
# The GPU check (issue #29), on the lent GPU machine, with .gpu-bundle carried
# (tests/gpu/bundle.sh made it here). A few minutes; prints everything and
# writes it to $OUT/gpu-checks.log. See tests/gpu/README.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/.gpu-bundle/lib PYTHONUNBUFFERED=1
bin=$PWD/.gpu-bundle/bin/spotvisor
py=${PYTHON:-python3}
out=${OUT:-/tmp/gpu-checks}
mkdir -p "$out"
checks() {
  local status=0
  nvidia-smi -L
  "$bin" --version
  "$py" -c 'import torch, transformers, lightning; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
"transformers", transformers.__version__, "lightning", lightning.__version__)'
  # Real Hugging Face Trainer and Lightning under spotvisor, preempted at random
  # steps with and without the helper, resumed on a second "VM" by the
  # framework's own resume-from-latest.
  "$py" bench/preempt_cost.py --runs 3 --frameworks hf lightning --save-every 20 --step-time 0.05 \
      --size 16777216 --spotvisor "$bin" --trainer tests/gpu/real_trainers.py --python "$py" || status=1
  # Idle detection through the real NVML.
  "$py" tests/gpu/nvml_idle.py --spotvisor "$bin" || status=1
  return $status
}
checks 2>&1 | tee "$out/gpu-checks.log"
exit "${PIPESTATUS[0]}"
