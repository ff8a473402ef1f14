"""The Dockerfile cannot be built here (no Docker engine); check what can be checked: it
ships every package the project installs and the torch pin the rest of the project uses."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_copies_every_package_and_pins_torch_like_the_project():
    docker = (ROOT / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for pkg, folder in project["tool"]["setuptools"]["package-dir"].items():
        assert re.search(rf"^COPY {folder} {folder}$", docker, re.M), f"Dockerfile misses {pkg}"
    torch_pin = next(d.split("#")[0].strip() for d in project["project"]["dependencies"]
                     if d.startswith("torch"))
    assert f"ARG TORCH={torch_pin}" in docker
    assert re.search(rf"^TORCH\s+\?= {re.escape(torch_pin)}$", (ROOT / "Makefile").read_text(), re.M)
    # the chart runs the image as this user and reaches the API on this port
    values = (ROOT / "helm" / "hirflow" / "values.yaml").read_text()
    assert "USER 10001:10001" in docker and "runAsUser: 10001" in values
    assert "EXPOSE 6066" in docker and "port: 6066" in values
    assert 'ENTRYPOINT ["hirflow"]' in docker
