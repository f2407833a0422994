"""What this node's CPU computes natively, for the settings whose speed depends on it (`learner.cpu_autocast`).

bfloat16 matrix products are fast only where the CPU multiplies bfloat16 itself: AMX-BF16 (Intel Sapphire
Rapids and later) or AVX512-BF16 (Intel Cooper Lake and later, AMD Zen 4 and later). Elsewhere PyTorch converts
every operand and multiplies in float32, and mixed precision costs time instead of saving it: on an AVX2 AMD EPYC
(Zen 3), the async bench's first training step (one learner core) took 603 s with bfloat16 products against
65 s in float32.
"""
from __future__ import annotations

from pathlib import Path

NATIVE_BF16 = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags, best first


def _first(field: str, cpuinfo: str | Path) -> str:
    """The first processor's `field` in /proc/cpuinfo's layout; "" where the file or the line is missing."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == field:
            return value.strip()
    return ""


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's feature flags (`flags` on x86); empty where the file or the line is missing."""
    return frozenset(_first("flags", cpuinfo).split())


def describe_cpu(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name and its native bfloat16 flag, for the context of a timing."""
    name = _first("model name", cpuinfo) or "CPU model unknown"
    flag = native_bf16(cpu_flags(cpuinfo))
    return f"{name}, {flag}" if flag else f"{name}, no native bfloat16 (neither amx_bf16 nor avx512_bf16)"


def native_bf16(flags: frozenset[str] | None = None) -> str:
    """The flag that gives this CPU native bfloat16 products ("" when it has none)."""
    flags = cpu_flags() if flags is None else flags
    return next((f for f in NATIVE_BF16 if f in flags), "")


def resolve_cpu_autocast(setting: str, flags: frozenset[str] | None = None) -> tuple[str, str]:
    """(`none` or `bfloat16`, why) for `learner.cpu_autocast` = `setting` on a CPU with `flags` (this one's by
    default). `auto` takes bfloat16 only where it is native; an explicit `bfloat16` stays, with the reason saying
    when it is emulated (the caller warns)."""
    if setting == "none":
        return "none", "learner.cpu_autocast=none"
    if setting not in ("auto", "bfloat16"):  # the config's choices (configs/learner.py) are these three
        raise ValueError(f"learner.cpu_autocast: no such setting {setting!r} (auto, none or bfloat16)")
    native = native_bf16(flags)
    if setting == "bfloat16":
        return "bfloat16", (f"native ({native})" if native else
                            "emulated: this CPU has neither AMX-BF16 nor AVX512-BF16, so every bfloat16 product is "
                            "converted and computed in float32, several times slower than float32 itself; "
                            "set learner.cpu_autocast=auto or none")
    if native:
        return "bfloat16", f"auto: this CPU multiplies bfloat16 natively ({native})"
    return "none", "auto: this CPU has neither AMX-BF16 nor AVX512-BF16 (bfloat16 products would be emulated)"
