"""The layering of DESIGN.md, checked by parsing every module's imports.

configs and core at the bottom, environments on core, actors above both, launch on top; core never imports
ray, vllm or deepspeed; only launch/job/ray_cluster.py calls ray.init; configs imports nothing heavy.

Inside launch/, commands sit on top of what they run: launch/'s top level holds only the commands a user runs
(`python -m launch.<command>`, and `__init__`); a command with internals is a package with a `__main__`
(bench, or eval and ablate, whose `command` module is the command). The wiring below them (launch/job/, the
GPU checks' launch/gpu/, and the internals of launch/eval/ and launch/ablate/) never imports a command, and
every launch package's docstring is its map (a table of its modules).
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


def command_module(module: str, root: Path = ROOT) -> bool:
    """Whether `module` (dotted) is a command: launch/<name>.py; in a command package (one with a __main__.py)
    its __init__, __main__ and `command` modules; every module of launch/bench, whose modules are benchmarks."""
    parts = module.split(".")
    if parts[0] != "launch" or len(parts) < 2:
        return False
    top = root / "launch" / parts[1]
    if top.with_suffix(".py").is_file():
        return True
    if not (top / "__main__.py").is_file():
        return False
    return parts[1] == "bench" or len(parts) == 2 or parts[2] in {"__main__", "command"}


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """Every module `path` imports; `from launch.pkg import name` counts as launch.pkg.name when pkg is a folder."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if (root / node.module.replace(".", "/")).is_dir():
                found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((node.module, node.lineno))
    return found


def wiring_imports_of_commands(root: Path = ROOT) -> list[str]:
    """Imports of a command from a launch module that is not one (commands import wiring, never the reverse)."""
    problems = []
    for path in sorted((root / "launch").rglob("*.py")):
        rel = path.relative_to(root)
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        if module == "launch" or command_module(module, root):
            continue
        problems += [f"{rel}:{line}: {module} must not import the command {target}"
                     for target, line in imported_modules(path, root) if command_module(target, root)]
    return problems


def test_wiring_never_imports_a_command():
    assert wiring_imports_of_commands() == []


def test_launch_top_level_holds_only_commands_and_every_package_has_a_map():
    launch = ROOT / "launch"
    not_commands = [p.name for p in sorted(launch.glob("*.py"))
                    if p.name != "__init__.py" and '__name__ == "__main__"' not in p.read_text()]
    assert not_commands == [], "not commands (move them to a package below launch/): " + ", ".join(not_commands)
    packages = [launch, *(p.parent for p in sorted(launch.glob("*/__init__.py")))]
    assert {p.name for p in packages} >= {"launch", "job", "gpu", "eval", "ablate", "bench"}
    unmapped = [str(p.relative_to(ROOT)) for p in packages
                if "| module |" not in (ast.get_docstring(ast.parse((p / "__init__.py").read_text())) or "")]
    assert unmapped == [], f"packages whose docstring has no map (a table of their modules): {unmapped}"
    folders = [p.name for p in launch.iterdir() if p.is_dir() and any(p.glob("*.py"))]
    assert sorted(folders) == sorted(p.name for p in packages[1:]), "a folder of modules without __init__.py"


def test_checker_catches_wiring_that_imports_a_command(tmp_path):
    for folder in ("launch/job", "launch/eval"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "launch" / "train.py").write_text("")
    (tmp_path / "launch" / "eval" / "__main__.py").write_text("")
    (tmp_path / "launch" / "eval" / "runner.py").write_text("")
    (tmp_path / "launch" / "job" / "run.py").write_text(
        "from launch.train import main\nfrom launch.eval import command\nfrom launch.eval.runner import x\n")
    problems = wiring_imports_of_commands(tmp_path)
    assert [p.split(": ")[-1] for p in problems] == ["launch.job.run must not import the command launch.train",
                                                   "launch.job.run must not import the command launch.eval.command"]
