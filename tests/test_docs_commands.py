"""Every command block the README and the guide (docs/guide/*.md) mark runnable runs as written.

The marker is an HTML comment on the line right before a fenced block:

    <!-- runnable -->
    ```bash
    pipeinfer run -m smollm2 -p "Hello" -n 16
    ```

A page's runnable blocks run in order in one bash process (set -euo pipefail), so a server a
block starts in the background serves the next blocks; `python` blocks run with the
environment's Python; whatever a page leaves in the background is stopped at its end. The
shell starts in a temporary directory holding links to the repository's top-level entries
(`hostfiles/`, `experiments/`, `plot.py`, `.venv`), with the environment's `bin/` first on
PATH, as for a reader with the environment active. A page's blocks fail the test if any
command in them fails.

Where the text uses the Qwen pair the test runs SmolLM2 and fewer tokens, and the ports of
the servers are free ones (the pages say so); SUBSTITUTIONS, applied in order:

    -m qwen-coder-1.5b, -md qwen-coder-0.5b(-q4_0) -> -m smollm2, -md smollm2
    model="qwen-coder-1.5b" (OpenAI client)    -> model="smollm2"
    models fetch smollm2 qwen-coder            -> models fetch smollm2 (no download)
    -n 256, -n 128, -n 64, -n 48, -n 32        -> -n 16
    8080, 8081                                 -> a free port each

Blocks that cannot run on one machine (several hosts) carry no marker and a sentence saying
why. The README's first two commands (install and run; install and test) are not marked:
CI runs the second, and the first builds llama-cpp-python for ten minutes.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
RUNNABLE = re.compile(r"^<!-- runnable -->\n```(bash|python)\n(.*?)^```$", re.M | re.S)
SUBSTITUTIONS = [
    (r"-m qwen-coder-1\.5b(?![\w.-])", "-m smollm2"),
    (r"-md qwen-coder-0\.5b(-q4_0)?(?![\w.-])", "-md smollm2"),
    (r'model="qwen-coder-1\.5b"', 'model="smollm2"'),
    (r"models fetch smollm2 qwen-coder\b", "models fetch smollm2"),
    (r"-n (256|128|64|48|32)\b", "-n 16"),
]
PORTS = ("8080", "8081")
PAGE_TIMEOUT_S = 1200
PY_END = "PIPEINFER_DOC_PYTHON"


def runnable_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, code) of every block of `page` marked runnable, in order."""
    return RUNNABLE.findall(page.read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def substituted(code: str, ports: dict[str, str]) -> str:
    for pattern, replacement in SUBSTITUTIONS:
        code = re.sub(pattern, replacement, code)
    for port, free in ports.items():
        code = re.sub(rf"\b{port}\b", free, code)
    return code


def page_script(page: Path) -> str:
    """One bash script of the page's runnable blocks, substituted."""
    ports = {port: str(free_port()) for port in PORTS}
    parts = ["set -euo pipefail",
             "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT"]
    for language, code in runnable_blocks(page):
        code = substituted(code, ports)
        parts.append(code if language == "bash" else f"python - <<'{PY_END}'\n{code}{PY_END}")
    return "\n".join(parts) + "\n"


def workdir(tmp_path: Path) -> Path:
    """A directory where the repository's top-level entries resolve, for the outputs."""
    for entry in ROOT.iterdir():
        if entry.name not in (".git",) and not (tmp_path / entry.name).exists():
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def test_the_marker_is_found_and_the_substitutions_apply():
    """The extraction itself: marked blocks only, in order, and SmolLM2 for the Qwen pair."""
    page = "\n".join(["<!-- runnable -->", "```bash", "mpiexec -n 3 pipeinfer run -m "
                      "qwen-coder-1.5b -md qwen-coder-0.5b-q4_0 -n 128 --port 8080", "```",
                      "```bash", "not marked", "```", "<!-- runnable -->", "```python",
                      'client(model="qwen-coder-1.5b")', "```", ""])
    blocks = RUNNABLE.findall(page)
    assert [lang for lang, _ in blocks] == ["bash", "python"]
    code = substituted(blocks[0][1], {"8080": "9999"})
    assert code == "mpiexec -n 3 pipeinfer run -m smollm2 -md smollm2 -n 16 --port 9999\n"
    assert substituted(blocks[1][1], {}) == 'client(model="smollm2")\n'


def test_the_pages_that_promise_runnable_commands_have_them():
    counts = {page.name: len(runnable_blocks(page)) for page in PAGES}
    for name in ("README.md", "run.md", "cluster.md", "serving.md", "failover.md"):
        assert counts[name] > 0, counts


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_runnable_commands_run_as_written(page, smollm2, tmp_path):
    if not runnable_blocks(page):
        pytest.skip(f"{page.name} has no runnable block")
    script = page_script(page)
    if "experiments/cluster.py" in script and os.geteuid() != 0:
        pytest.skip("the emulated cluster needs root")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-c", script], cwd=workdir(tmp_path), env=env,
                            capture_output=True, text=True, timeout=PAGE_TIMEOUT_S,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True)
    assert result.returncode == 0, (
        f"{page.name}: exit {result.returncode}\n--- script\n{script}\n--- stdout (end)\n"
        f"{result.stdout[-3000:]}\n--- stderr (end)\n{result.stderr[-6000:]}")
