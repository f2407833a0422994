"""The layering of DESIGN.md, checked by parsing every module's imports.

configs and core at the bottom, environments on core, actors above both, launch on top; core never imports
ray, vllm or deepspeed; only launch/job/ray_cluster.py calls ray.init; configs imports nothing heavy.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "configs", "environments", "actors", "launch", "tests")
ALLOWED = {
    "configs": {"configs"},
    "core": {"core"},
    "environments": {"core", "environments", "configs"},
    "actors": {"core", "environments", "configs", "actors"},
    "launch": {"core", "environments", "configs", "actors", "launch"},
    "tests": set(PACKAGES),
}
FORBIDDEN_THIRD_PARTY = {
    "core": {"ray", "vllm", "deepspeed"},
    "configs": {"ray", "vllm", "deepspeed", "torch", "transformers"},
    "environments": {"vllm", "deepspeed"},
}


def imports_of(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found


def layering_violations(root: Path = ROOT) -> list[str]:
    problems = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for module, line in imports_of(path):
                top = module.split(".")[0]
                where = f"{path.relative_to(root)}:{line}"
                if top in PACKAGES and top not in ALLOWED[package]:
                    problems.append(f"{where}: {package} must not import {module}")
                if top in FORBIDDEN_THIRD_PARTY.get(package, set()):
                    problems.append(f"{where}: {package} must not import {top}")
            if package == "actors":
                problems += [f"{path.relative_to(root)}: actors import another actor's module {m}"
                             for m, _ in imports_of(path) if m.startswith("actors.") and _is_role(m)]
    return problems


def _is_role(module: str) -> bool:
    """Actor role modules hold handles to each other, never imports (shared helpers are fine)."""
    return module.split(".")[1] in {"env_pool", "generator", "learner", "coordinator"}


def ray_init_calls(root: Path = ROOT) -> list[str]:
    calls = []
    for package in PACKAGES[:-1]:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "init"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "ray"):
                    calls.append(str(path.relative_to(root)))
    return calls


def test_no_forbidden_import_edges():
    assert layering_violations() == []


def test_only_launch_calls_ray_init():
    assert set(ray_init_calls()) <= {"launch/job/ray_cluster.py"}


def test_checker_catches_a_forbidden_edge(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "bad.py").write_text("import ray\nfrom actors.env_pool import EnvPool\n")
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
    problems = layering_violations(tmp_path)
    assert any("core must not import actors.env_pool" in p for p in problems)
    assert any("core must not import ray" in p for p in problems)
