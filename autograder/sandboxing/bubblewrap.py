"""Where student notebooks run: Debian's bubblewrap, resource limits, a warm interpreter.

The trusted side of the sandbox. Each grading thread keeps one ``WarmSandbox``: a
bubblewrap sandbox around ``python -m autograder.sandboxing.zygote``, an interpreter that
has imported torch and the kernel machinery once and forks a fresh kernel for
every notebook. The sandbox has

- no network (its own network namespace, only a loopback device);
- a read-only system: /usr, the Python installation and the virtual
  environment, the kernel side ``course_checks`` and the widgets with their data, of the
  grader's package only what the warm interpreter runs (``ZYGOTE_NEEDS``: no catalogue, no
  judge, no reference code), the course's ``assets/``; nothing else of the course, so no
  ``solutions/``, and none of the class's data (``coursework/``: gradebook, submissions,
  feedback);
- a private /tmp and notebook working folder (size-limited tmpfs), emptied
  before every notebook, and the worker's socket folder, read-only once the
  kernel is up;
- its own process namespace, and (when run as root) its own unprivileged
  user per worker, so the process-count limit of one notebook never reaches
  another worker; each kernel in namespaces of its own below the warm
  interpreter (``zygote``), so it cannot change what forks it;
- per-kernel limits (``Limits``): address space, CPU time, file size, process
  count; wall-clock limits per cell and per notebook are the executor's job.

``worker.execute.SandboxKernelManager`` makes such a forked kernel look like any
Jupyter kernel to nbclient. ``probe()`` says why the sandbox cannot start here, if it
cannot; the grader then refuses to run unless told to grade unsandboxed, in
which case the same zygote runs as a plain process (limits, but no isolation).
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).resolve().parents[1]  # autograder/, code only
ZYGOTE_NEEDS = ("__init__.py", "sandboxing")  # the parts of it the sandbox sees
SANDBOX_UID = 61000  # + worker slot, when the grader runs as root
HOST_BASE = "/run/grading"  # where the host's sandbox sees every worker's folder
# Imported once per worker, before any notebook: what every graded kernel needs.
PRELOAD = [
    "numpy",
    "torch",
    "torch.nn",
    "torch.nn.functional",
    # torch.broadcast_shapes imports it (and sympy) on its first call: 0.25 s and 30 MB in each kernel
    "torch.fx.experimental.symbolic_shapes",
    "IPython",
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    # what starting a kernel app imports on its way (else each kernel imports it again)
    "ipykernel.debugger",
    "IPython.core.debugger",
    "IPython.core.completerlib",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "IPython.core.logger",
    "sqlite3",
    "faulthandler",
    "http.server",
    "xmlrpc.server",
    "tornado.platform.asyncio",
    "tornado.queues",
    "encodings.idna",
    # jupyter_client reads the machine's addresses with it while the kernel app reads its connection file
    "psutil",
    "matplotlib",
    "matplotlib.pyplot",
    "matplotlib_inline.backend_inline",
    "ipywidgets",
    "ipympl.backend_nbagg",
    # what the course's notebooks import as they run, seen in the graded notebooks' sys.modules (the
    # %matplotlib magic's modules, torch's serialization and device context, tqdm's notebook bars,
    # Pillow's image formats, 07's and 08's): in each kernel, each notebook paid for them again
    "IPython.core.magic_arguments",
    "IPython.core.magics.ast_mod",
    "IPython.core.magics.execution",
    "IPython.core.magics.pylab",
    "IPython.utils.module_paths",
    "torch._subclasses.schema_check_mode",
    "torch.utils._device",
    "torch.utils.serialization",
    "tqdm.auto",
    "tqdm.notebook",
    "multiprocessing.synchronize",
    "importlib.resources.readers",
    "importlib.readers",
    "PIL.BmpImagePlugin",
    "PIL.GifImagePlugin",
    "PIL.JpegImagePlugin",
    "PIL.PpmImagePlugin",
    "zmq.utils.garbage",
    "encodings.utf_16_be",
    # the kernel side's stateless modules, and the snapshot (taken here, before any notebook);
    # ``course_checks.checks`` reads the kernel's own environment, so each kernel imports it
    "course_checks.trusted",
    "course_checks.verdict",
    "course_checks.cases",
    "course_checks.scripts",
    "course_checks.probes",
    "course_checks.modules",
    "course_checks.proxies",
    "course_checks.course",
]


@dataclass(frozen=True)
class Limits:
    """What one notebook may use. Memory is beyond the warm interpreter's own."""

    cell_seconds: float = 30.0  # wall clock per cell (nbgrader's Execute.timeout)
    notebook_seconds: float = 600.0  # wall clock for the whole notebook, replays included
    memory_mb: int = 2048  # address space a kernel may add
    cpu_seconds: int = 900  # CPU time of a kernel process
    processes: int = 96  # processes and threads of the sandbox's user
    file_mb: int = 64  # largest file a notebook may write
    scratch_mb: int = 512  # private /tmp and working folder, each
    output_mb: float = 2.0  # printed output kept per cell
    restarts: int = 4  # fresh kernels per notebook after hangs and crashes


_claimed: dict[int, int] = {}


def claim_slot(limit: int = 512) -> int:
    """A worker slot no other grading process on this machine holds (while this process lives).

    The slot names the sandbox's own user (``SANDBOX_UID`` + slot, as root), so
    two grading processes on one machine (a local run's pool, several Dask
    workers) never share a process-count limit. Each slot is an exclusive lock
    on a file; the kernel releases it when the process ends, however it ends.
    """

    folder = Path(tempfile.gettempdir()) / f"autograder-slots-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    for slot in range(limit):
        if slot in _claimed:
            continue
        handle = os.open(folder / f"{slot}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(handle)
            continue
        _claimed[slot] = handle
        return slot
    raise SandboxUnavailable(f"all {limit} grading slots of this machine are taken")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot start on this machine; the message says why."""


def _bwrap() -> str | None:
    return shutil.which("bwrap")


def _python_roots() -> list[Path]:
    """Folders the interpreter and its packages live in (read-only in the sandbox)."""
    roots = {
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.exec_prefix),
        Path(os.path.realpath(sys.executable)).parent.parent,
    }
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.is_dir() and ("site-packages" in path.parts or "dist-packages" in path.parts):
            roots.add(path)
    kept = []
    for root in sorted(roots, key=lambda p: len(p.parts)):
        if root.exists() and not any(root.is_relative_to(k) for k in kept) and root != Path("/"):
            kept.append(root)
    return [r for r in kept if not r.is_relative_to(Path("/usr"))]


def _package_folder(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def _etc_files() -> list[Path]:
    names = ["ld.so.cache", "ld.so.conf", "localtime", "nsswitch.conf", "passwd", "group", "hosts", "fonts"]
    return [Path("/etc") / n for n in names if (Path("/etc") / n).exists()]


def read_only_binds(course_root: Path) -> list[tuple[str, Path | None, Path]]:
    """What the sandbox sees of this machine besides /usr: (kind, source, destination), in the
    order bubblewrap mounts them (a later mount lies over an earlier one; source None for a
    mount of nothing, an empty folder)."""
    binds: list[tuple[str, Path, Path]] = []
    for path in _etc_files():
        binds.append(("--ro-bind", path, path))
    for root in _python_roots():
        binds.append(("--ro-bind", root, root))
    # Of the grader's package, only what the warm interpreter runs (``python -m
    # autograder.sandboxing.zygote``), on an empty read-only folder that hides the rest (also
    # when the package is installed in the environment mounted above): the catalogues, the
    # judge and the reference code are not even importable in the sandbox. The class's data is
    # in coursework/, never here.
    binds.append(("--tmpfs", None, PACKAGE))
    for part in ZYGOTE_NEEDS:
        binds.append(("--ro-bind", PACKAGE / part, PACKAGE / part))
    binds.append(("--remount-ro", None, PACKAGE))
    for name in ("course_checks", "course_widgets"):
        folder = _package_folder(name)
        if folder is not None:
            binds.append(("--ro-bind", folder, folder))
    # The course's data beside the notebooks, if it has any (the widgets' own data, notebook 07's
    # corpus, is package data inside course_widgets/, bound above)
    assets = course_root / "assets"
    if assets.is_dir():
        binds.append(("--ro-bind", assets, assets))
    return binds


def bwrap_command(
    course_root: Path,
    run_dir: Path | None,
    notebooks_dir: Path,
    limits: Limits,
    command: list[str],
    as_root: bool,
    host_base: Path | None = None,
) -> list[str]:
    """The bubblewrap command line around ``command``: one worker's sandbox (``run_dir`` its
    folder), or the host's (``host_base``: every worker's folder, mounted at ``HOST_BASE``)."""
    args = [
        _bwrap() or "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "grading",
    ]
    if as_root:
        # No user namespace: the zygote drops to its own uid itself, which needs these two.
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        if host_base is not None:  # and the host makes each worker's namespaces and mounts
            args += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_NET_ADMIN"]
    else:
        args += ["--unshare-user"]
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    binds = read_only_binds(course_root)
    # Folders bwrap creates on its way to a mount point are root-only by default.
    folders = sorted(
        {parent for _, _, dest in binds for parent in dest.parents}
        | set(notebooks_dir.parents)
        | set(run_dir.parents if run_dir is not None else ()),
        key=lambda p: len(p.parts),
    )
    args += ["--proc", "/proc", "--dev", "/dev"]
    scratch = str(limits.scratch_mb * 1024 * 1024)
    args += ["--perms", "1777", "--size", scratch, "--tmpfs", "/tmp"]
    for folder in folders:
        if str(folder) in ("/", "/usr", "/tmp", "/etc", "/proc", "/dev") or folder.is_relative_to("/usr"):
            continue
        if folder == Path("/tmp") or folder.is_relative_to("/proc"):
            continue
        args += ["--perms", "0755", "--dir", str(folder)]
    for kind, source, dest in binds:
        args += [kind, str(dest)] if source is None else [kind, str(source), str(dest)]
    args += ["--perms", "1777", "--size", scratch, "--tmpfs", str(notebooks_dir)]
    if host_base is not None:
        args += ["--bind", str(host_base), HOST_BASE]
    else:
        args += ["--bind", str(run_dir), str(run_dir)]
    args += [
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        "--chdir",
        "/tmp",
        "--",
        *command,
    ]
    return args


def kernel_environment(socket_path: str | None) -> dict:
    """The environment of every graded kernel."""
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/tmp/home",
        "TMPDIR": "/tmp",
        "IPYTHONDIR": "/tmp/home/.ipython",
        "MPLCONFIGDIR": "/tmp/home/.matplotlib",
        "JUPYTER_RUNTIME_DIR": "/tmp/home/.jupyter",
        "JUPYTER_PLATFORM_DIRS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "NBGRADER_EXECUTION": "autograde",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    if socket_path:
        env["AUTOGRADER_VERDICTS"] = socket_path
    return env


def interpreter_environment() -> dict:
    """The warm interpreter's own environment (its kernels get ``kernel_environment``'s)."""
    env = kernel_environment(None)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    return env


def _rebind(binds) -> list[str]:
    """The folders under /tmp that a forked worker mounts again from the host's view: each
    outermost one once (what lies over or inside it comes along)."""
    under = [dest for _, _, dest in binds if dest.is_relative_to("/tmp") and dest != Path("/tmp")]
    folders = dict.fromkeys(dest for dest in under if not dest.is_file())
    return [str(dest) for dest in folders if not any(parent in folders for parent in dest.parents)]


class WarmSandbox:
    """One worker's warm interpreter (``zygote.Zygote``), in its sandbox (or not, when unsandboxed).

    ``limits`` are the sandbox's own (process count, scratch size), fixed when it
    starts; each notebook's limits (time, memory, CPU, file size) travel with its
    job to ``worker.execute.ContainedExecute`` and the kernel it spawns.
    """

    def __init__(
        self,
        slot: int,
        course_root: Path,
        limits: Limits,
        sandboxed: bool = True,
        base_dir: Path | None = None,
        host: HostAddress | None = None,
    ):
        self.slot = slot
        self.course_root = Path(course_root).resolve()
        self.limits = limits
        self.sandboxed = sandboxed
        self.as_root = os.geteuid() == 0
        # Forked by the run's host (``SandboxHost``, its socket) rather than started alone in bubblewrap.
        self.host = host if host and sandboxed and self.as_root else None
        self.uid = SANDBOX_UID + slot if self.as_root else None
        base = Path(base_dir or tempfile.mkdtemp(prefix="ag-"))
        self.base = base
        self.run_dir = base / f"w{slot}"
        self.notebooks_dir = self.course_root / "notebooks"
        self.process: subprocess.Popen | None = None
        self.info: dict = {}
        self.retired = 0  # sandboxes given up because their state could not be trusted
        self.launches = 0  # sandboxes started: 1 as long as every notebook left this one reusable
        self._interpreter_pid: int | None = None  # the warm interpreter, as this machine numbers it

    # ------------------------------------------------------------ lifecycle
    def _config(self) -> dict:
        processes = self.limits.processes
        if self.sandboxed and not self.as_root:
            # Our own uid counts every process we already run; leave the notebook its allowance on top.
            processes += _processes_of(os.getuid())
        config = {
            "uid": self.uid if self.sandboxed else None,
            "gid": self.uid if self.sandboxed else None,
            "processes": processes if self.sandboxed else None,
            "kernel_processes": self.limits.processes,  # counted in the kernel's own user namespace
            "scratch_bytes": self.limits.scratch_mb * 1024 * 1024,
            "preload": PRELOAD,
            "env": interpreter_environment(),
            "pid_namespace": self.sandboxed,
            "wipe": ["/tmp", str(self.notebooks_dir)] if self.sandboxed else [],
            # The clean-up between notebooks leaves the grader's folders and every mount point alone
            # (a checkout or a virtualenv under /tmp is mounted inside the sandbox's /tmp)
            "keep": [str(self.base), *(str(dest) for _, _, dest in read_only_binds(self.course_root))],
        }
        if self.host is not None:  # what the forked interpreter mounts in its own namespaces
            config.update(
                {
                    "run_dir": str(self.run_dir),
                    "inside": f"{HOST_BASE}/{self.run_dir.name}",
                    "host_base": HOST_BASE,
                    "log": f"{HOST_BASE}/w{self.slot}.log",
                    # where this process may run (one processor, when its lane is pinned): the host
                    # forks the interpreter, which does not inherit it as a child of this process would
                    "processors": sorted(os.sched_getaffinity(0)),
                    "notebooks_dir": str(self.notebooks_dir),
                    "rebind": _rebind(read_only_binds(self.course_root)),
                }
            )
        return config

    def work_dir(self, assignment: str) -> Path:
        """The notebook's working folder: where the released notebook would sit, in the
        sandbox's private tmpfs (so relative paths such as ../../assets work); a scratch
        folder when unsandboxed."""
        if self.sandboxed:
            return self.notebooks_dir / assignment
        return self.run_dir / "work" / assignment

    def command(self) -> list[str]:
        inner = [sys.executable, "-s", "-m", "autograder.sandboxing.zygote", json.dumps(self._config())]
        if not self.sandboxed:
            return inner
        return bwrap_command(self.course_root, self.run_dir, self.notebooks_dir, self.limits, inner, self.as_root)

    def own(self, path: Path, writable: bool = True) -> None:
        """Let the sandbox's user write ``path`` (or take that right back).

        Only as root can the right be taken back: otherwise the notebook runs
        as our own user and could give it back to itself.
        """
        if self.as_root and self.uid is not None and self.sandboxed:
            os.chown(path, self.uid if writable else 0, self.uid if writable else 0)
            os.chmod(path, 0o755 if writable else 0o555)
        else:
            os.chmod(path, 0o755)

    def start(self, timeout: float = 300.0) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the sandbox; it warms up while the caller does other work (``wait_ready``)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)
        self.own(self.run_dir, writable=False)
        self.launches += 1
        if self.host is not None:
            return  # the host forks it when ``wait_ready`` asks
        log = open(self.base / f"w{self.slot}.log", "ab")
        env = {**os.environ, "OMP_NUM_THREADS": "1"} if not self.sandboxed else None
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            cwd=str(self.run_dir),
            start_new_session=True,
        )
        log.close()

    def wait_ready(self, timeout: float = 300.0) -> None:
        if self.host is not None and self.process is None:
            try:
                self.process = HostedInterpreter.ask(self.host, self._config(), self.uid, timeout)
                self._interpreter_pid = self.process.pid
                self.info = self.process.ready
                return
            except (OSError, ValueError) as error:
                # Without its host (it could not start, or it died), the worker starts a sandbox of its own.
                with open(self.base / f"w{self.slot}.log", "a") as log:
                    log.write(f"no interpreter from the sandbox host ({error}); this worker starts its own\n")
                self.host = None
                self.launch()
        line = self._read(timeout)
        if not line:
            self.close()
            raise SandboxUnavailable(f"the grading sandbox did not start: {self.log_tail()}")
        self.info = json.loads(line)

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = (self.base / f"w{self.slot}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def _read(self, timeout: float) -> str:
        """One line from the interpreter within ``timeout`` seconds (empty if none); meanwhile the
        interpreter is woken up again and again, should a kernel keep stopping it."""
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return ""
            ready, _, _ = select.select([self.process.stdout], [], [], min(left, 0.05))
            if ready:
                return self.process.stdout.readline().decode("utf-8")
            if self.info:  # once it is up (the first line is its own "ready")
                self._wake()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ensure(self) -> None:
        """Start, or restart when the interpreter cannot prove it is sane (a notebook killed,
        stopped or confused it): a worker in doubt is replaced, never reused."""
        if not self.sane():
            self.close()
            self.start()

    def close(self) -> None:
        self._interpreter_pid = None
        if isinstance(self.process, HostedInterpreter):
            self.process.close()  # pid 1 of its namespaces: everything it started goes with it
            self.process = None
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (self.process.stdin, self.process.stdout):
                try:
                    stream.close()
                except Exception:
                    pass
            self.process = None

    # ------------------------------------------------------------ requests
    def request(self, op: str, timeout: float = 30.0, **fields) -> dict:
        """One request to the warm interpreter and its answer.

        A kernel runs as the same user as the interpreter that forked it, so it
        can stop, signal or kill it. Every request carries a fresh random id and
        only the reply with that id counts; a reply that does not come in time,
        or does not fit, means the interpreter's state can no longer be trusted:
        the sandbox is retired on the spot (its kernel and files with it), never
        asked again, and the next notebook gets a fresh one.
        """
        if not self.alive():
            raise SandboxGone("the sandbox's interpreter is gone")
        assert self.process is not None and self.process.stdin is not None
        self._wake()
        nonce = secrets.token_hex(8)
        try:
            self.process.stdin.write((json.dumps({"op": op, "id": nonce, **fields}) + "\n").encode("utf-8"))
            self.process.stdin.flush()
        except OSError as error:
            self.close()
            raise SandboxGone(f"the sandbox's interpreter is gone ({error})") from None
        line = self._read(timeout)
        try:
            reply = json.loads(line) if line else None
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or reply.get("id") != nonce:
            self.retired += 1
            self.close()
            raise SandboxGone(f"the sandbox's interpreter did not answer {op} in step; it was replaced")
        if not reply.get("ok"):
            raise RuntimeError(f"sandbox request {op} failed: {reply.get('error')}")
        return reply

    def _wake(self) -> None:
        """Let the interpreter run if a kernel stopped it (SIGSTOP): a stop costs nothing then."""
        if isinstance(self.process, HostedInterpreter):
            return  # pid 1 of its own namespace: nothing inside can stop it
        if self._interpreter_pid is None and self.process is not None:
            self._interpreter_pid = _descendant_running(self.process.pid, "autograder.sandboxing.zygote")
        if self._interpreter_pid is not None:
            try:
                os.kill(self._interpreter_pid, signal.SIGCONT)
            except OSError:
                pass

    def sane(self) -> bool:
        """Whether the interpreter answers, in step, as the process that started (else it is retired)."""
        if not self.alive():
            return False
        try:
            reply = self.request("ping", timeout=15)
        except (SandboxGone, RuntimeError):
            self.close()
            return False
        if reply.get("pid") != self.info.get("pid"):
            self.close()
            return False
        return True

    def reset(self, pid: int | None, timeout: float = 120.0) -> dict:
        """Kill every process of the notebook and wipe its private folders; a clean-up that
        cannot prove it removed everything, or an interpreter whose limits, priority, CPUs,
        out-of-memory score or IPC namespace changed, retires the sandbox (its tmpfs goes with it)."""
        try:
            reply = self.request("reset", timeout=timeout, pid=pid)
        except RuntimeError:  # the interpreter failed to reset: nothing of it is reused
            reply = {"clean": False}
        if not reply.get("clean", True):
            self.retired += 1
            if reply.get("changed"):
                self._log(f"replaced: the interpreter's {', '.join(reply['changed'])} changed during a notebook")
            self.close()
        return reply

    def _log(self, line: str) -> None:
        with open(self.base / f"w{self.slot}.log", "a") as log:
            log.write(line + "\n")


class HostedInterpreter:
    """A worker's interpreter that the host forked: the part of a ``Popen`` that ``WarmSandbox`` uses.

    It speaks on a socket instead of stdin/stdout, and it is known by a pidfd
    (its pid as this machine numbers it comes with the credentials the kernel
    attaches to its first line), so it is never confused with a later process.
    """

    def __init__(self, channel, pid: int, ready: dict):
        self.channel, self.pid, self.ready = channel, pid, ready
        self.pidfd = os.pidfd_open(pid)
        self.stdin = channel.makefile("wb")
        self.stdout = channel.makefile("rb")

    @classmethod
    def ask(cls, host: HostAddress, config: dict, uid: int | None, timeout: float) -> HostedInterpreter:
        """Connect to the host (waiting while it warms up), send the worker's configuration, and
        read the forked interpreter's first line."""

        deadline = time.monotonic() + timeout
        while True:
            channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                channel.connect(str(host.socket))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                channel.close()
                if time.monotonic() > deadline or not _running(host.pid):
                    raise OSError("the sandbox host is not running") from None
                time.sleep(0.05)
        try:
            channel.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            channel.sendall((json.dumps(config) + "\n").encode("utf-8"))
            data, pid = b"", None
            while not data.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([channel], [], [], left)[0]:
                    raise OSError("the forked interpreter did not answer")
                chunk, ancillary, _, _ = channel.recvmsg(4096, socket.CMSG_SPACE(struct.calcsize("3i")))
                if not chunk:
                    raise OSError("the forked interpreter ended before it was ready")
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and pid is None:
                        pid, sender_uid, _ = struct.unpack("3i", payload[:12])
                        if uid is not None and sender_uid != uid:
                            raise OSError(f"the forked interpreter runs as uid {sender_uid}, not {uid}")
                data += chunk
            if not pid:
                raise OSError("the forked interpreter's process is unknown")
            return cls(channel, pid, json.loads(data))
        except BaseException:
            channel.close()
            raise

    def poll(self) -> int | None:
        return 0 if select.select([self.pidfd], [], [], 0)[0] else None

    def close(self) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass
        select.select([self.pidfd], [], [], 10)
        for stream in (self.stdin, self.stdout, self.channel):
            try:
                stream.close()
            except Exception:
                pass
        os.close(self.pidfd)


class HostAddress(NamedTuple):
    """Where a worker asks the run's sandbox host for its interpreter, and the host's process."""

    socket: Path
    pid: int


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


SCRATCH_PREFIX = "ag-run-"  # a grade command's scratch folder, $TMPDIR/<prefix><pid>-*: its sandboxes' too


class SandboxHost:
    """One warm interpreter for every local worker of a run, as root (``zygote.host``).

    It imports torch and the kernel machinery once, in a bubblewrap sandbox of
    its own that sees every worker's folder, and forks each worker's interpreter
    into namespaces, folders and a user of that worker's own: the workers share
    its memory and nothing else. Started from the thread that lives as long as
    the run (bubblewrap dies with the thread that started it).
    """

    def __init__(self, course_root: Path, base: Path, limits: Limits):
        self.course_root, self.base, self.limits = Path(course_root).resolve(), Path(base), limits
        self.socket = self.base / "host.sock"
        self.process: subprocess.Popen | None = None
        self.adopted = False  # launched by the grade command, then handed to its pool

    def launch(self) -> None:
        config = {"socket": f"{HOST_BASE}/host.sock", "preload": PRELOAD, "env": interpreter_environment()}
        inner = [sys.executable, "-s", "-m", "autograder.sandboxing.zygote", "--host", json.dumps(config)]
        command = bwrap_command(
            self.course_root, None, self.course_root / "notebooks", self.limits, inner, True, host_base=self.base
        )
        with open(self.base / "host.log", "ab") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
            )

    @property
    def address(self) -> HostAddress:
        assert self.process is not None, "launch() first"
        return HostAddress(self.socket, self.process.pid)

    def close(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            self.process.wait()
            self.process.stdin.close()
            self.process = None


class SandboxGone(RuntimeError):
    """The warm interpreter died (a notebook killed it): start it again."""


def _descendant_running(pid: int, marker: str, depth: int = 4) -> int | None:
    """The pid of the Python process below ``pid`` (itself included) running module ``marker``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            arguments = handle.read().split(b"\0")
        if arguments[0] == sys.executable.encode() and marker.encode() in arguments:  # not bwrap's own line
            return pid
    except OSError:
        return None
    if depth == 0:
        return None
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                children = [int(c) for c in handle.read().split()]
        except (OSError, ValueError):
            continue
        for child in children:
            found = _descendant_running(child, marker, depth - 1)
            if found is not None:
                return found
    return None


def _processes_of(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return count


def probe(course_root: Path) -> str | None:
    """None when the sandbox works here, else why not (in words for the instructor)."""
    if not sys.platform.startswith("linux"):
        return "the sandbox needs Linux (bubblewrap)"
    if _bwrap() is None:
        return "bubblewrap is not installed (Debian/Ubuntu: sudo apt-get install bubblewrap)"
    base = Path(tempfile.mkdtemp(prefix="ag-probe-"))
    try:
        run_dir = base / "w0"
        run_dir.mkdir()
        command = bwrap_command(
            Path(course_root).resolve(),
            run_dir,
            Path(course_root).resolve() / "notebooks",
            Limits(),
            [sys.executable, "-s", "-c", "import course_checks.verdict"],
            os.geteuid() == 0,
        )
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            return f"bubblewrap cannot start a sandbox here: {detail[-1] if detail else result.returncode}"
        return None
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap cannot start a sandbox here: {error}"
    finally:
        shutil.rmtree(base, ignore_errors=True)
