"""The warm interpreter inside a grading sandbox: it forks one fresh kernel per notebook.

Starting Python, importing torch and the kernel machinery costs seconds; a
notebook's own cells often take less. This process pays that once per worker:
it imports everything a graded kernel needs, then waits for requests from the
trusted grader (``bubblewrap.WarmSandbox``) on stdin, one JSON line each, and answers
one JSON line on stdout:

- ``spawn``: start an IPython kernel for one notebook, in namespaces of its
  own, with its own session, working folder, environment and resource limits;
- ``poll`` / ``signal``: is that kernel alive, signal it; ``interrupt``: freeze
  it, kill whatever it started, then deliver the KeyboardInterrupt;
- ``sweep``: kill every process in the sandbox but this one and the kernel
  (what a forking cell left behind), and say how much memory the kernel has
  left; ``reset``: kill them all, kernel included,
  and wipe the private temporary and working folders, ready for the next notebook,
  saying whether it could prove them clean (else the grader retires the sandbox).

Every reply carries the id of the request it answers; the grader never trusts
it beyond one request (``bubblewrap.WarmSandbox.request``) and replaces it when
it falls out of step.

Each kernel runs below it, in user, pid, mount and IPC namespaces of its own
(``linux.own_user_namespace``), under an init of its own that only reaps, with
no capability: though the kernel runs as this process's user, it has no pid to
name this process by (so no ``kill``, ``prlimit``, ``setpriority``,
``sched_setaffinity`` or ``ptrace``), this process's ``/proc`` files are root's
(it is undumpable), and the kernel's System V IPC, POSIX message queues and
``/dev/shm`` go with it. ``reset`` then compares this process's limits,
priority, CPUs, out-of-memory score and IPC namespace with what they were before
the first notebook (``interpreter_state``) and says when they differ; the grader
replaces it then. Where user namespaces are not allowed, kernels are plain
children of this process (the worker's log says so once) and only that
comparison protects it.

It never runs student code itself (only its forked children do), imports
nothing from the course's widgets, and sees no solutions: it runs inside
bubblewrap (``bubblewrap.bwrap_command``) where those paths do not exist.
Run as ``python -m autograder.sandboxing.zygote CONFIG_JSON``; or, as root,
``... zygote --host CONFIG_JSON``: one warm interpreter for every local worker
(``host`` below), which forks each worker's into namespaces of its own.
"""

from __future__ import annotations

import fcntl
import functools
import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

from .linux import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    die_with_parent,
    drop_capabilities,
    mount,
    own_user_namespace,
    prctl,
    unmount,
    unshare,
)


def _drop_privileges(uid: int | None, gid: int | None) -> None:
    """As root inside bwrap: become the worker's own unprivileged user.

    Each grading worker has its own uid, so the process-count limit of one
    notebook (a fork bomb) never touches another worker's notebooks. Changing
    uid clears every capability bwrap left us (CAP_SETUID, CAP_SETGID).
    """
    if uid is None or os.getuid() != 0:
        return
    os.setgroups([])
    os.setgid(gid if gid is not None else uid)
    os.setuid(uid)


# Every kernel's options, before the course's own (``Execute.extra_arguments``). ipykernel sleeps 0.5 ms
# before each execute reply, against frontends that take the reply as the end of a cell's outputs; the
# grader takes a cell as done at the kernel's idle status on IOPub, which the kernel sends after every
# output of the cell. With nbclient on one processor (as a lane of ``./course grade``), a cell with no
# output took 4.0 to 4.9 ms with the sleep, 2.9 without (1,450 cells of ``x = 1``, twice each).
KERNEL_OPTIONS = ("--IPythonKernel._execute_sleep=0",)


def _warm_up(modules: list[str]) -> dict:
    """Import what every graded kernel needs, once; (module: seconds)."""
    timings = {}
    for name in modules:
        start = time.perf_counter()
        try:
            __import__(name)
        except Exception as error:  # a missing optional module only costs speed
            timings[name] = f"failed: {error}"
            continue
        timings[name] = round(time.perf_counter() - start, 3)
    return timings


def _remove_tree(path: str, budget: list[int]) -> bool:
    """Remove the directory ``path`` and everything under it; False if something stayed.

    Whatever a notebook left: any depth (no recursion, and no path ever longer
    than one name: the walk moves its working directory down and up), any
    count (``budget`` bounds the work, shared across calls), any permissions
    (each folder is made writable before it is entered), special files
    (fifos, sockets: unlinked, never opened). Nothing runs in the sandbox
    meanwhile (``reset`` killed every process first), so nothing changes
    under the walk.
    """
    try:  # the caller's working folder, to come back to
        home = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        home = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    names: list[str] = []  # the folders we are inside, below ``path``'s parent
    try:
        os.chdir(os.path.dirname(path) or "/")
        names.append(os.path.basename(path))
        try:
            os.chmod(names[-1], 0o700, follow_symlinks=False)
        except OSError:
            pass
        os.chdir(names[-1])
        while names:
            budget[0] -= 1
            if budget[0] < 0:
                return False
            descended = False
            with os.scandir(".") as entries:
                for entry in entries:
                    budget[0] -= 1
                    if budget[0] < 0:
                        return False
                    if entry.is_dir(follow_symlinks=False):
                        try:
                            os.chmod(entry.name, 0o700, follow_symlinks=False)
                            os.chdir(entry.name)
                        except OSError:
                            return False
                        names.append(entry.name)
                        descended = True
                        break
                    try:
                        os.unlink(entry.name)
                    except OSError:
                        return False
            if descended:
                continue
            name = names.pop()
            os.chdir("..")
            try:
                os.rmdir(name)
            except OSError:
                return False
        return True
    except OSError:
        return False
    finally:
        os.fchdir(home)
        os.close(home)
        if os.stat(".").st_nlink == 0:  # the caller's folder was in the tree removed
            os.chdir("/")


def _wipe(folder: str, keep=(), budget: list[int] | None = None) -> bool:
    """Empty ``folder`` (whatever a notebook left there), but not the paths in ``keep``
    and their parents (the grader's socket folder); False when it could not.

    A clean-up that fails is reported, never hidden: the grader then retires
    the sandbox (its private folders go with it) instead of passing the files
    on to the next notebook.
    """
    budget = budget if budget is not None else [2_000_000]
    if not os.path.isdir(folder):
        return True
    clean = True
    try:  # a notebook may have taken its own permissions away; the sandbox's own folders
        os.chmod(folder, os.stat(folder).st_mode | 0o700)  # (bwrap's, owned by root) keep theirs
    except OSError:
        pass
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for name in names:
        path = os.path.join(folder, name)
        if any(k == path for k in keep):
            continue
        if any(k.startswith(path + os.sep) for k in keep):
            if os.path.isdir(path) and not os.path.islink(path):
                clean = _wipe(path, keep, budget) and clean
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            clean = _remove_tree(path, budget) and clean
        else:
            try:
                os.unlink(path)
            except OSError:
                clean = False
    return clean


def _child(body, what: str) -> None:
    """In a forked child: run ``body``, then exit; never return into the parent's loop, whatever happens."""
    try:
        body()
    except BaseException as error:
        try:
            sys.__stderr__.write(f"{what} failed: {error!r}\n")
        except Exception:
            pass
        os._exit(70)
    os._exit(0)


def _session_at_own_priority() -> None:
    """This process's session lowered to its priority: ``nice ./course grade`` then lowers the sandbox's
    processes too, each in a session of its own (the host and a sandbox's interpreter in bubblewrap's
    or their own, each kernel in its own). With the scheduler's autogroups (on in most Linux
    distributions) the CPU is shared between sessions before nice counts within one, and a session
    starts at nice 0: a niced grader's kernels took their full share beside other users' work. Lowering
    it needs no privilege (raising would); the nice is the grader's, inherited."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice <= 0:
        return
    for _ in range(10):  # Linux takes a session's new nice at most every 0.1 s from an unprivileged process
        try:
            handle = os.open("/proc/self/autogroup", os.O_WRONLY)
            try:
                os.write(handle, str(nice).encode())
            finally:
                os.close(handle)
            return
        except BlockingIOError:
            time.sleep(0.02)
        except OSError:
            return  # a Linux without autogroups: nice alone counts


def _plain_python_signals() -> None:
    """The signal dispositions a freshly started Python has (what a kernel in plain Jupyter meets).

    The forked child inherits the zygote's (SIGINT ignored, say); a fresh
    interpreter has the defaults, except SIGPIPE and SIGXFSZ, which Python
    ignores so that writes fail with BrokenPipeError / OSError instead of
    killing the process, and SIGINT, which raises KeyboardInterrupt. Nothing
    is blocked.
    """
    for number in range(1, signal.NSIG):
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def interpreter_state(own_ipc: bool = True) -> dict:
    """What no kernel may change in the interpreter that forks it, as the interpreter sees it: its
    resource limits, priority, CPUs and out-of-memory score, and what its IPC namespace holds (System V
    shared memory, semaphores and message queues; POSIX shared memory files: only when the namespace is
    its own, in the sandbox, not the machine's). Compared after every notebook with what it was when the
    interpreter became ready (``Zygote.handle``, ``reset``)."""

    def read(path: str) -> str | None:
        try:
            with open(path) as handle:
                return handle.read().strip()
        except OSError:
            return None

    ipc = {}
    for table in ("shm", "sem", "msg"):
        listing = read(f"/proc/sysvipc/{table}")
        ipc[table] = None if listing is None else len(listing.splitlines()) - 1
    try:
        shared = sorted(os.listdir("/dev/shm"))
    except OSError:
        shared = None
    autogroup = read("/proc/self/autogroup")
    return {
        "limits": {
            name: list(resource.getrlimit(getattr(resource, name)))
            for name in sorted(dir(resource))
            if name.startswith("RLIMIT_")
        },
        "priority": os.getpriority(os.PRIO_PROCESS, 0),
        "autogroup nice": autogroup.rsplit(" ", 1)[-1] if autogroup else None,
        "cpus": sorted(os.sched_getaffinity(0)),
        "oom score": read("/proc/self/oom_score_adj"),
        "System V IPC": ipc if own_ipc else None,
        "POSIX shared memory": shared if own_ipc else None,
    }


class Zygote:
    def __init__(self, config: dict):
        self.config = config
        self.children: dict[int, int | None] = {}  # pid -> exit status (None while alive): each kernel's init
        self.kernels: dict[int, int] = {}  # kernel pid -> the init process it runs under (itself when unsandboxed)
        self.isolated: bool | None = None  # whether kernels get namespaces of their own (known at the first spawn)
        # Orphans come to this process (the kernels' inits, once their starter has ended), so it alone
        # learns when a kernel has ended.
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        self.baseline = interpreter_state(self.config.get("pid_namespace", True))

    # ------------------------------------------------------------ processes
    def _others(self, keep: set[int]) -> list[int]:
        """Pids of every process we can see except ``keep``, ourselves and pid 1 (bwrap's init)."""
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                pid = int(name)
                if pid not in keep and pid != os.getpid() and pid != 1:
                    found.append(pid)
        return found

    def _kill_others(self, keep: set[int]) -> int:
        """SIGKILL every process in the sandbox outside ``keep``; how many there were.

        A fork bomb refills every slot its killed processes free, so killing
        one by one never ends. Everything is stopped first (stopped processes
        cannot fork, and with the process limit reached no new one can appear),
        then killed. With nothing to keep, ``kill(-1)`` does it at once: the
        kernel signals every process of our pid namespace we may signal, except
        pid 1 and ourselves.
        """
        if not self.config.get("pid_namespace", True):
            # Unsandboxed: /proc shows the whole machine; only our own children are ours.
            killed = 0
            for pid, status in list(self.children.items()):
                if pid not in keep and status is None:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                        killed += 1
                    except OSError:
                        pass
            self._reap()
            return killed
        stopped: set[int] = set()
        for _ in range(1000):
            victims = set(self._others(keep)) - stopped
            if not victims:
                break
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass
            stopped |= victims
        if not keep:
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for _ in range(500):  # until pid 1 and we have reaped them all
            self._reap()
            if not self._others(keep):
                break
            time.sleep(0.002)
        return len(stopped)

    def _cpu(self, pid: int) -> float | None:
        """CPU seconds (user + system) the kernel has used so far."""
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def _headroom(self, pid: int) -> float | None:
        """MB the kernel may still map before its address-space limit (None if unknown)."""
        try:
            limit = resource.prlimit(pid, resource.RLIMIT_AS)[0]
            with open(f"/proc/{pid}/status") as status:
                size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        except (OSError, StopIteration, ValueError):
            return None
        if limit == resource.RLIM_INFINITY:
            return None
        return (limit - size) / 2**20

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children[pid] = status

    def _family(self, kernel: int) -> set[int]:
        """The kernel and the init process it runs under (what a sweep must not kill)."""
        return {kernel, self.kernels.get(kernel, kernel)}

    def _spawn(self, request: dict) -> dict:
        cwd = request["cwd"]
        os.makedirs(cwd, exist_ok=True)
        for relative, text in request.get("files", {}).items():
            path = os.path.join(cwd, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(bytes.fromhex(text))
        if not self.config.get("pid_namespace", True) or self.isolated is False:
            return self._spawn_plain(request)
        # In the sandbox: a starter leaves for namespaces of its own below this process's and forks the
        # kernel's init there, which forks the kernel. The starter says which process the init is and
        # ends; the init is then this process's child (a subreaper's) and the kernel its only child.
        reader, writer = os.pipe()
        starter = os.fork()
        if starter == 0:
            os.close(reader)
            _child(lambda: self._start_contained(request, writer), "kernel start")
        os.close(writer)
        with os.fdopen(reader, "r") as pipe:
            line = pipe.readline().split()
        os.waitpid(starter, 0)
        if line == ["0", "0"]:
            # No user namespaces here: kernels are plain children from now on, and only the check after
            # every notebook protects this interpreter. Said once, in the worker's log.
            sys.stderr.write("kernels run without namespaces of their own: user namespaces are not allowed here\n")
            self.isolated = False
            return self._spawn_plain(request)
        if len(line) != 2:
            raise RuntimeError("the kernel's namespaces could not be made (see the worker's log)")
        init, self.isolated = int(line[0]), True
        self.children[init] = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{init}/task/{init}/children") as listing:
                    found = listing.read().split()
            except OSError:
                found = []
            if found:
                self.kernels[int(found[0])] = init
                return {"pid": int(found[0]), "isolated": True}
            self._reap()
            if self.children.get(init) is not None:
                break
            time.sleep(0.001)
        raise RuntimeError("the kernel's init ended before it started the kernel (see the worker's log)")

    def _spawn_plain(self, request: dict) -> dict:
        """A kernel as a plain child (unsandboxed, as Jupyter starts one; or where namespaces fail)."""
        pid = os.fork()
        if pid == 0:
            _child(lambda: self._become_kernel(request, contained=False), "kernel start")
        self.children[pid] = None
        self.kernels[pid] = pid
        return {"pid": pid, "isolated": False}

    def _start_contained(self, request: dict, writer: int) -> None:
        """In the starter: new user, pid, mount and IPC namespaces, then the kernel's init."""
        prctl(PR_SET_DUMPABLE, 1)  # its /proc/self files (the namespace's id maps) are then its own to write
        try:
            allowed = own_user_namespace()
        except OSError as error:  # made, but holding no capability (Ubuntu's AppArmor restriction, say)
            sys.stderr.write(f"a kernel's namespaces: {error}\n")
            allowed = False
        if not allowed:
            os.write(writer, b"0 0\n")  # not allowed here: the interpreter starts a plain child instead
            return
        init = os.fork()  # the first process of the new pid namespace: its pid 1
        if init:
            os.write(writer, f"{init} 1\n".encode())
            return
        os.close(writer)
        self._kernel_mounts()
        kernel = os.fork()
        if kernel == 0:
            _child(lambda: self._become_kernel(request, contained=True), "kernel start")
        # The init: nothing but reaping what ends in the namespace, until the kernel ends. It holds no
        # capability and cannot be ptraced; as a pid namespace's init, no signal from inside reaches it.
        null = os.open(os.devnull, os.O_RDWR)
        for number in (0, 1):
            os.dup2(null, number)
        os.closerange(3, 1 << 16)
        drop_capabilities()
        prctl(PR_SET_DUMPABLE, 0)
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                os._exit(0)
            if pid == kernel:
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)

    def _kernel_mounts(self) -> None:
        """In the kernel's init: a /proc of the kernel's own processes (where the sandbox's mounts allow
        it: where they do not, the interpreter is still out of reach, its /proc files belong to root),
        and a /dev/shm of its own, gone with it."""
        size = self.config.get("scratch_bytes", 512 * 1024 * 1024)
        for what in (
            lambda: mount(None, "/", None, MS_REC | MS_PRIVATE),  # nothing mounted here reaches back
            lambda: mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC),
            lambda: mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777"),
        ):
            try:
                what()
            except OSError:
                pass

    def _become_kernel(self, request: dict, contained: bool) -> None:
        """In the forked child: own session, limits, folder, environment; then ipykernel."""
        os.setsid()
        log = os.open(request.get("log", os.devnull), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1 << 16)  # the zygote's control pipe among them
        _plain_python_signals()
        limits = request["limits"]
        vm_kb = 0
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    vm_kb = int(line.split()[1])
        # Address space: what the warm interpreter already maps, plus the
        # notebook's allowance. Beyond it allocations fail (MemoryError) instead
        # of waking the machine's out-of-memory killer.
        address_space = vm_kb * 1024 + limits["memory_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        cpu = int(limits["cpu_seconds"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        file_bytes = limits["file_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if contained:
            # Its namespace counts its own processes: the notebook's allowance, whatever else runs as this user.
            processes = int(self.config.get("kernel_processes") or resource.getrlimit(resource.RLIMIT_NPROC)[0])
            resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
            drop_capabilities()
        prctl(PR_SET_DUMPABLE, 1)  # the zygote stays undumpable; the kernel need not be
        _session_at_own_priority()  # its /proc/self files are its own from here
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for folder in ("HOME", "TMPDIR", "IPYTHONDIR", "MPLCONFIGDIR", "JUPYTER_RUNTIME_DIR"):
            if folder in os.environ:
                os.makedirs(os.environ[folder], exist_ok=True)
        from ipykernel.kernelapp import IPKernelApp  # here, in the forked kernel: the zygote preloaded it

        app = IPKernelApp.instance()
        app.initialize(["-f", request["connection_file"], *KERNEL_OPTIONS, *request.get("arguments", [])])
        app.start()
        os._exit(0)

    # ------------------------------------------------------------ requests
    def handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "spawn":
            return self._spawn(request)
        if op == "poll":
            self._reap()
            pid = request["pid"]
            status = self.children.get(self.kernels.get(pid, pid), 0)
            if status is None:
                return {"alive": True}
            code = os.waitstatus_to_exitcode(status) if status else 0
            return {"alive": False, "exit": code}
        if op == "signal":
            try:
                os.kill(request["pid"], request["signal"])
            except OSError:
                pass
            return {}
        if op == "sweep":
            return {
                "killed": self._kill_others(self._family(request["pid"])),
                "headroom_mb": self._headroom(request["pid"]),
                "cpu": self._cpu(request["pid"]),
            }
        if op == "interrupt":
            # Freeze the kernel so it stops forking, kill everything it started,
            # then let it go with a KeyboardInterrupt waiting for it.
            pid = request["pid"]
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                return {"killed": 0}
            killed = self._kill_others(self._family(pid))
            for sig in (signal.SIGINT, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            return {"killed": killed}
        if op == "reset":
            cpu = self._cpu(request["pid"]) if request.get("pid") else None
            killed = self._kill_others(set())
            self._reap()
            self.children = {pid: s for pid, s in self.children.items() if s is None}
            self.kernels = {k: init for k, init in self.kernels.items() if init in self.children}
            clean = not (self.config.get("pid_namespace", True) and self._others(set()))
            budget = [2_000_000]
            # The grader's folders stay, and so do the wiped folders themselves (each is a mount
            # point: a course root under /tmp puts the notebooks' one inside /tmp's)
            keep = [*self.config.get("keep", []), *self.config.get("wipe", [])]
            for folder in self.config.get("wipe", []):
                clean = _wipe(folder, keep, budget) and clean
            # Nothing a notebook did may outlive it here: the interpreter is as it was before the first.
            now = interpreter_state(self.config.get("pid_namespace", True))
            changed = [what for what, value in self.baseline.items() if now.get(what) != value]
            return {"killed": killed, "cpu": cpu, "clean": clean and not changed, "changed": changed}
        if op == "ping":
            return {"pid": os.getpid()}
        raise ValueError(f"unknown request {op!r}")

    def serve(self, control_in=None, control_out=None) -> None:
        """Answer requests until the grader hangs up: on stdin/stdout, or on the given channel."""
        if control_in is None:
            control_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
            control_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        for line in control_in:
            request = None
            try:
                request = json.loads(line)
                reply = {"ok": True, **self.handle(request)}
            except BaseException as error:  # RecursionError, MemoryError too: answer, stay in step
                reply = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:500]}"}
            if isinstance(request, dict):
                reply["id"] = request.get("id")  # which request this answers: the grader checks it
            control_out.write(json.dumps(reply) + "\n")
            control_out.flush()


def _settle(config: dict) -> None:
    """Become the worker's interpreter: its session at its priority, its own user, undumpable, its process
    limit, its environment."""
    _session_at_own_priority()  # while its /proc/self files are still its own
    _drop_privileges(config.get("uid"), config.get("gid"))
    prctl(PR_SET_DUMPABLE, 0)  # kernels of the same uid cannot ptrace or read our memory
    limit = config.get("processes")
    if limit:
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(config.get("env", {}))


def main() -> None:
    if sys.argv[1] == "--host":
        host(json.loads(sys.argv[2]))
        return
    config = json.loads(sys.argv[1])
    _settle(config)
    timings = _warm_up(config.get("preload", []))
    # What is loaded now stays out of the collector's reach: a collection in a forked kernel would
    # otherwise write to every object's header and copy the pages it shares with this process.
    gc.freeze()
    ready = {"ready": True, "pid": os.getpid(), "uid": os.getuid(), "imports": timings}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    Zygote(config).serve()


# ---------------------------------------------------------------- one warm interpreter for every worker
#
# As root, one interpreter (the host) imports torch and the kernel machinery for all the
# workers of a run, in a bubblewrap sandbox of its own that may make namespaces and mounts.
# For each worker that connects it forks that worker's interpreter, which leaves the host's
# namespaces for new ones of its own before it runs anything else: its own processes (it is
# their pid 1: nothing inside can stop or kill it), its own /tmp and notebook folder (fresh
# tmpfs), its own network and IPC, only its own worker folder of the grader's (the others and
# the host's socket are unmounted), then its own user. Workers share the host's memory (forked
# copies) and nothing else.


def _folder(path: str) -> None:
    """``path`` and its missing parents, as bubblewrap makes them (root's, readable by all)."""
    os.makedirs(path, mode=0o755, exist_ok=True)


def _loopback_up() -> None:
    """The new network namespace's loopback interface up, as bubblewrap leaves it."""

    request = struct.pack("16sh14x", b"lo", 0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        flags = struct.unpack("16sh14x", fcntl.ioctl(probe, 0x8913, request))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(probe, 0x8914, struct.pack("16sh14x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP


def _own_namespaces(config: dict) -> None:
    """In the worker's new mount namespace (pid 1 of its new pid namespace): its own folders."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    scratch = f"size={config['scratch_bytes']},mode=1777"
    held = "/run/host-tmp"
    _folder(held)
    mount("/tmp", held, None, MS_BIND | MS_REC)  # what bubblewrap mounted under /tmp (a checkout there)
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, scratch)
    for dest in sorted(config.get("rebind", []), key=lambda path: path.count("/")):
        _folder(dest)
        mount(held + dest[len("/tmp") :], dest, None, MS_BIND | MS_REC)
        mount(None, dest, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    unmount(held)
    os.rmdir(held)
    _folder(config["run_dir"])
    mount(config["inside"], config["run_dir"], None, MS_BIND)
    unmount(config["host_base"])  # the other workers' folders and the host's socket
    _folder(config["notebooks_dir"])
    mount("tmpfs", config["notebooks_dir"], "tmpfs", MS_NOSUID | MS_NODEV, scratch)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    try:
        _loopback_up()
    except OSError:
        pass


def _hatch(channel, host_config: dict) -> None:
    """In a child of the host: read the worker's configuration, leave for new namespaces, serve it."""
    die_with_parent()  # with the host
    reader = channel.makefile("r", encoding="utf-8")
    writer = channel.makefile("w", encoding="utf-8")
    config = {**host_config, **json.loads(reader.readline())}
    try:  # where the worker's pool process runs: the kernels forked from here too
        os.sched_setaffinity(0, [int(cpu) for cpu in config.get("processors") or ()] or os.sched_getaffinity(0))
    except (OSError, TypeError, ValueError):
        pass
    log = os.open(config["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 2)
    os.close(log)
    unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC)
    child = os.fork()  # the first process of a new pid namespace is its pid 1
    if child:
        for stream in (reader, writer, channel):  # the grader sees the channel close when the worker ends
            stream.close()
        status = os.waitpid(child, 0)[1]
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    die_with_parent()  # with the process above (and so with the host)
    os.setsid()
    _own_namespaces(config)
    _settle(config)
    # The grader learns which process this is (as its own machine numbers it) from the
    # credentials the kernel attaches to this line.
    writer.write(json.dumps({"ready": True, "pid": os.getpid(), "uid": os.getuid(), "imports": {}}) + "\n")
    writer.flush()
    Zygote(config).serve(reader, writer)


def host(config: dict) -> None:
    """The host's loop: warm up once, then fork one interpreter per worker that connects."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _session_at_own_priority()
    os.environ.update(config.get("env", {}))
    timings = _warm_up(config.get("preload", []))
    gc.freeze()
    prctl(PR_SET_DUMPABLE, 0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(config["socket"])
    os.chmod(config["socket"], 0o600)
    listener.listen(64)
    sys.stdout.write(json.dumps({"ready": True, "pid": os.getpid(), "imports": timings}) + "\n")
    sys.stdout.flush()
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 1.0)
        while True:  # the workers' processes that ended
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if sys.stdin in readable and not sys.stdin.readline():
            return  # the grader is gone
        if listener in readable:
            channel, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                _child(functools.partial(_hatch, channel, config), "worker interpreter")
            channel.close()


if __name__ == "__main__":
    main()
