# SPDX-License-Identifier: Apache-2.0
"""The README's commands and examples, taken from README.md itself (never copied here), run as a new user would.

* ``test_setup_commands_in_a_fresh_clone`` (slow, a few minutes): ``git clone`` of this checkout's
  **committed HEAD** (uncommitted changes are not tested: commit first) into a temporary folder, a fresh
  venv (no ``--system-site-packages``; pip uses whatever index it is configured with), then the two
  ``bash`` commands of the README's "Set up" section typed verbatim at the clone's root through
  ``bash -c``. The test command would run this whole suite again (and this test in it); instead of
  changing the typed command, ``PYTEST_ADDOPTS="-k test_import"`` (which pytest reads from the
  environment) narrows the nested run to the import tests, which exercise the installed package.
* ``test_python_examples``: every ``python`` block of the README runs verbatim as a script, from a
  directory outside the source tree (so the installed kvblocks is imported), and must print and exit 0.
* ``test_ci_runs_the_readme_commands``: ``.ci/run`` runs the README's two commands as written.
"""
import fcntl
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
NESTED = "KVBLOCKS_README_NESTED"  # set in the nested pytest run: never clone and install recursively


def code_blocks(lang, section=None):
    """The fenced ``lang`` code blocks of README.md, in order; only under heading ``section`` if given."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    if section is not None:
        m = re.search(r"^## " + re.escape(section) + r"\n(.*?)(?=^## |\Z)", text, re.M | re.S)
        assert m, f"README.md has no '## {section}' section"
        text = m.group(1)
    return re.findall(r"^```" + re.escape(lang) + r"\n(.*?)^```", text, re.M | re.S)


def setup_commands():
    """The README's two set-up commands: (install and run the demo, install and run the tests)."""
    blocks = [b.strip() for b in code_blocks("bash", "Set up")]
    assert len(blocks) == 2 and all("\n" not in b for b in blocks), blocks
    return blocks


def clean_env(**extra):
    """os.environ without anything that would point Python at this checkout or this venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTHONSTARTUP")}
    env.update(extra)
    return env


def installed_env():
    """Environment whose Python imports the kvblocks this suite runs against (installed or built in place)."""
    import kvblocks

    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(kvblocks.__file__)))
    return clean_env(PYTHONPATH=pkg_parent)


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(cmd, **kw)


def show(r):
    return f"exit {r.returncode}\n--- stdout ---\n{r.stdout[-6000:]}\n--- stderr ---\n{r.stderr[-6000:]}"


def test_readme_has_the_setup_commands():
    demo, tests = setup_commands()
    assert demo.startswith("pip install . &&")
    assert tests.startswith('pip install ".[test]" &&')


def test_ci_runs_the_readme_commands():
    """.ci/run types both README commands at its checkout's root (and so leaves the fresh-clone test out)."""
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    demo, tests = setup_commands()
    assert any(line.startswith(demo + " ||") or line == demo for line in lines), \
        ".ci/run must run the README's demo command exactly as written"
    assert tests in lines, ".ci/run must run the README's test command exactly as written"


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(NESTED) == "1", reason="inside the nested run of the README's test command")
def test_setup_commands_in_a_fresh_clone(tmp_path):
    if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
        pytest.skip("needs git and a git checkout to clone")
    head = run(["git", "-C", ROOT, "rev-parse", "HEAD"], check=True).stdout.strip()
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", "--no-checkout", ROOT, str(clone)], check=True)
    run(["git", "-C", str(clone), "checkout", "-q", "--detach", head], check=True)
    venv = tmp_path / "venv"
    r = run([sys.executable, "-m", "venv", str(venv)])
    assert r.returncode == 0, show(r)
    bindir = str(venv / "bin")
    env = clean_env(VIRTUAL_ENV=str(venv), PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PIP_USER", None)
    demo_cmd, test_cmd = setup_commands()

    r = run(["bash", "-c", demo_cmd], cwd=clone, env=env, timeout=900)
    assert r.returncode == 0, show(r)
    assert r.stdout.count("verified: OK") == 2 and "MISMATCH" not in r.stdout, show(r)

    env.update({NESTED: "1", "PYTEST_ADDOPTS": "-k test_import"})
    r = run(["bash", "-c", test_cmd], cwd=clone, env=env, timeout=900)
    assert r.returncode == 0, show(r)
    m = re.search(r"(\d+) passed", r.stdout)
    assert m and int(m.group(1)) >= 2, show(r)


class _ExamplePorts:
    """Holds a machine-wide lock while an example runs, so that two test runs on one machine (the README
    uses a fixed port) take turns rather than collide; the suite's own tests use ephemeral ports (above
    32768 on Linux), never the README's."""

    def __init__(self, ports):
        self.ports = ports

    def __enter__(self):
        path = os.path.join(tempfile.gettempdir(), "kvblocks-readme-example.lock")
        self.f = open(path, "a+")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        for port in self.ports:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the runtime's listener does
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    self.__exit__()
                    pytest.skip(f"port {port}, used by the README example, is taken by another program")
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


@pytest.mark.parametrize("index", range(len(code_blocks("python"))))
def test_python_examples(index, tmp_path):
    pytest.importorskip("numpy")
    code = code_blocks("python")[index]
    script = tmp_path / f"readme_example_{index}.py"
    script.write_text(code, encoding="utf-8")
    ports = sorted({int(p) for p in re.findall(r"127\.0\.0\.1[:\", ]+(\d{4,5})\b", code)})
    with _ExamplePorts(ports):
        r = run([sys.executable, str(script)], cwd=tmp_path, env=installed_env(), timeout=120)
    assert r.returncode == 0, show(r)
    assert r.stdout.strip(), "the example should print what it did\n" + show(r)
    assert "Traceback" not in r.stderr, show(r)
