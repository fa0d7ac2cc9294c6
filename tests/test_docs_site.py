"""The documentation: the site builds with `mkdocs build --strict` (no broken link, no page
left out), its command-line reference has every option of every command (walked through
click, the lazily loaded commands too), and the README keeps its promises (short, the two
first commands as they are, no dates)."""

from __future__ import annotations

import html
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

import pipeinfer.cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTALL_AND_RUN = ('bash install.sh && .venv/bin/mpiexec -n 3 .venv/bin/pipeinfer run -m '
                   'qwen-coder-1.5b -md qwen-coder-0.5b --chat -p "Write a Python function that '
                   'reverses a linked list." -n 128 --strategy pipeinfer --layer-split 0,0.5,0.5')
INSTALL_AND_TEST = "bash install.sh test && .venv/bin/python -m pytest -q"


def pipeinfer_group() -> click.Group:
    """The click group behind `pipeinfer` (`pipeinfer.cli.main` itself, or the group the
    console script's main() runs), as the site's hook finds it."""
    main = pipeinfer.cli.main
    if isinstance(main, click.Group):
        return main
    return importlib.import_module("pipeinfer.cli.commands").commands


def commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ("pipeinfer",)):
    """(path, command) of every subcommand, as `pipeinfer --help` lists them (lazy ones too)."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield path + (name,), command
        if isinstance(command, click.Group):
            yield from commands(command, click.Context(command, parent=ctx, info_name=name),
                                path + (name,))


def sections(page: str) -> dict[str, str]:
    """The CLI page's HTML per heading id (`pipeinfer-run`, `pipeinfer-models-fetch`, ...)."""
    parts = re.split(r'<h[1-6] id="([^"]+)"', page)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs_click") is None:
        pytest.skip("the docs extra is not installed: bash install.sh test,docs")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def test_the_site_builds_strict_and_documents_every_option_of_every_command(site):
    page = sections((site / "reference" / "cli" / "index.html").read_text())
    main = pipeinfer_group()
    ctx = click.Context(main, info_name="pipeinfer")
    found = list(commands(main, ctx))
    assert {" ".join(p) for p, _ in found} >= {"pipeinfer serve", "pipeinfer calibrate",
                                               "pipeinfer plan", "pipeinfer simulate",
                                               "pipeinfer run", "pipeinfer models fetch"}
    missing = []
    for path, command in found:
        section = page.get("-".join(path))
        if section is None:
            missing.append(f"{' '.join(path)}: no section")
            continue
        text = html.unescape(section)
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                missing += [f"{' '.join(path)} {opt}" for opt in param.opts + param.secondary_opts
                            if f"<code>{opt}</code>" not in text]
    assert not missing, missing


def test_readme_is_short_with_the_two_commands_first_and_no_dates():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    assert INSTALL_AND_RUN in lines[:40] and INSTALL_AND_TEST in lines[:40]
    dated = [line for line in lines if re.search(r"\b20\d\d-\d\d-\d\d\b|\bissue \d+", line)]
    assert not dated, dated
