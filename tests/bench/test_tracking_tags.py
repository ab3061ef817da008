"""The version tags of every run (bench/runs/tracking.py ``version_tags``): pobench's version, the commit of the
checkout it runs from under pobench's and MLflow's names, and whether that checkout had uncommitted changes; read with a
real git in a scratch repository standing in for the package's folder."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import bench
from bench.runs import tracking

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(folder, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=folder, check=True,
                   capture_output=True)


def test_commit_and_dirty_tree_are_tagged(tmp_path, monkeypatch):
    pkg = tmp_path / "bench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("x = 1\n")
    monkeypatch.setattr(bench, "__file__", str(pkg / "__init__.py"))
    assert tracking.version_tags() == {"pobench.version": bench.__version__, "pobench.git_commit": "unknown"}
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "c")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (pkg / "notes.txt").write_text("untracked files do not make the tree dirty")
    clean = tracking.version_tags()
    assert clean["pobench.git_commit"] == clean["mlflow.source.git.commit"] == head
    assert clean["pobench.git_dirty"] == "0"
    (pkg / "__init__.py").write_text("x = 2\n")
    assert tracking.version_tags()["pobench.git_dirty"] == "1"
    assert tracking.version_tags(commit=False) == {"pobench.version": bench.__version__}
