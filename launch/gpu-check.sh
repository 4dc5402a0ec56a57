#!/usr/bin/env bash
# The one GPU check: proves the CUDA and NCCL paths in one short run (at most ~6 minutes on one GPU),
# on a machine with no network (torch, numba, safetensors, ml_dtypes preinstalled; tpload installed
# with --no-deps, or run from this checkout). Fixed sizes: the small preset for the tests, the medium
# preset (1.76 GB, written once under $TPLOAD_CACHE or ~/.cache/tpload) for the bench.
#
#   launch/gpu-check.sh                       every section
#   launch/gpu-check.sh --only tests,bench    some: tests (CUDA tests: exact windows on cuda:0, every
#                                             published family packed and expanded against ml_dtypes, device
#                                             decodes, a flipped byte), gguf (GGUF decodes on cuda:0 against
#                                             the numba kernel, and their speed), bench (tp = GPUs), peers (the bench
#                                             beside the CUDA-only peers: InstantTensor, and Run:ai Model
#                                             Streamer), multi (the NCCL world with the gloo exchange at tp =
#                                             GPUs, and a killed rank; skipped with the reason on one GPU),
#                                             replicas (2 replicas x tp 1 on 2 GPUs in the NCCL world: NCCL p2p
#                                             GB/s per rank (the interconnect), then the load, whose replicas'
#                                             bytes go over NCCL as device tensors, so its peer GB/s is an NCCL
#                                             figure; digests equal at each position, a byte changed in transit
#                                             on the NCCL wire, a killed replica ending in bounded time (the
#                                             wait's timeout, or NCCL's watchdog); skipped on one GPU:
#                                             launch/replicas_nccl.py), refresh (the verified refresh with
#                                             the trainer's weights on the GPU: the bench's ratio to a plain
#                                             broadcast, a tampered round's line and a killed trainer's, the
#                                             engine alive after each; the refresh's wire is tpload's own
#                                             authenticated TCP links on every device, never NCCL)
#   launch/gpu-check.sh --only scale          not in the default run (its own ~5 minutes): the bench on a
#                                             fixed ~16 GB checkpoint (the seed dimensions, 256 experts x 3
#                                             stages: 16.03 GB, written once into the cache) at tp = GPUs
#                                             (tp 4 x ep 2 on 8: 2304 channels do not cut in 8), with each
#                                             GPU's pinned host-to-device GB/s (the PCIe figure) beside the
#                                             per-rank load rates, and the device decode against a device copy
#                                             (the HBM figure)
#
# The peers' wheels travel with the checkout (the GPU machine has no network): on a machine with one,
#   pip download --no-deps -d launch/wheels instanttensor runai-model-streamer humanize
# fills launch/wheels/ (git-ignored); copy that folder along (the device tool: carry ["launch/wheels"]).
# The peers section installs them with --no-deps --no-index; a peer with no wheel and no install is
# skipped by the bench, which prints why (as it does for InstantTensor without CUDA).
# Exits non-zero if any section fails; prints one summary line per section at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
only="tests,gguf,bench,peers,multi,replicas,refresh"
if [[ "${1:-}" == "--only" ]]; then only="${2:?--only takes a comma-separated list}"; shift 2; fi
out="${GPU_CHECK_OUT:-gpu-check-out}"
mkdir -p "$out"
python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu-check: no CUDA device")' || exit 2
gpus=$(python -c 'import torch; print(torch.cuda.device_count())')
nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader || true
summary=()
section() {  # name, timeout seconds, command...
    local name=$1 limit=$2; shift 2
    [[ ",$only," == *",$name,"* ]] || return 0
    echo "== $name (at most ${limit} s)"
    local t0=$SECONDS
    if timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"; then
        summary+=("$name: ok ($((SECONDS - t0)) s)")
    else
        summary+=("$name: FAILED ($((SECONDS - t0)) s; see $out/$name.log)")
    fi
}
multi() {
    if (( gpus < 2 )); then echo "multi: skipped: one GPU (NCCL needs a GPU per rank)"; return 0; fi
    local ckpt
    ckpt=$(python -c 'from tpload.tools.synth import resolve_checkpoint; print(resolve_checkpoint(None))')
    torchrun --standalone --nproc-per-node "$gpus" -m tpload "$ckpt" --no-progress --report "$out/multi.json" || return 1
    # a killed rank: every other rank must stop naming it, in bounded time
    if timeout 120 torchrun --standalone --nproc-per-node "$gpus" tests/workers/kill.py "$ckpt" 1 3; then
        echo "multi: the killed rank's peers exited 0"; return 1
    fi
    return 0
}
section tests 240 python -m pytest -q -p no:cacheprovider tests/unit/transfer/test_cuda.py tests/unit/test_api.py \
    tests/unit/tools/test_families_device.py
# GGUF: the torch-op decodes on cuda:0 against the numba kernel, and the Q4_K decode's speed there
section gguf 120 bash -c "python -m pytest -q -p no:cacheprovider tests/unit/codecs/test_gguf.py && python launch/gguf-decode-speed.py --cuda"
section bench 300 python -m tpload bench --preset medium --nproc "$gpus" --tp "$gpus" --rounds 1 \
    --methods floor,tpload,tpload-digest,tpload-noverify,tpload-expanded,safetensors --json "$out/bench.json"
peers() {
    local wheels=(launch/wheels/*.whl)
    if [[ -e "${wheels[0]}" ]]; then
        python -m pip install --no-deps --no-index --quiet "${wheels[@]}" || { echo "peers: the wheels would not install"; return 1; }
    else
        echo "peers: no wheels under launch/wheels/; only peers already installed run"
    fi
    python -m tpload bench --preset medium --nproc "$gpus" --tp "$gpus" --rounds 1 --no-decode \
        --methods floor,tpload,safetensors,runai,instanttensor --json "$out/peers.json"
}
replicas() {  # 2 replicas share the reads: each window read once, sent to the other, checked on receipt
    if (( gpus < 2 )); then
        echo "replicas: skipped: one GPU (2 replicas x tp 1 over NCCL need a GPU per rank)"; return 0
    fi
    local ckpt dir t0
    ckpt=$(python -c 'from tpload.tools.synth import resolve_checkpoint; print(resolve_checkpoint(None))')
    # 2 replicas x tp 1 in the NCCL world: NCCL p2p GB/s per rank, the load's replica bytes over
    # NCCL (its peer GB/s), digests equal at each position
    torchrun --standalone --nproc-per-node 2 launch/replicas_nccl.py "$ckpt" "$out/replicas.json" || return 1
    dir=$(mktemp -d)  # rank 0 changes a byte of what it sends: every rank must fail naming it
    torchrun --standalone --nproc-per-node 2 tests/workers/replicas_corrupt.py "$ckpt" "$dir" 0 || return 1
    grep -q "changed in transit" "$dir/rank1.json" || { echo "replicas: a changed byte was not caught"; return 1; }
    # a replica killed mid-transfer (rank 1, --timeout 20): the other ends in bounded time, no weights
    dir=$(mktemp -d) t0=$SECONDS
    if timeout 90 torchrun --standalone --nproc-per-node 2 tests/workers/replicas_kill.py "$ckpt" "$dir" 1 20; then
        echo "replicas: the killed replica's peer exited 0"; return 1
    fi
    echo "replicas: killed replica: the launch ended in $((SECONDS - t0)) s (bound 90 s)"
    if (( SECONDS - t0 >= 90 )); then echo "replicas: not ended in bounded time"; return 1; fi
    grep -q '"returned": false' "$dir/rank0.json" || { echo "replicas: the survivor returned weights"; return 1; }
}
refresh() {  # the trainer's weights on cuda:0; windows cross in host memory (docs/refresh.md)
    python launch/refresh-bench.py --rounds 2 --device cuda --out "$out/refresh.json" || return 1
    python -m pytest -q -p no:cacheprovider tests/integration/test_refresh.py tests/slow/test_refresh.py \
        -m "slow or not slow" -rA 2>&1 | grep -E "passed|failed|refresh refused" | head -20
    return "${PIPESTATUS[0]}"
}
scale() {
    local ckpt="${TPLOAD_CACHE:-$HOME/.cache/tpload}/scale-16gb" tp=$(( gpus > 4 ? 4 : gpus ))
    if [[ ! -f "$ckpt/NATIVE_MANIFEST.json" ]]; then  # the manifest is written last: present means whole
        rm -rf "$ckpt" && python -m tpload synth "$ckpt" --preset seed --experts 256 --stages 3 >/dev/null || return 1
    fi
    python -m tpload bench --checkpoint "$ckpt" --nproc "$gpus" --tp "$tp" --rounds 1 \
        --methods floor,tpload,tpload-digest,tpload-expanded --json "$out/scale.json"
}
export -f multi peers scale replicas refresh
export gpus out
section peers 240 bash -c peers
section multi 150 bash -c multi
section replicas 300 bash -c replicas
section refresh 240 bash -c refresh
section scale 330 bash -c scale
printf '%s\n' "${summary[@]}"
[[ "${summary[*]}" != *FAILED* ]]
