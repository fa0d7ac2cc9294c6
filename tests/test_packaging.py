"""The built wheel holds the whole package: every module of the source tree is in it, and each
one imports from the wheel's own files (with its compiled `_native` extension), not from the
source tree that the development install points at; the web console's files are in it and
read from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What a wheel build reads. Built from a copy: an in-tree build reuses `build/lib`, where a
# module deleted from the source would survive into the wheel and hide a packaging gap.
BUILD_INPUTS = ("pyproject.toml", "README.md", "native", "pipeinfer")

# Run from the unpacked wheel: walks the package, imports everything, reports where each
# module was loaded from. A failing import is reported, not raised, to name every bad module.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
import pipeinfer
found, failed = {"pipeinfer": pipeinfer.__file__}, {}
def skip(name):
    failed[name] = repr(sys.exc_info()[1])
for info in pkgutil.walk_packages(pipeinfer.__path__, "pipeinfer.", onerror=skip):
    try:
        found[info.name] = importlib.import_module(info.name).__file__
    except Exception as err:
        failed[info.name] = repr(err)
from pipeinfer.front import page
try:
    assets = {n: len(page.asset(n)) for n in (*page.ASSETS, "console.html")}
except OSError as err:
    assets = repr(err)
print(json.dumps({"found": found, "failed": failed, "assets": assets}))
"""


def _build_wheel(src: Path, out: Path) -> Path:
    """`pip wheel` of SRC into OUT. Without build isolation (fast, offline) when the venv
    already has what [build-system] requires; else pip fetches it into an isolated env."""
    base = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    quick = subprocess.run(base + ["--no-build-isolation", "--check-build-dependencies"],
                           capture_output=True, text=True)
    if quick.returncode != 0:
        isolated = subprocess.run(base, capture_output=True, text=True)
        assert isolated.returncode == 0, f"pip wheel failed:\n{isolated.stdout}{isolated.stderr}"
    wheels = list(out.glob("pipeinfer-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _source_modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "pipeinfer").rglob("*.py")
            if "__pycache__" not in p.parts}


def test_wheel_holds_and_imports_every_module(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    wheel = _build_wheel(src, tmp_path / "dist")

    with zipfile.ZipFile(wheel) as zf:
        listed = set(zf.namelist())
        missing = sorted(_source_modules() - listed)
        assert not missing, f"{wheel.name} lacks {missing}"
        assert any(n.startswith("pipeinfer/_native.") and n.endswith(".so") for n in listed), \
            f"{wheel.name} has no compiled pipeinfer._native"
        assets = {p.relative_to(ROOT).as_posix()
                  for p in (ROOT / "pipeinfer" / "front" / "assets").iterdir()}
        assert assets and assets <= listed, f"{wheel.name} lacks {sorted(assets - listed)}"
        site = tmp_path / "site"
        zf.extractall(site)

    # The development install is a meta-path finder placed after the path finder, so the
    # wheel's copy on PYTHONPATH comes first; the __file__ checks below prove it did.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "PMIX_", "SLURM_"))}  # no supervisor fork
    env["PYTHONPATH"] = str(site)
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=site, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["failed"], report["failed"]
    outside = {name: path for name, path in report["found"].items()
               if not Path(path).resolve().is_relative_to(site.resolve())}
    assert not outside, f"imported from outside the wheel: {outside}"
    wanted = {p.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
              for p in _source_modules()}
    assert wanted <= set(report["found"]), sorted(wanted - set(report["found"]))
    assert "pipeinfer._native" in report["found"]
    assert isinstance(report["assets"], dict) and all(report["assets"].values()), \
        f"the console's files, read from the wheel: {report['assets']}"
