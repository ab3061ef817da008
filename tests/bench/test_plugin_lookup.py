"""Which plugin a source file belongs to (bench/plugins.py ``_plugin_at``), which the hooks of bench/plugin_guard.py
ask at every frame of every ``subprocess`` call, ``os.fork`` and ``os.chdir`` while plugins are loaded: right after
each plugin loads (the table is not stale), through a symbolic link, and without a ``realpath`` per file per call."""

from __future__ import annotations

import os
from pathlib import Path

from bench import plugins
from bench.plugins import load_plugins

from .test_plugins import _registries_as_they_were  # noqa: F401  (autouse: the plugins loaded here are unloaded)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
OBJECTIVES, TASK = str(EXAMPLES / "objectives.py"), str(EXAMPLES / "mod7_task.py")


def test_each_loaded_plugin_is_found_at_once_and_through_a_link(tmp_path):
    assert plugins._plugin_at(OBJECTIVES) is None
    load_plugins([OBJECTIVES])
    assert plugins._plugin_at(OBJECTIVES) == OBJECTIVES
    assert plugins._plugin_at(TASK) is None
    load_plugins([OBJECTIVES, TASK])  # (a second plugin: the table made before it is not kept)
    assert plugins._plugin_at(TASK) == TASK and plugins._plugin_at(OBJECTIVES) == OBJECTIVES
    link = tmp_path / "link.py"
    link.symlink_to(TASK)
    assert plugins._plugin_at(str(link)) == TASK
    assert plugins._plugin_at(os.__file__) is None


def test_asking_again_resolves_no_file_again(monkeypatch):
    load_plugins([OBJECTIVES, TASK])
    frames = [os.__file__, plugins.__file__, OBJECTIVES, __file__] * 50  # (a deep stack's few files, asked again)
    plugins._plugin_at(frames[0])
    calls = []
    real = os.path.realpath
    monkeypatch.setattr(plugins.os.path, "realpath", lambda p, *a, **k: calls.append(p) or real(p, *a, **k))
    found = [plugins._plugin_at(f) for f in frames]
    assert found.count(OBJECTIVES) == 50 and found.count(None) == 150
    assert len(calls) <= 4, f"{len(calls)} realpath calls for 200 questions about 4 files"
