#!/usr/bin/env bash
# llama-sparq on a borrowed GPU machine with no network and minutes, not hours: install the CUDA
# wheel built beforehand on a machine without a GPU (`make gpu-wheel`), then run the GPU tests and
# sweeps in steps short enough for one call each, keeping every log and result file. This usage is
# the GPU runbook (docs/cuda.md points here); run the script with no step to print it.
#
#   scripts/gpu_session.sh STEP [STEP ...]        (from the repository root, on the GPU machine)
#
# Before the call, here: `make gpu-wheel` (about 25 minutes on 2 cores with a cold ccache, a minute
# or two once built) writes build/gpu-wheel/ and its packed copy build/gpu-wheel-xz/wheel.tar.xz
# (about 48 MB); carry build/gpu-wheel-xz in every call, since each may get a fresh machine. A call
# carries at most 64 MiB beside the tracked tree and runs at most 10 minutes; `make gpu-gemma-parts`
# cuts Gemma 3 270M into 50 MB parts (build/gpu-gemma/) to carry one per call for the gemma step.
#
# Steps, in the order a short session should take them:
#   install   the wheels in build/gpu-wheel/ (unpacked first from build/gpu-wheel-xz/wheel.tar.xz
#             where the folder holds none) into $SPARQ_SITE (default /tmp/sparq-site), with pip
#             --no-index; nvidia-smi and the package's library check. Every other step runs it
#             first when $SPARQ_SITE lacks the package (a fresh machine).
#   grid      the SPARQ_ATTN grid of test-backend-ops on CUDA0 against the CPU op and the selectors
#             (tests/test_cuda.py without the ones that need Gemma 3 270M, and without the emulator
#             and graph-rebuild tests, which need no GPU)
#   timeline  bench/gpu.py timeline: Nsight Systems (nsys, or $NSYS) or, without it, the CUPTI tracer
#             built with the wheel, over llama-bench decode steps at $TIMELINE_DEPTHS (default 4K and
#             64K), traced with 4 and 20 steps (the difference cancels load and fill), dense -fa 1 and
#             SparQ: each kernel per layer, launches, copies, syncs, the GPU's idle time and whether
#             CUDA graphs captured the step (gpu_timeline_<tag>.md)
#   op        bench/gpu.py sweep --only op $OP_ARGS: the op against CUDA flash attention, with the
#             radix passes of the select and the one-block attend as A/B columns (OP_ARGS=
#             "--no-select-ab --no-attend-ab" leaves them out)
#   e2e       bench/gpu.py sweep --only e2e, batch 1 at $E2E_DEPTHS (default 0, 4K, 8K, 32K, 64K and
#             128K), dense -fa 1 and -fa 0 and SparQ, batch 4 at $E2E_DEPTHS_BATCH (default 16K, 32K)
#   ab        the batch-1 e2e rows at $AB_DEPTHS (default 8K, 64K) once per setting of $AB_ENVS
#             (';' between settings, each one or more LLAMA_SPARQ_CUDA_*=VALUE joined by ','; default:
#             LLAMA_SPARQ_CUDA_PDL=0 (the default kernels, the reference in the same session), then
#             LLAMA_SPARQ_CUDA_PDL=1, LLAMA_SPARQ_CUDA_SCORE_HIST=1, both, and
#             LLAMA_SPARQ_CUDA_SELECT_HIST=atomic, LLAMA_SPARQ_CUDA_SELECT_LOADS=early,
#             LLAMA_SPARQ_CUDA_ATTEND_ITEMS=16, LLAMA_SPARQ_CUDA_FUSED=1 (one launch per layer up to
#             16K cells, so give it AB_DEPTHS=4096,8192,16384 too), LLAMA_SPARQ_CUDA_CALIB_HIST=1 (the
#             grid's calibrated cases check it, its rows (a fixed k) equal the reference; calib times
#             it), each with dense beside it in the same run and tagged
#             <tag>_ab_<setting>: ways of the kernels timed without a rebuild. With AB_CHECK=1 (the
#             default) each setting first runs the SPARQ_ATTN grid of test-backend-ops on CUDA0 against
#             the CPU (as the grid step; log ab.log), so that a way is never timed unchecked; with
#             AB_TIMELINE=1 also the timeline step's trace per setting (tagged as the rows). The
#             programmatic launches (PDL) let a kernel start inside its predecessor's last blocks:
#             per-kernel times then include the wait, so compare the op's span or the rows. Then
#             the same rows once per count in $AB_BUCKETS (',' between them; default 1024, 8k at
#             k = 128; empty for none) with SparQ's approximate bucketed top-k (--topk-buckets, a
#             setting), tagged <tag>_ab_topk_buckets_<B> (the grid has bucketed cases of its own);
#             then once per K^T width in $AB_KT_BITS (default 4,8, each at its default r, --r 0; the
#             rows above run 8 bits at r = 32), tagged <tag>_ab_kt<bits>
#   calib     the calibrated k (--k 0, the window k_min / 4) at $CALIB_DEPTHS (default 64K), batch 1,
#             $CALIB_GEN tokens (default 64), once per setting of $CALIB_ENVS (as AB_ENVS; default
#             LLAMA_SPARQ_CUDA_CALIB_HIST=0: the default kernels; LLAMA_SPARQ_CUDA_CALIB_HIST=1, the
#             calibrated k's histogram from the score tiles), each with dense -fa 1 beside it in the
#             same run and tagged <tag>_calib_<setting> (calib_hist_0, calib_hist_1); each row keeps
#             the fork's counters (SparQ and dense calls, the calls the op reported)
#   nkvo      the -nkvo runs (weights on the GPU, cache and attention on the host) at $NKVO_DEPTHS
#             (default 16K, 64K)
#   profile   Nsight Compute (ncu, or $NCU) on the op's kernels at 64K and 4K (Llama 2 7B attention,
#             batch 1, r = 32, k = 128), on test-backend-ops' tie-proof inputs:
#             $OUT/gpu-session/profile_<S>.csv
#   lines     bench/gpu.py lines: Nsight Compute on one launch of each of the op's kernels inside
#             llama-bench's decode at $LINES_DEPTHS (default 4K and 64K; the build has -lineinfo):
#             each kernel's time, SMs' active share and occupancy, and the source lines where its
#             warps were sampled (gpu_ncu_lines_<tag>.md)
#   gemma     build/gpu-gemma/part-* joined into $LLAMA_SPARQ_MODEL_DIR (default /tmp/sparq-models)
#             once every part listed in build/gpu-gemma/SHA256SUMS is there (each call may carry
#             one part; a part carried earlier stays on a warm machine)
#   tests     all of tests/test_cuda.py (the Gemma ones need the gemma step's file)
#   results   bench/results/gpu_* and the logs into $OUT (the device tool brings $OUT back)
#
# Environment: OUT (default build/gpu-out), SPARQ_PYTHON (default python3), GPU_WHEEL_DIR and
# GPU_GEMMA_DIR (default build/gpu-wheel, build/gpu-gemma, as in the Makefile), GPU_WHEEL_XZ (default
# $GPU_WHEEL_DIR-xz/wheel.tar.xz), GPU_TAG (the result
# files' tag, default the GPU's short name and the commit: h100_0123abc), STEP_TIMEOUT (seconds
# per step, default 540), SESSION_SECONDS or SESSION_END (seconds for all steps together, or the
# time, in seconds since the epoch, by which they end: each step gets what is left, and one with
# under 20 s left is skipped, so that the results are packed before the device tool's own limit
# stops the call; SESSION_END holds across several runs of this script), GPU_PACK=1 (the results step packs everything under $OUT into
# $OUT/gpu-session.tar.gz: the device tool brings back only a few files).
# The commit in the result files comes from build/gpu-wheel/COMMIT (the tree the wheel was built
# from; the copy's .git on the GPU machine may be stale). The figures a run gives become rows of
# bench/README.md ("GPU": command, commit, machine, result file).
#
# Prepared calls, each under 10 minutes of one machine (its start comes on top), cut by SESSION_END
# where time runs out:
#
# The figures of bench/README.md's GPU rows: batch 1 from 0 to 128K and batch 4 at 32K, the
# per-layer kernels at 4K and 64K, and where the kernels wait:
#   S=scripts/gpu_session.sh; export SESSION_END=$(( $(date +%s) + 400 )) STEP_TIMEOUT=200 \
#     E2E_DEPTHS=0,4096,8192,32768,65536,131072 E2E_DEPTHS_BATCH=32768 TIMELINE_DEPTHS=4096,65536 LINES_DEPTHS=4096,65536
#   bash $S install
#   bash $S grid; GPU_PACK=1 bash $S e2e timeline lines
#
# Every switch of the kernels that is off by default, checked and timed, in one call of about 9
# minutes (a session with 15 minutes of device time, its start included): the grid with all of
# them on (with FUSED it also compares the one launch's logits with the three launches' on the tiny
# model, which test-backend-ops cannot); the switches against the default kernels in the same
# session at 8K and 64K, SELECT_HIST=match being the reference of the select's ways (any way set
# runs the select kernel that has both), then the bucketed top-k with $AB_BUCKETS; the calibrated k
# at 64K (the mass histogram from the score tiles against the default); then the
# end-to-end rows and -nkvo at 128K. Each step has its own deadline (T0 + seconds), so that a slow
# step costs only its own window; a switch that wins becomes the default, one that loses is deleted:
#   S=scripts/gpu_session.sh; T0=$(date +%s); export STEP_TIMEOUT=200 AB_CHECK=0 AB_DEPTHS=8192,65536 \
#     CALIB_GEN=32 E2E_DEPTHS=0,8192,32768,131072 E2E_DEPTHS_BATCH=32768 NKVO_DEPTHS=131072 \
#     AB_ENVS="LLAMA_SPARQ_CUDA_PDL=0;LLAMA_SPARQ_CUDA_FUSED=1;LLAMA_SPARQ_CUDA_PDL=1;LLAMA_SPARQ_CUDA_SCORE_HIST=1;LLAMA_SPARQ_CUDA_SELECT_HIST=match;LLAMA_SPARQ_CUDA_SELECT_HIST=atomic;LLAMA_SPARQ_CUDA_SELECT_LOADS=early;LLAMA_SPARQ_CUDA_ATTEND_ITEMS=16"
#   bash $S install; SESSION_END=$((T0+100)) LLAMA_SPARQ_CUDA_PDL=1 LLAMA_SPARQ_CUDA_SCORE_HIST=1 LLAMA_SPARQ_CUDA_DIFFUSE=1 \
#     LLAMA_SPARQ_CUDA_FUSED=1 LLAMA_SPARQ_CUDA_CALIB_HIST=1 LLAMA_SPARQ_CUDA_SELECT_HIST=atomic \
#     LLAMA_SPARQ_CUDA_SELECT_LOADS=early bash $S grid
#   SESSION_END=$((T0+310)) bash $S ab; SESSION_END=$((T0+400)) bash $S calib
#   SESSION_END=$((T0+490)) bash $S e2e; SESSION_END=$((T0+540)) GPU_PACK=1 bash $S nkvo results
# (AB_CHECK=0 skips the grid per setting, about a minute each, once the grid above has passed; the
# device tool's call: timeout_s 590, carry build/gpu-wheel-xz. The timeline at 4K takes a call of
# its own: TIMELINE_DEPTHS=4096 GPU_PACK=1 bash $S timeline results.)
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${SPARQ_PYTHON:-python3}
OUT=${OUT:-build/gpu-out}
SITE=${SPARQ_SITE:-/tmp/sparq-site}
WHEELS=${GPU_WHEEL_DIR:-build/gpu-wheel}
PACKED=${GPU_WHEEL_XZ:-$WHEELS-xz/wheel.tar.xz}
PARTS=${GPU_GEMMA_DIR:-build/gpu-gemma}
STEP_TIMEOUT=${STEP_TIMEOUT:-540}
LOGS="$OUT/gpu-session"
mkdir -p "$LOGS"
if [ -n "${SESSION_SECONDS:-}" ] && [ -z "${SESSION_END:-}" ]; then
    SESSION_END=$(($(date +%s) + SESSION_SECONDS))
fi

export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export LLAMA_SPARQ_MODEL_DIR=${LLAMA_SPARQ_MODEL_DIR:-/tmp/sparq-models}
for d in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
if [ -f "$WHEELS/COMMIT" ]; then
    LLAMA_SPARQ_COMMIT=$(cat "$WHEELS/COMMIT")
    export LLAMA_SPARQ_COMMIT
fi

say() { echo "gpu_session: $*" | tee -a "$LOGS/session.log"; }

# run a step's command under the step timeout, its output into the step's log and to stdout
logged() {
    local name=$1
    shift
    local limit=$STEP_TIMEOUT
    if [ -n "${SESSION_END:-}" ]; then
        local left=$((SESSION_END - $(date +%s)))
        if [ "$left" -lt 20 ]; then
            say "$name: skipped, ${left}s of the session left: $*"
            return 3
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    say "$name: $* (timeout ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$LOGS/$name.log" | tail -n 40
    local rc=${PIPESTATUS[0]}
    say "$name: rc $rc after $((SECONDS - t0)) s"
    return "$rc"
}

installed() { [ -f "$SITE/llama_sparq/__init__.py" ]; }

step_install() {
    nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1 || say "install: nvidia-smi failed (see nvidia-smi.txt)"
    head -n 15 "$LOGS/nvidia-smi.txt"
    if ! ls "$WHEELS"/*.whl > /dev/null 2>&1 && [ -f "$PACKED" ]; then
        # the wheels carried packed (make gpu-wheel writes both; the folder alone is over a call's 64 MiB)
        mkdir -p "$WHEELS" && tar -xJf "$PACKED" -C "$WHEELS" || { say "install: unpacking $PACKED failed"; return 2; }
        say "install: unpacked $PACKED into $WHEELS"
    fi
    ls "$WHEELS"/*.whl > /dev/null 2>&1 || { say "install: no wheels in $WHEELS: run 'make gpu-wheel' on the build machine and carry $WHEELS-xz (or $WHEELS)"; return 2; }
    logged install "$PY" -m pip install -q --no-index --no-deps --disable-pip-version-check --upgrade \
        --target "$SITE" "$WHEELS"/*.whl || return $?
    logged install "$PY" -c "import llama_sparq; print(llama_sparq.check_library())" || return $?
    # ab and calib time switches that only the experimental CUDA build reads (make gpu-wheel's)
    grep -q LLAMA_SPARQ_CUDA_PDL "$SITE"/llama_sparq/lib/libggml-cuda.so 2> /dev/null \
        || say "install: the wheel's CUDA kernels are not the experimental build: ab and calib would time no variant"
}

# the result files' tag: the GPU's short name and the commit (earlier runs' files keep theirs)
gpu_tag() {
    if [ -n "${GPU_TAG:-}" ]; then
        echo "$GPU_TAG"
        return
    fi
    local name commit
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    name=$(echo "$name" | tr 'A-Z' 'a-z' | grep -o -E '[a-z][0-9]{2,4}' | head -n 1)
    commit=${LLAMA_SPARQ_COMMIT:-$(git rev-parse --short=7 HEAD 2>/dev/null)}
    echo "${name:-gpu}_${commit:0:7}"
}

step_grid() {
    logged grid "$PY" -m pytest tests/test_cuda.py -v -rs -p no:cacheprovider \
        -k "not gemma and not bench_and_cli and not emulated and not graph_rebuild"
}

step_op() {
    # shellcheck disable=SC2086
    logged op "$PY" bench/gpu.py sweep --only op --tag "$(gpu_tag)" ${OP_ARGS:-}
}

step_e2e() {
    local tag
    tag=$(gpu_tag)
    logged e2e "$PY" bench/gpu.py sweep --only e2e --tag "${tag}_b1" \
        --depths "${E2E_DEPTHS:-0,4096,8192,32768,65536,131072}" --depths-batch "" --nkvo-depths "" \
        --reps 3 --n-gen 16 || return $?
    logged e2e "$PY" bench/gpu.py sweep --only e2e --tag "${tag}_b4" --depths "" \
        --depths-batch "${E2E_DEPTHS_BATCH:-16384,32768}" --nkvo-depths "" --n-gen 16
}

step_timeline() {
    # gpu.py timeline picks Nsight Systems where the machine has it (or $NSYS), else the CUPTI tracer
    # built with the wheel, and says so when it has neither
    logged timeline "$PY" bench/gpu.py timeline ${NSYS:+--nsys "$NSYS"} --cupti-lib "$WHEELS/libsparq_cupti_trace.so" \
        --tag "$(gpu_tag)" --work "$OUT/gpu-timeline" --depths "${TIMELINE_DEPTHS:-4096,65536}"
}

# AB_ENVS as its settings, one per line (a setting's variables joined by ','); a malformed one
# refused by name
ab_settings() {
    local dflt="LLAMA_SPARQ_CUDA_PDL=0;LLAMA_SPARQ_CUDA_PDL=1;LLAMA_SPARQ_CUDA_SCORE_HIST=1"
    dflt+=";LLAMA_SPARQ_CUDA_PDL=1,LLAMA_SPARQ_CUDA_SCORE_HIST=1"
    dflt+=";LLAMA_SPARQ_CUDA_SELECT_HIST=atomic;LLAMA_SPARQ_CUDA_SELECT_LOADS=early;LLAMA_SPARQ_CUDA_ATTEND_ITEMS=16"
    dflt+=";LLAMA_SPARQ_CUDA_FUSED=1;LLAMA_SPARQ_CUDA_CALIB_HIST=1"
    env_settings AB_ENVS "${AB_ENVS:-$dflt}"
}

# settings $2 of variable $1 (';' between settings, ',' between a setting's variables), one per line
env_settings() {
    local v p
    tr ';' '\n' <<< "$2" | while read -r v; do
        [ -z "$v" ] && continue
        for p in ${v//,/ }; do
            if ! [[ "$p" =~ ^LLAMA_SPARQ_CUDA_[A-Z_]+=[A-Za-z0-9_]+$ ]]; then
                echo "gpu_session: $1: '$p' is not LLAMA_SPARQ_CUDA_<NAME>=<value> (';' between settings, ',' within one)" >&2
                return 2
            fi
        done
        echo "$v"
    done
}

step_ab() {
    local tag v slug rc=0
    local -a vars
    tag=$(gpu_tag)
    for v in $(ab_settings); do
        read -r -a vars <<< "${v//,/ }"
        slug=$(echo "$v" | sed 's/LLAMA_SPARQ_CUDA_//g' | tr 'A-Z=,' 'a-z__')
        if [ "${AB_CHECK:-1}" = 1 ]; then
            logged ab env "${vars[@]}" "$PY" -m pytest tests/test_cuda.py -q -rs -p no:cacheprovider \
                -k backend_ops_cuda_equals_cpu || { say "ab: $v: the grid failed on CUDA0"; rc=1; }
        fi
        logged ab env "${vars[@]}" "$PY" bench/gpu.py sweep --only e2e --tag "${tag}_ab_$slug" \
            --depths "${AB_DEPTHS:-8192,65536}" --depths-batch "" --nkvo-depths "" --reps 3 --n-gen 16 || rc=1
        if [ "${AB_TIMELINE:-0}" = 1 ]; then
            logged ab env "${vars[@]}" "$PY" bench/gpu.py timeline ${NSYS:+--nsys "$NSYS"} \
                --cupti-lib "$WHEELS/libsparq_cupti_trace.so" --tag "${tag}_ab_$slug" --work "$OUT/gpu-timeline-$slug" \
                --depths "${TIMELINE_DEPTHS:-4096,65536}" || rc=1
        fi
    done
    for v in $(echo "${AB_BUCKETS-1024}" | tr ',' ' '); do
        [[ "$v" =~ ^[0-9]+$ ]] || { say "AB_BUCKETS: '$v' is not a count of buckets"; return 2; }
        logged ab "$PY" bench/gpu.py sweep --only e2e --tag "${tag}_ab_topk_buckets_$v" --topk-buckets "$v" \
            --depths "${AB_DEPTHS:-8192,65536}" --depths-batch "" --nkvo-depths "" --reps 3 --n-gen 16 || rc=1
    done
    for v in $(echo "${AB_KT_BITS-4,8}" | tr ',' ' '); do
        case "$v" in 4|8|16) ;; *) say "AB_KT_BITS: '$v' is not 4, 8 or 16"; return 2 ;; esac
        logged ab "$PY" bench/gpu.py sweep --only e2e --tag "${tag}_ab_kt$v" --kt-bits "$v" --r 0 \
            --depths "${AB_DEPTHS:-8192,65536}" --depths-batch "" --nkvo-depths "" --reps 3 --n-gen 16 || rc=1
    done
    return "$rc"
}

step_calib() {
    local tag v slug settings rc=0
    local -a vars
    local dflt="LLAMA_SPARQ_CUDA_CALIB_HIST=0;LLAMA_SPARQ_CUDA_CALIB_HIST=1"
    tag=$(gpu_tag)
    settings=$(env_settings CALIB_ENVS "${CALIB_ENVS:-$dflt}") || return 2
    for v in $settings; do
        read -r -a vars <<< "${v//,/ }"
        slug=$(echo "$v" | sed 's/LLAMA_SPARQ_CUDA_//g' | tr 'A-Z=,' 'a-z__')
        logged calib env "${vars[@]}" "$PY" bench/gpu.py sweep --only e2e --tag "${tag}_calib_$slug" \
            --depths "${CALIB_DEPTHS:-65536}" --depths-batch "" --nkvo-depths "" --k 0 --l -1 --reps 3 \
            --n-gen "${CALIB_GEN:-64}" || rc=1
    done
    return "$rc"
}

step_nkvo() {
    logged nkvo "$PY" bench/gpu.py sweep --only e2e --tag "$(gpu_tag)_nkvo" --depths "" --depths-batch "" \
        --nkvo-depths "${NKVO_DEPTHS:-16384,65536}" --n-gen 16
}

step_profile() {
    local ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
    [ -x "$ncu" ] || { say "profile: no ncu at $ncu (set NCU=...)"; return 2; }
    local exe S rc=0
    exe=$("$PY" -c "from llama_sparq import tool_path; print(tool_path('test-backend-ops'))") || return 1
    for S in 65536 4096; do
        logged profile env SPARQ_PERF_GPU=1 "$ncu" -k regex:k_sparq --launch-count 40 --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --csv --page details --log-file "$LOGS/profile_$S.csv" \
            "$exe" perf -b CUDA0 -o SPARQ_ATTN -p "kv=$S,nh=32,nh_kv=32,nr=1,ns=1,r=32,k=128," || rc=1
    done
    return "$rc"
}

step_lines() {
    logged lines "$PY" bench/gpu.py lines ${NCU:+--ncu "$NCU"} --tag "$(gpu_tag)" --work "$OUT/gpu-ncu" \
        --depths "${LINES_DEPTHS:-4096,65536}"
}

step_gemma() {
    [ -f "$PARTS/SHA256SUMS" ] || { say "gemma: no $PARTS/SHA256SUMS: run 'make gpu-gemma-parts' and carry it with a part"; return 2; }
    local want have
    want=$(grep -c . "$PARTS/SHA256SUMS")
    have=$(ls "$PARTS"/part-* 2> /dev/null | wc -l)
    say "gemma: $have of $want parts here"
    [ "$have" -eq "$want" ] || return 0
    (cd "$PARTS" && sha256sum --quiet -c SHA256SUMS) || { say "gemma: a part differs from SHA256SUMS"; return 1; }
    mkdir -p "$LLAMA_SPARQ_MODEL_DIR"
    local file
    file=$(cat "$PARTS/FILE")
    cat "$PARTS"/part-* > "$LLAMA_SPARQ_MODEL_DIR/$file.tmp" && mv "$LLAMA_SPARQ_MODEL_DIR/$file.tmp" "$LLAMA_SPARQ_MODEL_DIR/$file"
    say "gemma: $LLAMA_SPARQ_MODEL_DIR/$file ($(stat -c %s "$LLAMA_SPARQ_MODEL_DIR/$file") bytes)"
}

step_tests() {
    logged tests "$PY" -m pytest tests/test_cuda.py -v -rs -p no:cacheprovider
}

step_results() {
    mkdir -p "$OUT/results"
    cp -p bench/results/gpu_* "$OUT/results/" 2> /dev/null
    say "results: $(ls "$OUT/results" | wc -l) files in $OUT/results"
    if [ "${GPU_PACK:-0}" = 1 ]; then
        # a later run's archive takes the next free name: packing again must not replace the first
        local items name=gpu-session.tar.gz n=2
        while [ -e "$OUT/$name" ]; do
            name=gpu-session-$n.tar.gz
            n=$((n + 1))
        done
        items=$(cd "$OUT" && ls -A | grep -v -E '^gpu-session(-[0-9]+)?\.tar\.gz$')
        # shellcheck disable=SC2086
        (cd "$OUT" && tar -czf "$name" $items && rm -rf $items) && echo "gpu_session: results: packed into $OUT/$name" \
            || echo "gpu_session: packing $OUT failed" >&2
    fi
}

[ $# -gt 0 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
for s in "$@"; do
    case "$s" in
        install|grid|timeline|op|e2e|ab|calib|nkvo|profile|lines|gemma|tests|results) ;;
        *) echo "gpu_session: unknown step '$s' (install grid timeline op e2e ab calib nkvo profile lines gemma tests results)" >&2; exit 2 ;;
    esac
    if [ "$s" = ab ]; then
        ab_settings > /dev/null || exit 2
    fi
done
status=0
for s in "$@"; do
    if [ "$s" != install ] && [ "$s" != results ] && [ "$s" != gemma ] && ! installed; then
        step_install || { status=1; break; }
    fi
    "step_$s" || status=1
done
step_results
exit "$status"
