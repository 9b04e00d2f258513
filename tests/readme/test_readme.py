"""Every command the README shows works when pasted, in order, into a fresh shell.

Each ```sh block runs as one script in a clean environment (no variables but PATH, HOME in a
temporary folder, so nothing touches the user's home), from the repository root, stopping
at the first failing command. The lines that build or test everything (`make bench`, `make
test`, `make setup`) are left to CI, which runs them. A ```python block that starts with
"# NAME: COMMAND" is written to NAME and run with COMMAND.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(sh|python)\n(.*?)```", README, re.S)
SKIP = ("make bench", "make test", "make setup")


def shell_blocks() -> list[str]:
    out = []
    for kind, body in BLOCKS:
        if kind != "sh":
            continue
        lines = [ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith(SKIP)]
        if lines:
            out.append("\n".join(lines))
    return out


#: the venv under test: the README says .venv; `make test VENV=.venv-x MPI=system` tests that one
VENV = Path(sys.prefix).resolve()


def fresh(tmp_path: Path, script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    if VENV.parent == ROOT and VENV.name != ".venv":
        script = script.replace(".venv/bin/", f"{VENV.name}/bin/")
    return subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_readme_has_commands():
    assert len(shell_blocks()) >= 5 and any(kind == "python" for kind, _ in BLOCKS)


@pytest.mark.parametrize("script", shell_blocks(), ids=lambda s: s.splitlines()[0][:60])
def test_shell_block(tmp_path, script):
    proc = fresh(tmp_path, script)
    assert proc.returncode == 0, f"$ {script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("body", [b for k, b in BLOCKS if k == "python" and re.match(r"# \S+\.py: ", b)])
def test_python_block(tmp_path, body):
    name, command = re.match(r"# (\S+\.py): (.*)", body).groups()
    path = tmp_path / name
    path.write_text(body)
    proc = fresh(tmp_path, command.replace(name, str(path)))
    assert proc.returncode == 0, f"$ {command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_launcher_found_without_the_venv_on_path(tmp_path):
    """`python -m ringmpi.launch` with the system python and no venv on PATH finds the venv's mpirun."""
    proc = fresh(tmp_path, "python3 -m ringmpi.launch -n 2 -- .venv/bin/python -c 'import ringmpi'")
    assert proc.returncode == 0, proc.stdout + proc.stderr
