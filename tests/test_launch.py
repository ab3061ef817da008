"""tests/launch.py: a `bench` command forked from the tests' zygote sees the process a fresh ``python -m bench.cli``
sees (its argv, ``sys.path[0]``, working folder, environment, ``__main__``, process group, standard streams, exit at
the end: ``atexit``, a non-daemon thread joined, an exit code or a signal), so the tests that run commands this way
test what a user runs."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from tests import launch

PROBE = textwrap.dedent("""
    import atexit, os, sys, threading, time, __main__
    print("argv", sys.argv[1:])
    print("argv0", os.path.basename(sys.argv[0]))
    print("path0", sys.path[0])
    print("cwd", os.getcwd())
    print("var", os.environ.get("PROBE_VAR"), "MLFLOW_TRACKING_URI" in os.environ)
    print("main", getattr(__main__.__spec__, "name", None))
    print("own group", os.getpgid(0) == os.getpid())
    print("stdin", sys.stdin.read() if os.environ.get("PROBE_STDIN") else "-")
    print("to stderr", file=sys.stderr)
    atexit.register(lambda: print("atexit ran"))
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined"))).start()
    how = os.environ.get("PROBE_END")
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "keyboard":
        raise KeyboardInterrupt
    if how == "error":
        raise RuntimeError("probe error")
""").replace("import atexit,", "import signal, atexit,")


def _both(tmp_path, env_extra: dict[str, str], *more: str, input=None, **kw):
    """The probe plugin run by `bench list --plugin probe.py` through ``subprocess`` and through the zygote."""
    import os

    (tmp_path / "probe.py").write_text(PROBE)
    argv = [sys.executable, "-m", "bench.cli", "list", "--plugin", "probe.py", *more]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(env_extra, PROBE_VAR="here")
    fresh = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, input=input,
                           **kw)
    assert launch._forkable(argv, {"cwd": tmp_path, "env": env, **kw})
    forked = launch.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, input=input, **kw)
    return fresh, forked


def _facts(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.split(" ")[0] in
            ("argv", "argv0", "path0", "cwd", "var", "main", "own", "stdin", "atexit", "thread")]


def test_a_forked_command_sees_what_a_fresh_one_sees(tmp_path):
    fresh, forked = _both(tmp_path, {"PROBE_STDIN": "1"}, input="typed\n", start_new_session=True)
    assert fresh.returncode == forked.returncode == 0, (fresh.stderr, forked.stderr)
    facts = _facts(fresh.stdout)
    assert f"cwd {tmp_path}" in facts and f"path0 {tmp_path}" in facts and "var here False" in facts
    assert "own group True" in facts and "stdin typed" in facts and "main bench.cli.__main__" in facts
    assert "thread joined" in facts and "atexit ran" in facts
    assert _facts(forked.stdout) == facts
    assert forked.stderr.splitlines()[0] == fresh.stderr.splitlines()[0] == "to stderr"


@pytest.mark.parametrize("how, code", [("unknown", 2), ("sigkill", -signal.SIGKILL), ("error", None),
                                       ("keyboard", None)])
def test_a_forked_command_ends_as_a_fresh_one_does(tmp_path, how, code):
    fresh, forked = _both(tmp_path, {"PROBE_END": how}, *(["--details", "nosuch"] if how == "unknown" else []))
    assert forked.returncode == fresh.returncode and (code is None or fresh.returncode == code), \
        (fresh.returncode, forked.returncode, fresh.stderr[-800:], forked.stderr[-800:])
    assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]


def test_other_commands_go_through_subprocess():
    assert not launch._forkable([sys.executable, "-X", "importtime", "-m", "bench.cli", "list"], {})
    assert not launch._forkable(["bench", "list"], {})
    assert not launch._forkable([sys.executable, "-m", "bench.cli", "list"], {"preexec_fn": print})
    assert isinstance(launch.Popen(["true"]), subprocess.Popen)


def test_a_forked_python_c_program_sees_what_a_fresh_one_sees(tmp_path):
    import os

    code = ("import os, sys, __main__; print(sys.argv, repr(sys.path[0]), os.getcwd(), hasattr(__main__, '__file__'), "
            "__main__.__spec__, __name__); import bench; sys.exit(3)")
    argv = [sys.executable, "-c", code, "a", "b"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([launch.REPO, str(tmp_path)])}
    fresh = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert launch._forkable(argv, {"cwd": tmp_path, "env": env})
    forked = launch.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert fresh.returncode == forked.returncode == 3 and fresh.stdout == forked.stdout, (fresh, forked)
    assert fresh.stdout.startswith(f"['-c', 'a', 'b'] '' {tmp_path} False None __main__"), fresh.stdout


def test_a_forked_command_has_its_own_group_when_its_pid_is_known():
    """As ``subprocess.Popen`` returns after the child's ``setsid``: a test's ``os.killpg(pid, ...)`` at once reaches
    the command's group (the pid said before the setsid: ESRCH, the command left running, seen as a CI hang); a
    command of no session of its own is not in this process's group (a signal to its group never reaches pytest)."""
    import os

    code = "import time; time.sleep(30)"
    for _ in range(5):
        proc = launch.Popen([sys.executable, "-c", code], start_new_session=True)
        assert isinstance(proc, launch.Popen)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
    proc = launch.Popen([sys.executable, "-c", "import os; print(os.getpgid(0))"], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and int(out) != os.getpgid(0), out


MOUNTS_PROBE = """import os
for name in ("ro/f", "f"):
    try:
        with open(name, "a") as fh:
            fh.write("x")
        print(name, "written")
    except OSError as e:
        print(name, os.strerror(e.errno))
print("cwd", os.getcwd())
"""


def test_a_forked_command_with_mounts_sees_them_as_a_fresh_one_under_unshare_does(tmp_path):
    """``mounts``: the command's own mount namespace with the mounts made in its working folder (a read-only bind
    mount here), forked as under ``unshare -m``; this process's view of the folder unchanged."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None or \
            subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("a private mount namespace needs root and `unshare -m`")
    (tmp_path / "ro").mkdir()
    mounts = ["mount --bind ro ro", "mount -o remount,bind,ro ro"]
    argv = [sys.executable, "-c", MOUNTS_PROBE]
    env = {**os.environ, "PYTHONPATH": launch.REPO}
    assert launch._forkable(argv, {"cwd": tmp_path, "env": env, "mounts": mounts})
    forked = launch.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, mounts=mounts)
    fresh_argv, fresh_kwargs = launch._fresh(argv, {"cwd": tmp_path, "env": env, "mounts": mounts})
    assert fresh_argv[:2] == ["unshare", "-m"]
    fresh = subprocess.run(fresh_argv, capture_output=True, text=True, timeout=120, **fresh_kwargs)
    assert fresh.returncode == forked.returncode == 0, (fresh.stderr, forked.stderr)
    assert forked.stdout == fresh.stdout == f"ro/f Read-only file system\nf written\ncwd {tmp_path}\n", forked.stdout
    (tmp_path / "ro" / "f").write_text("still writable here")  # (the mount was the command's only)


NAMESPACE_PROBE = """
import os
print(open("f").read().strip(), os.getcwd())
open("g", "w").write("from the forked one")
"""


def test_commands_in_the_mount_namespace_of_a_holder_share_its_tmpfs(tmp_path):
    """``mount_namespace_of``: a forked command and then a fresh one (``nsenter -m``) in the namespace of a process
    holding a tmpfs over a folder: both see its files and each other's, in that folder; this process does not."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("nsenter") is None or \
            subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("a mount namespace of one's own needs root, `unshare -m` and `nsenter`")
    work = tmp_path / "w"
    work.mkdir()
    argv = [sys.executable, "-c", NAMESPACE_PROBE]
    env = {**os.environ, "PYTHONPATH": launch.REPO}
    mounts = [f"mount -t tmpfs -o size=64k tmpfs {work}", f"echo on-tmpfs > {work}/f"]
    with launch.mount_holder(tmp_path, mounts) as pid:
        assert launch._forkable(argv, {"cwd": work, "env": env, "mount_namespace_of": pid})
        forked = launch.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=120,
                            mount_namespace_of=pid)
        assert (forked.returncode, forked.stdout) == (0, f"on-tmpfs {work}\n"), forked.stderr[-2000:]
        fresh_argv, fresh_kwargs = launch._fresh(["cat", "f", "g"], {"cwd": work, "mount_namespace_of": pid})
        assert fresh_argv[:4] == ["nsenter", "-t", str(pid), "-m"]
        fresh = subprocess.run(fresh_argv, capture_output=True, text=True, timeout=60, **fresh_kwargs)
        assert (fresh.returncode, fresh.stdout) == (0, "on-tmpfs\nfrom the forked one"), fresh.stderr
        assert sorted(p.name for p in work.iterdir()) == []  # (here: the folder under the tmpfs, empty)
