"""`bench` processes for the tests, forked from a process that imported pobench once.

A test that runs ``python -m bench.cli ...`` (or ``python -m bench``) as a separate process, to send it a signal,
kill it, or see its exit code and lines, pays 5-8 CPU-seconds of imports (torch, MLflow, transformers) before the
command starts; the suite starts a few hundred such processes. :func:`run` and :class:`Popen` take the arguments of
``subprocess.run`` / ``subprocess.Popen`` and, for those commands (and the tests' scripts and ``python -c``
programs that import pobench), fork the process from a *zygote*: a process of this
test worker's that imported what `bench` imports and waits. The forked process is a process of its own like the one
``subprocess`` starts (its own pid, working folder, environment, standard streams, process group where
``start_new_session``), and runs the command as ``python -m`` does (``runpy``, ``__main__``, ``sys.argv``,
``sys.path[0]`` its working folder, the interpreter's exit: threads joined, ``atexit``, streams flushed, an uncaught
KeyboardInterrupt ends it by SIGINT); the imports are what it does not do again, as the product's own pool
workers fork from a forkserver that imported their modules (bench/workers.py), and a new MLflow store's migrations
(the zygote made one: a process's later stores are copies of its first, ``reports.record.create_store``).

A command is forked from a zygote that imported with the same values of the variables read while modules are
imported (``IMPORT_TIME_ENV``: the Hugging Face hub's offline switch, thread counts, ``PYTHON*``): one zygote per set of
values, up to ``MAX_ZYGOTES``. Anything else runs through ``subprocess`` as it is, and so do the tests whose subject is
the start of a process (they call ``subprocess`` themselves). ``POBENCH_TEST_FRESH=1`` runs every command through
``subprocess``. ``mounts=[shell commands]`` gives the command a private mount namespace with those mounts made in its
working folder first (``unshare -m``, forked or not: a read-only or full file system for root);
``mount_namespace_of=PID`` runs it in the mount namespace of process PID instead (``nsenter -m``: commands one after
another on the same small tmpfs, which a process of the test holds); ``file_size_limit=N`` its ``ulimit -f``.
tests/test_launch.py holds a forked command to what a fresh one sees and how it ends.

Each forked process's CPU seconds (its own and its children's) reach this worker's ``RUSAGE_CHILDREN`` when the zygote
ends (at the end of the worker), and :data:`CHILD_CPU` at once (the per-test CPU log of tests/conftest.py adds it)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("bench", "bench.cli")  # `python -m <one of these> ...` is forked from the zygote
#: and `python <one of these> ...`
SCRIPTS = tuple(os.path.join(REPO, "tests", "bench", f) for f in ("fake_trainer.py", "tune_worker.py"))
# and `python -c CODE ...` (the tests' programs that import pobench: a notebook's use of it, a fault set up first)
#: variables read while modules are imported (their values are then fixed in the zygote's modules)
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "TORCH", "OMP_", "MKL_", "OPENBLAS", "CUDA", "PYTHON",
                   "TOKENIZERS", "LD_", "TRL_", "ACCELERATE_", "RAY_", "MPL", "TQDM", "NUMEXPR")
#: what the zygote imports: `bench`'s command line, the native engine with transformers' Llama, MLflow's client, Optuna
PRELOAD = ("bench.cli.main", "bench.engines.native.loop", "transformers.models.llama.modeling_llama",
           "mlflow.tracking", "optuna", "tests.bench.fake_trainer")
CHILD_CPU = [0.0]  # CPU seconds of the forked processes that ended (their children's included)


def _path_entries(env: dict[str, str]) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


class _Zygote:
    """A zygote of this process, for commands whose variables read at import are those of ``env``: started at the
    first such command, ended at exit."""

    def __init__(self, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="pobench-zygote-")
        self.address = os.path.join(self.dir, "socket")
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-c", "from tests.launch import _serve; _serve()", self.address,
                                      *PRELOAD], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env,
                                      start_new_session=True)  # (a command signalling its group: never pytest)
        ready = self.proc.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the tests' zygote did not start (exit {self.proc.wait()})")
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # (it waits for the processes still running, then ends)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


_ZYGOTES: dict[frozenset, _Zygote] = {}


def close_all() -> None:
    """End this process's zygotes and reap them (tests/conftest.py: when pytest ends, before the worker's own exit,
    so their CPU counts in the suite's)."""
    for zygote in list(_ZYGOTES.values()):
        zygote.close()
    _ZYGOTES.clear()
MAX_ZYGOTES = 3  # (a command of yet other import-time variables starts through ``subprocess``)


def _key(env: dict[str, str]) -> frozenset:
    return frozenset((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) and k != "PYTHONPATH")


def _zygote(env: dict[str, str]) -> _Zygote:
    key = _key(env)
    if key not in _ZYGOTES or _ZYGOTES[key].proc.poll() is not None:
        _ZYGOTES[key] = _Zygote(env)
    return _ZYGOTES[key]


def _forkable(args, kwargs: dict) -> bool:
    if os.environ.get("POBENCH_TEST_FRESH") == "1" or not isinstance(args, (list, tuple)):
        return False
    args = [str(a) for a in args]
    if len(args) < 2 or args[0] != sys.executable:
        return False
    if not (args[1] == "-m" and args[2:3] and args[2] in MODULES or args[1] in SCRIPTS or args[1] == "-c"
            and args[2:3]):
        return False
    if set(kwargs) - {"cwd", "env", "stdin", "stdout", "stderr", "text", "universal_newlines", "start_new_session",
                      "encoding", "errors", "mounts", "mount_namespace_of", "file_size_limit"}:
        return False
    env = dict(kwargs.get("env") or os.environ)
    return _key(env) in _ZYGOTES or len(_ZYGOTES) < MAX_ZYGOTES


def _stream(spec, mode: str, fds: list[int], keep: list[int]):
    """The fd the forked process gets for one standard stream (None: inherit /dev/null for stdin, this process's for
    the others), and this side's end of a pipe (or None)."""
    if spec == PIPE:
        r, w = os.pipe()
        child, ours = (r, w) if mode == "r" else (w, r)
        fds.append(child)
        keep.append(child)
        return ours
    if spec == DEVNULL or (spec is None and mode == "r"):
        fd = os.open(os.devnull, os.O_RDONLY if mode == "r" else os.O_WRONLY)
        fds.append(fd)
        keep.append(fd)
    elif spec is None:
        fds.append(0 if mode == "r" else (1 if not fds[1:] else 2))
    elif isinstance(spec, int):
        fds.append(spec)
    else:
        fds.append(spec.fileno())
    return None


def _fresh(args, kwargs: dict) -> tuple[list, dict]:
    """The ``subprocess`` arguments of a command that is not forked: one with ``mounts`` runs under ``unshare -m``, the
    mounts made by a shell in its working folder before the command's ``exec``; one with ``mount_namespace_of`` under
    ``nsenter -m`` first (the order a forked one takes them in, :func:`_command`); ``file_size_limit`` is set in the
    child before its ``exec`` (``ulimit -f``)."""
    kwargs = dict(kwargs)
    mounts, limit = kwargs.pop("mounts", None), kwargs.pop("file_size_limit", None)
    holder = kwargs.pop("mount_namespace_of", None)
    if limit is not None:
        kwargs["preexec_fn"] = lambda: _limit_file_size(limit)
    if mounts:
        script = " && ".join([*mounts, 'cd "$PWD"', 'exec "$@"'])  # (the folder entered again: a mount over it is seen)
        args = ["unshare", "-m", "sh", "-c", script, "sh", *[str(a) for a in args]]
    if holder is not None:
        where = os.path.abspath(kwargs.get("cwd") or os.getcwd())
        args = ["nsenter", "-t", str(holder), "-m", f"--wdns={where}", "--", *[str(a) for a in args]]
    return args, kwargs


class Popen:
    """``subprocess.Popen`` for a `bench` command: forked from the zygote where it can be (:func:`_forkable`), else
    ``subprocess.Popen`` itself (its attributes are then that object's)."""

    def __new__(cls, args, **kwargs):
        if not _forkable(args, kwargs):
            args, kwargs = _fresh(args, kwargs)
            return subprocess.Popen(args, **kwargs)
        return super().__new__(cls)

    def __init__(self, args, **kwargs) -> None:
        self.args, self.returncode, self._status = list(args), None, None
        text = kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding") is not None
        fds: list[int] = []
        close_after: list[int] = []
        ends = [_stream(kwargs.get("stdin"), "r", fds, close_after),
                _stream(kwargs.get("stdout"), "w", fds, close_after)]
        if kwargs.get("stderr") == STDOUT:
            fds.append(fds[1])
            ends.append(None)
        else:
            ends.append(_stream(kwargs.get("stderr"), "w", fds, close_after))
        env = dict(kwargs.get("env") or os.environ)
        how = str(self.args[1])
        request = {"module": str(self.args[2]) if how == "-m" else None, "code": str(self.args[2]) if how == "-c"
                   else None, "script": how if how not in ("-m", "-c") else None,
                   "argv": [str(a) for a in self.args[3 if how in ("-m", "-c") else 2:]],
                   "cwd": os.path.abspath(kwargs.get("cwd") or os.getcwd()),
                   "env": env, "new_session": bool(kwargs.get("start_new_session")),
                   "mounts": list(kwargs.get("mounts") or ()), "file_size_limit": kwargs.get("file_size_limit"),
                   "mount_namespace_of": kwargs.get("mount_namespace_of")}
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(_zygote(env).address)
        socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
        for fd in close_after:
            os.close(fd)
        self._buf = b""
        self.pid = int(self._message())

        def wrap(fd, mode):
            if fd is None:
                return None
            if text:
                return open(fd, mode, encoding=kwargs.get("encoding") or "utf-8",
                            errors=kwargs.get("errors") or "strict")
            return open(fd, mode + "b")

        self.stdin, self.stdout, self.stderr = wrap(ends[0], "w"), wrap(ends[1], "r"), wrap(ends[2], "r")

    def _message(self, timeout: float | None = None) -> str | None:
        """The next line the zygote's waiter sends (None: none within ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._sock], [], [], left)[0]:
                return None
            chunk = self._sock.recv(4096)
            if not chunk:
                raise RuntimeError(f"the tests' zygote lost the process {getattr(self, 'pid', '?')}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        if self.returncode is None:
            line = self._message(0)
            if line is not None:
                status = json.loads(line)
                self.returncode = status["returncode"]
                CHILD_CPU[0] += status["cpu"]
                self._sock.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._message(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._buf = line.encode() + b"\n" + self._buf
            self.poll()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input=None, timeout: float | None = None):
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        out: dict[str, object] = {}

        def read(name):
            stream = getattr(self, name)
            out[name] = stream.read()
            stream.close()

        readers = [threading.Thread(target=read, args=(n,), daemon=True) for n in ("stdout", "stderr")
                   if getattr(self, n) is not None and not getattr(self, n).closed]
        for t in readers:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return out.get("stdout"), out.get("stderr")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for s in (self.stdout, self.stderr, self.stdin):
            if s is not None and not s.closed:
                s.close()
        self.wait()


def run(args, *, input=None, capture_output: bool = False, timeout: float | None = None, check: bool = False,
        **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` for a `bench` command (forked from the zygote where it can be)."""
    if capture_output:
        kwargs["stdout"], kwargs["stderr"] = PIPE, PIPE
    if input is not None:
        kwargs["stdin"] = PIPE
    if not _forkable(args, kwargs):
        args, kwargs = _fresh(args, kwargs)
        return subprocess.run(args, input=input, timeout=timeout, check=check, **kwargs)
    with Popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


# --- the zygote's side ---------------------------------------------------------------------------------------------


def _serve() -> None:
    """The zygote: import ``sys.argv[2:]``, then fork one process per request on the socket ``sys.argv[1]`` until
    its standard input closes; then wait for the processes still running."""
    import importlib

    address, preload, parent = sys.argv[1], sys.argv[2:], os.getppid()
    for name in preload:
        importlib.import_module(name)
    _warm_store_template()
    import gc

    gc.collect()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    waiters: set[int] = set()
    while True:
        for pid in list(waiters):
            if os.waitpid(pid, os.WNOHANG)[0]:
                waiters.discard(pid)
        ready = select.select([listener, sys.stdin], [], [], 1.0)[0]
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            break
        if listener in ready:
            conn, _ = listener.accept()
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                _waiter(conn, json.loads(msg), fds)  # (never returns)
            conn.close()
            for fd in fds:
                os.close(fd)
            waiters.add(pid)
    for pid in waiters:  # (a command a test left running is killed by its waiter now: reaped, its CPU counted; an
        if not os.waitpid(pid, os.WNOHANG)[0]:  # xdist worker does not wait long for this process at its end)
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
    if os.environ.get("POBENCH_ZYGOTE_LOG"):  # (to check the CPU accounting: an orphaned zygote is counted nowhere)
        import resource

        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(os.environ["POBENCH_ZYGOTE_LOG"], "a") as fh:
            fh.write(f"parent {parent} now {os.getppid()} cpu {own.ru_utime + own.ru_stime:.1f} "
                     f"children {kids.ru_utime + kids.ru_stime:.1f}\n")


def _warm_store_template() -> None:
    """One empty MLflow store made by pobench in the zygote, so that the commands forked from it make theirs as a
    process's later stores are made (``reports.record.create_store``: a copy of its first), not each by MLflow's
    migrations (1-3 CPU-seconds); the migrations themselves run in every fresh process."""
    import shutil

    try:
        from reports.record import create_store
    except ImportError:  # (a zygote of other imports)
        return
    folder = tempfile.mkdtemp(prefix="pobench-zygote-store-")
    try:
        create_store(os.path.join(folder, "mlflow.db"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _waiter(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """A process between the zygote and the command's: forks the command's, says its pid, waits for its end and
    says how it ended (exit code, or minus the signal, as ``subprocess`` does) and its CPU seconds."""
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # (the zygote's standard input is its lifeline, not ours)
        started_r, started_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(started_r)
            _command(request, fds, started_w)  # (never returns)
        os.close(started_w)
        for fd in fds:
            os.close(fd)
        # (the pid is said once the command has its own session, as subprocess.Popen returns after the child's setsid
        # and exec: a test's os.killpg(pid, ...) at once reaches its group, not nothing or the zygote's)
        os.read(started_r, 1)
        os.close(started_r)
        conn.sendall(f"{pid}\n".encode())
        # (the zygote ending with the command still running: it is killed, then reaped here)
        signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
        _, status, usage = os.wait4(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        cpu = usage.ru_utime + usage.ru_stime
        conn.sendall((json.dumps({"returncode": code, "cpu": cpu}) + "\n").encode())
    finally:
        os._exit(0)


def _command(request: dict, fds: list[int], started: int) -> None:
    """The command's process: its session, streams, working folder, environment and ``sys.path`` as a fresh
    ``python -m`` gets them, then the module run as ``__main__`` and the interpreter's exit."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        os.write(started, b"s")
        os.close(started)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(s, signal.SIG_IGN if s == signal.SIGPIPE else signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request.get("mount_namespace_of") is not None:
            _join_mounts(request["mount_namespace_of"])
        if request.get("mounts"):
            _private_mounts(request["mounts"], request["cwd"])
        os.chdir(request["cwd"])  # (after the mounts: one over this folder is what the command sees)
        if request.get("file_size_limit") is not None:
            _limit_file_size(request["file_size_limit"])
        env = request["env"]
        old_entries = _path_entries(os.environ)
        os.environ.clear()
        os.environ.update(env)
        rest = [p for p in sys.path[1:] if p not in old_entries]
        script, code_text = request["script"], request["code"]
        first = os.path.dirname(script) if script else "" if code_text is not None else request["cwd"]
        sys.path[:] = [first, *_path_entries(env), *rest]
        import random

        random.seed()
        # (runpy puts the module's file first, as `python -m` does)
        sys.argv = [script or ("-c" if code_text is not None else "-m"), *request["argv"]]
        import runpy

        try:
            if script:
                runpy.run_path(script, run_name="__main__")
            elif code_text is not None:  # `python -c`: a new __main__ without a file or spec
                import builtins
                import types

                main = types.ModuleType("__main__")
                main.__builtins__ = builtins
                sys.modules["__main__"] = main
                exec(compile(code_text, "<string>", "exec"), main.__dict__)
            else:
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = _exit_code(e.code)
        except KeyboardInterrupt:
            _finish()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        _finish()
    finally:
        os._exit(code)


CLONE_NEWNS = 0x00020000  # (linux/sched.h: a mount namespace, for unshare and setns)


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _private_mounts(mounts: list[str], cwd: str) -> None:
    """The command's own mount namespace (what ``unshare -m`` makes: a copy of the zygote's, its changes private),
    then each shell command of ``mounts`` run in ``cwd`` (a read-only bind mount, a small tmpfs: the faults of a
    read-only or full disk for a root that permissions do not stop)."""
    import ctypes

    if _libc().unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    for command in mounts:
        subprocess.run(["sh", "-c", command], cwd=cwd, check=True)


@contextlib.contextmanager
def mount_holder(cwd, mounts: list[str]):
    """A process in a mount namespace of its own (``unshare -m``) with ``mounts`` (shell commands) made in ``cwd``,
    alive until the block ends: its pid, for ``mount_namespace_of`` (a tmpfs that several commands in a row use)."""
    script = " && ".join([*mounts, "echo ready", "exec sleep 3600"])
    holder = subprocess.Popen(["unshare", "-m", "sh", "-c", script], cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            raise RuntimeError(f"mounts {mounts} failed: {holder.communicate(timeout=30)[1][-2000:]}")
        yield holder.pid
    finally:
        holder.kill()
        holder.communicate()


def _join_mounts(pid: int) -> None:
    """This process into the mount namespace of process ``pid`` (what ``nsenter -t PID -m`` does; this process is
    single-threaded, as the kernel asks; its working folder is set after)."""
    import ctypes

    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    try:
        if _libc().setns(fd, CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), f"setns(mount namespace of {pid})")
    finally:
        os.close(fd)


def _limit_file_size(limit: int) -> None:
    """``ulimit -f``: a write past ``limit`` bytes fails with EFBIG (Python ignores SIGXFSZ)."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _finish() -> None:
    """What the interpreter does at its exit: join the threads, run ``atexit``, flush the streams."""
    try:
        threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass
