"""`learner.cpu_autocast: auto` takes bfloat16 products only on a CPU that multiplies bfloat16 natively; the flags
are read from a cpuinfo text (an AVX2 EPYC's, a Sapphire Rapids', and one without a flags line)."""
from __future__ import annotations

import pytest

from core.cpu_features import cpu_flags, describe_cpu, native_bf16, resolve_cpu_autocast

ZEN3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse sse2 avx avx2 fma bmi2 vaes\n"
SPR = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


@pytest.fixture
def cpuinfo(tmp_path):
    def write(text: str):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        return cpu_flags(path)
    return write


def test_auto_takes_bfloat16_only_where_it_is_native(cpuinfo):
    zen3, spr = cpuinfo(ZEN3), cpuinfo(SPR)
    assert "avx2" in zen3 and native_bf16(zen3) == "" and native_bf16(spr) == "amx_bf16"
    assert resolve_cpu_autocast("auto", zen3)[0] == "none"
    assert resolve_cpu_autocast("auto", spr) == ("bfloat16", "auto: this CPU multiplies bfloat16 natively (amx_bf16)")
    assert resolve_cpu_autocast("none", spr)[0] == "none"


def test_explicit_bfloat16_stays_and_says_when_it_is_emulated(cpuinfo):
    mode, why = resolve_cpu_autocast("bfloat16", cpuinfo(ZEN3))
    assert mode == "bfloat16" and why.startswith("emulated") and "learner.cpu_autocast=auto" in why
    assert resolve_cpu_autocast("bfloat16", cpuinfo(SPR)) == ("bfloat16", "native (amx_bf16)")


def test_unreadable_or_flagless_cpuinfo_means_no_native_bfloat16(cpuinfo, tmp_path):
    assert cpu_flags(tmp_path / "missing") == frozenset() and cpuinfo("processor\t: 0\n") == frozenset()
    assert resolve_cpu_autocast("auto", frozenset())[0] == "none"
    with pytest.raises(ValueError, match="learner.cpu_autocast"):
        resolve_cpu_autocast("fp16", frozenset())


def test_a_timing_names_the_cpu_and_its_native_bfloat16(tmp_path):
    spr, zen3 = tmp_path / "spr", tmp_path / "zen3"
    spr.write_text(SPR.replace("vendor_id", "model name\t: Intel Xeon\nvendor_id"))
    zen3.write_text(ZEN3)
    assert describe_cpu(spr) == "Intel Xeon, amx_bf16"
    assert describe_cpu(zen3) == "CPU model unknown, no native bfloat16 (neither amx_bf16 nor avx512_bf16)"
    assert describe_cpu(tmp_path / "missing").startswith("CPU model unknown, no native")
