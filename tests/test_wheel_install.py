"""The package as a user installs it: `pip install .` (a built wheel, not the editable
checkout) into a fresh virtual environment outside the repository, then the installed
`hirflow` command: every subcommand's help, and a replay of a small Online Retail file
through the embedded broker (it needs `hirflow.streams.tools.adapters`, which a wheel that lists
its packages by hand can miss).

The fresh environment sees the test environment's third-party packages through a path file
(torch and the rest are not reinstalled), but not its editable `hirflow`: path files of a
directory added that way are not processed, so `hirflow` comes from the wheel alone."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _run(*cmd, cwd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                       timeout=300, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """-> the `bin` folder of a fresh venv holding only the built hirflow wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"                # what the Dockerfile copies, so no build folder is left
    src.mkdir()                      # in the checkout and nothing else can leak in
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", tmp / "dist", src, cwd=tmp)
    wheel = next((tmp / "dist").glob("hirflow-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = _run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                cwd=tmp).stdout.strip()
    # third-party packages of the test environment, without processing its path files
    Path(site, "test-env-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q", wheel, cwd=tmp)
    return env_dir / "bin"


def test_the_installed_package_is_the_wheel_under_one_namespace(installed, tmp_path):
    r = _run(installed / "python", "-c",
             "import hirflow.streams.tools.adapters.online_retail as m, hirflow.state, importlib.util;"
             "print(m.__file__); print(importlib.util.find_spec('state'))", cwd=tmp_path)
    where, top_level_state = r.stdout.split()
    assert str(ROOT) not in where and "site-packages/hirflow/streams/tools/adapters" in where
    assert top_level_state == "None"           # nothing generic at the top of site-packages


def test_every_subcommand_answers_help(installed, tmp_path):
    hirflow = installed / "hirflow"
    top = _run(hirflow, "--help", cwd=tmp_path).stdout
    commands = [line.split()[0] for line in top.split("Commands:")[1].splitlines() if line.strip()]
    assert {"worker", "replay", "train", "evaluate", "demo"} <= set(commands)
    for c in commands:
        _run(hirflow, c, "--help", cwd=tmp_path)


@pytest.mark.broker
def test_installed_replay_of_a_small_file(installed, broker, tmp_path):
    hirflow = installed / "hirflow"
    base = [hirflow, "--config", ROOT / "configs" / "online_retail.toml",
            "--bootstrap", broker.bootstrap, "--topic-prefix", f"wheel{os.getpid()}.",
            "--partitions", "2"]
    _run(*base, "topics", "create", cwd=tmp_path)
    r = _run(*base, "replay", "--no-progress", DATA / "online_retail_sample.csv", cwd=tmp_path)
    stats = json.loads(r.stdout.strip().splitlines()[-1])
    assert stats["engagements"] > 0, stats
