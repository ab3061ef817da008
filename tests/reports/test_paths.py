"""reports/paths.py: user names become one safe component; only marked folders are deleted or replaced."""

from __future__ import annotations

import json
import os

import pytest

from reports.paths import (
    LISTING,
    MARKER,
    UnsafePath,
    contained,
    make_owned,
    new_temp_folder,
    remove_owned,
    replace_owned,
    safe_component,
    user_files,
)


@pytest.mark.parametrize("name", ["pobench", "grpo-s0-abc123", "tepo+1a2b3c-s1", "exp_1.v2", "c0123456789"])
def test_safe_names_are_kept(name):
    assert safe_component(name) == name


@pytest.mark.parametrize("name", ["..", ".", "../../../X", "/etc/passwd", "a/b", "a\\b", ".hidden", "x" * 200,
                                  "my experiment", "..\x00"])
def test_unsafe_names_become_one_component(name, tmp_path):
    out = safe_component(name)
    assert "/" not in out and "\\" not in out and not out.startswith(".") and len(out) <= 96
    assert out not in (".", "..")
    assert contained(tmp_path, out).parent == tmp_path.resolve()


def test_different_names_stay_different():
    assert safe_component("a/b") != safe_component("a_b") != safe_component("a b")
    assert safe_component("../x") != safe_component("./x")


@pytest.mark.parametrize("bad", ["", "   ", None, 5])
def test_empty_or_non_string_names_refused(bad):
    with pytest.raises(UnsafePath, match="--experiment"):
        safe_component(bad, "--experiment")


def test_contained_refuses_escapes(tmp_path):
    with pytest.raises(UnsafePath, match="outside"):
        contained(tmp_path, "..", "x")
    with pytest.raises(UnsafePath, match="outside"):
        contained(tmp_path, "/tmp")
    (tmp_path / "link").symlink_to(tmp_path.parent)
    with pytest.raises(UnsafePath, match="outside"):
        contained(tmp_path, "link", "y")
    assert contained(tmp_path, "a", "b") == tmp_path.resolve() / "a" / "b"


def test_remove_owned_deletes_only_marked_folders(tmp_path):
    mine = make_owned(tmp_path / "mine", "report")
    (mine / "f.txt").write_text("x")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "important.txt").write_text("notes")
    assert remove_owned(mine, tmp_path) and not mine.exists()
    with pytest.raises(UnsafePath, match="not created by pobench"):
        remove_owned(theirs, tmp_path)
    assert (theirs / "important.txt").read_text() == "notes"
    assert remove_owned(tmp_path / "absent", tmp_path) is False
    outside = make_owned(tmp_path.parent / f"outside-{os.getpid()}")
    try:
        with pytest.raises(UnsafePath, match="outside"):
            remove_owned(outside, tmp_path)
        assert outside.exists()
    finally:
        (outside / MARKER).unlink()
        outside.rmdir()


def test_replace_owned_swaps_and_refuses_foreign_folders(tmp_path):
    dest = tmp_path / "out"
    tmp = new_temp_folder(dest)
    (tmp / "a.txt").write_text("1")
    replace_owned(tmp, dest, tmp_path)
    assert (dest / "a.txt").read_text() == "1" and (dest / MARKER).exists()
    tmp2 = new_temp_folder(dest)
    (tmp2 / "b.txt").write_text("2")
    replace_owned(tmp2, dest, tmp_path)
    assert sorted(p.name for p in dest.iterdir()) == sorted([MARKER, LISTING, "b.txt"])
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary or old folder left
    foreign = tmp_path / "nb"
    foreign.mkdir()
    (foreign / "important.txt").write_text("notes")
    tmp3 = new_temp_folder(foreign)
    with pytest.raises(UnsafePath, match="not created by pobench"):
        replace_owned(tmp3, foreign, tmp_path)
    assert (foreign / "important.txt").read_text() == "notes"


def test_replacing_a_folder_moves_a_users_files_into_the_new_one(tmp_path):
    """A user's notes and a figure of their own put into pobench's folder survive the next report (they were deleted
    with the old folder); a file of theirs where the new folder writes one is refused before any change."""
    dest = tmp_path / "out"
    tmp = new_temp_folder(dest)
    (tmp / "report.md").write_text("old")
    (tmp / "fig").mkdir()
    (tmp / "fig" / "a.png").write_text("png")
    replace_owned(tmp, dest, tmp_path)
    assert sorted(json.loads((dest / LISTING).read_text())) == ["fig/a.png", "report.md"] and user_files(dest) == []
    (dest / "notes.md").write_text("mine")
    (dest / "fig" / "mine.png").write_text("my png")
    (dest / "report.md").write_text("edited")  # pobench's own file, edited: not replaced (held-out round 15, H14)
    assert user_files(dest) == ["fig/mine.png", "notes.md"]
    tmp2 = new_temp_folder(dest)
    (tmp2 / "report.md").write_text("new")
    with pytest.raises(UnsafePath, match="report.md changed since pobench wrote it"):
        replace_owned(tmp2, dest, tmp_path)
    assert (dest / "report.md").read_text() == "edited"
    (dest / "report.md").unlink()  # (moved away, as the line says)
    replace_owned(tmp2, dest, tmp_path)
    assert (dest / "report.md").read_text() == "new" and not (dest / "fig" / "a.png").exists()
    assert (dest / "notes.md").read_text() == "mine" and (dest / "fig" / "mine.png").read_text() == "my png"
    assert user_files(dest) == ["fig/mine.png", "notes.md"]  # still theirs: the next report carries them again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    tmp3 = new_temp_folder(dest)
    (tmp3 / "notes.md").write_text("pobench's")
    with pytest.raises(UnsafePath, match="notes.md is not pobench's"):
        replace_owned(tmp3, dest, tmp_path)
    assert (dest / "notes.md").read_text() == "mine" and (dest / "report.md").read_text() == "new"


def test_replace_file_is_whole_or_absent_replaces_links_and_keeps_the_usual_mode(tmp_path):
    """`reports.paths.replace_file` (bench eval's outputs): the mode a plain write gives (mkstemp's is private), a
    link at the path replaced and its target untouched, and a write over the file-size limit leaves the earlier
    file whole and names the file (the write's own error names none)."""
    import sys

    from reports.paths import replace_file
    from tests import launch

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    made = replace_file(tmp_path / "made.txt", "y")
    assert made.stat().st_mode == plain.stat().st_mode and made.read_text() == "y"
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("mine")
    (tmp_path / "link.txt").symlink_to(theirs)
    replace_file(tmp_path / "link.txt", "new")
    assert theirs.read_text() == "mine" and not (tmp_path / "link.txt").is_symlink()

    code = ("import sys\nfrom reports.paths import replace_file\n"
            "try:\n    replace_file(sys.argv[1], 'z' * 100_000)\nexcept OSError as e:\n    print(e.filename)\n")
    done = launch.run([sys.executable, "-c", code, str(made)], capture_output=True, text=True, timeout=60,
                      file_size_limit=4096)
    assert done.stdout.strip() == str(made), done.stderr
    assert made.read_text() == "y" and sorted(p.name for p in tmp_path.iterdir()) == [
        "link.txt", "made.txt", "plain.txt", "theirs.txt"]


def test_an_unmarked_temporary_folder_of_a_killed_writer_is_removed_by_the_next(tmp_path):
    """A `bench report` killed between making its temporary folder and marking it left `.<name>.tmp-*` for good (the
    next report removed only marked ones: a CI run of test_cli_faults' killed-report test saw it). The folder's name
    holds its writer's pid: an empty one whose writer has ended goes; one of a live writer, one holding anything, or
    one of another name form stays."""
    import subprocess

    from reports.paths import new_temp_folder, remove_stale_temps

    ended = subprocess.Popen(["true"])
    ended.wait()
    dest = tmp_path / "c1"
    dead = tmp_path / f".c1.tmp-{ended.pid}-x1"
    live = tmp_path / f".c1.tmp-{os.getpid()}-x2"
    full = tmp_path / f".c1.tmp-{ended.pid}-x3"
    other = tmp_path / ".c1.tmp-abcdefgh"
    for folder in (dead, live, full, other):
        folder.mkdir()
    (full / "notes.md").write_text("mine")
    assert remove_stale_temps(dest) == [dead]
    assert not dead.exists() and live.is_dir() and (full / "notes.md").is_file() and other.is_dir()
    made = new_temp_folder(dest)  # (named by this process, marked and held: never removed by another writer)
    assert made.name.startswith(f".c1.tmp-{os.getpid()}-") and remove_stale_temps(dest) == []
