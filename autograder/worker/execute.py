"""Run a notebook cell by cell in sandboxed kernels, so that one bad cell costs only itself.

``ContainedExecute`` is nbgrader's own ``Execute`` preprocessor (nbclient
underneath, with nbgrader's timeout and error handling), driven one cell at a
time against kernels forked by a ``bubblewrap.WarmSandbox``:

- a cell that runs past its time limit is interrupted; if the interrupt does
  not stop it (a loop that swallows KeyboardInterrupt) the kernel is killed;
- a cell that kills its kernel (``os._exit``, a crash, the memory or CPU limit)
  or hangs is marked as failed in its outputs, and the notebook starts again in
  a fresh kernel *without that cell*, replaying the cells before it, so every
  exercise that does not depend on it is still graded;
- a notebook has a wall-clock budget; cells it leaves unrun fail with a note;
- processes a cell leaves behind (a fork bomb) are killed after the cell;
- printed output beyond a limit per cell is dropped (with a note), so 50 MB of
  prints cost neither memory nor time downstream.

``SandboxKernelManager`` makes a kernel forked by the sandbox look like any
Jupyter kernel to nbclient.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from queue import Empty

import zmq
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.v4 import new_output

from ..cells import error_output, graded_id
from ..compat import ForkedKernelManager, ObservedExecute, accept_kernel_info
from ..sandboxing.bubblewrap import Limits, SandboxGone, WarmSandbox
from .phases import timed


class SandboxKernelManager(ForkedKernelManager):
    """A Jupyter kernel forked by a ``WarmSandbox``; nbclient drives it like any other."""

    phases: dict | None = None  # the notebook's seconds per phase (``worker.phases``), set by its executor

    def __init__(
        self,
        sandbox: WarmSandbox,
        limits: Limits,
        kernel_dir: Path,
        cwd: str,
        env: dict,
        arguments: list[str],
        files: dict | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.sandbox = sandbox
        self.limits = limits  # the notebook's, from its job
        self.kernel_dir = Path(kernel_dir)
        self.kernel_cwd = cwd
        self.kernel_env = env
        self.kernel_arguments = arguments
        self.kernel_files = files or {}
        self.transport = "ipc"
        self.ip = str(self.kernel_dir / "k")
        self.connection_file = str(self.kernel_dir / "kernel.json")
        self._pid: int | None = None
        self.swept = 0  # processes killed when interrupting
        self.headroom_mb: float | None = None
        self.cpu: float | None = None  # CPU seconds the kernel has used, as of the last look
        self.cpu_ready: float | None = None  # ... when it was ready: what starting it cost

    @property
    def has_kernel(self) -> bool:
        return self._pid is not None

    @property
    def ipykernel(self) -> bool:
        return True

    async def start(self, **kwargs) -> None:
        self.kernel_dir.mkdir(parents=True, exist_ok=True)
        self.sandbox.own(self.kernel_dir, writable=True)
        self.write_connection_file()
        if self.sandbox.as_root and self.sandbox.sandboxed and self.sandbox.uid is not None:
            os.chown(self.connection_file, self.sandbox.uid, self.sandbox.uid)
        with timed(self.phases, "fork"):
            reply = self.sandbox.request(
                "spawn",
                connection_file=self.connection_file,
                cwd=self.kernel_cwd,
                env=self.kernel_env,
                arguments=self.kernel_arguments,
                limits=asdict(self.limits),
                files=self.kernel_files,
                log="/tmp/kernel.log",
                timeout=120,
            )
        self._pid = reply["pid"]

    def lock(self) -> None:
        """Once the kernel has made its sockets, the notebook may not write there any more."""
        self.sandbox.own(self.kernel_dir, writable=False)

    async def alive(self) -> bool:
        if self._pid is None:
            return False
        try:
            return bool(self.sandbox.request("poll", timeout=10, pid=self._pid)["alive"])
        except SandboxGone:
            return False

    async def interrupt(self) -> None:
        """Interrupt the kernel, first killing what it started (a fork bomb would starve it)."""
        if self._pid is not None:
            try:
                self.swept += int(self.sandbox.request("interrupt", timeout=120, pid=self._pid).get("killed", 0))
            except SandboxGone:
                pass

    def sweep(self) -> int:
        """Kill what the notebook started besides its kernel; the number killed.

        Also notes ``headroom_mb``, the memory the kernel may still take.
        """
        if self._pid is None:
            return 0
        try:
            reply = self.sandbox.request("sweep", timeout=120, pid=self._pid)
        except SandboxGone:
            return 0
        self.headroom_mb = reply.get("headroom_mb")
        if reply.get("cpu") is not None:
            self.cpu = reply["cpu"]
        return int(reply.get("killed", 0))

    async def shutdown(self) -> None:
        try:
            with timed(self.phases, "interpreter"):
                reply = self.sandbox.reset(self._pid)
            if reply.get("cpu") is not None:
                self.cpu = reply["cpu"]
        except SandboxGone:
            pass
        self._pid = None
        await self.cleanup()

    async def cleanup(self) -> None:
        try:
            self.cleanup_connection_file()
            self.cleanup_ipc_files()
        except OSError:
            pass
        if self.kernel_dir.exists():
            shutil.rmtree(self.kernel_dir, ignore_errors=True)


def output_size(msg_type: str, content: dict) -> int:
    """Characters an output adds to the notebook (what the output cap counts)."""

    def size(value, depth=0) -> int:
        if isinstance(value, str):
            return len(value)
        if depth > 20:
            return 64
        if isinstance(value, dict):
            return sum(len(str(k)) + size(v, depth + 1) for k, v in value.items()) + 2
        if isinstance(value, (list, tuple)):
            return sum(size(v, depth + 1) for v in value) + 2
        return 16

    if msg_type == "stream":
        return size(content.get("text", ""))
    if msg_type == "error":
        return size(content.get("ename", "")) + size(content.get("evalue", "")) + size(content.get("traceback", []))
    return size(content.get("data", {})) + size(content.get("metadata", {}))


@dataclass
class Fault:
    cell: int
    kind: str  # "timeout" (interrupted), "hung" (killed), "died", "not-run"
    message: str


@dataclass
class Execution:
    """What happened while a notebook ran."""

    cell_seconds: float = 0.0  # time spent running cells (replays included)
    cell_cpu_seconds: float = 0.0  # CPU time the kernels used running them
    kernel_seconds: float = 0.0  # starting and stopping kernels
    kernels: int = 0
    phases: dict = field(default_factory=dict)  # fork, boot, interpreter: seconds (``worker.phases``)
    faults: list[Fault] = field(default_factory=list)
    truncated: list[int] = field(default_factory=list)  # cells whose printed output was cut
    stray_processes: int = 0  # processes cells left behind, killed
    errored: list[int] = field(default_factory=list)  # cells the kernel said ended in an error, in any run


class ContainedExecute(ObservedExecute):
    """nbgrader's Execute, one cell at a time, in fresh sandboxed kernels after faults."""

    def __init__(
        self,
        sandbox: WarmSandbox,
        limits: Limits,
        cwd: str,
        env: dict,
        arguments: list[str],
        files: dict | None = None,
        server=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.sandbox = sandbox
        self.limits = limits
        self.kernel_cwd = cwd
        self.kernel_env = env
        self.kernel_arguments = arguments
        self.kernel_files = files or {}
        self.server = server
        self.allow_errors = True
        self.interrupt_on_timeout = True
        self.raise_on_iopub_timeout = True
        self.iopub_timeout = 4
        self.record_timing = False
        self._timed_out = False
        self._swept = 0
        self._cell_cpu = 0.0
        self._printed: dict[int, int] = {}
        self._cut: set[int] = set()
        self._kernel_count = 0
        self._errored: set[int] = set()
        self.phases: dict = {}
        self.on_cell_executed = self._note_reply

    # ------------------------------------------------------------ nbclient hooks
    def _note_reply(self, cell, cell_index, execute_reply):
        """Which cells the kernel's execute_reply says ended in an error, in any of the kernels that
        ran them: a replay (after a crash) cannot make a cell's error of an earlier run go away."""
        if (execute_reply or {}).get("content", {}).get("status") != "ok":
            self._errored.add(cell_index)

    def timed_out(self, cell) -> None:
        self._timed_out = True

    def _cap(self) -> int:
        return int(self.limits.output_mb * 1024 * 1024)

    def output(self, outs, msg, display_id, cell_index):
        """Every kind of output counts against the cell's cap: printed text, rich display data,
        results, errors. Past the cap they are dropped (with a note at the end); an error is
        kept, shortened, so the cell still shows that it failed."""
        content = msg["content"]
        total = self._printed.get(cell_index, 0) + output_size(msg["msg_type"], content)
        self._printed[cell_index] = total
        if total > self._cap():
            self._cut.add(cell_index)
            if msg["msg_type"] != "error" or any(o.get("output_type") == "error" for o in outs):
                return None
            content["evalue"] = str(content.get("evalue", ""))[:2000]
            content["traceback"] = [str(line)[:2000] for line in content.get("traceback", [])[-20:]]
        return super().output(outs, msg, display_id, cell_index)

    def display_update(self, display_id, msg) -> bool:
        """An update replaces a display's data in place: it counts against the cells it lands in."""
        size = output_size("display_data", msg.get("content", {}))
        cells = self.cells_showing(display_id)
        for index in cells:
            self._printed[index] = self._printed.get(index, 0) + size
        if any(self._printed[index] > self._cap() for index in cells):
            self._cut.update(cells)
            return False
        return True

    # ------------------------------------------------------------ kernels
    async def _ready(self, deadline: float) -> None:
        """Wait until the kernel answers on shell and iopub (no fixed sleeps).

        A kernel_info request goes out every tenth of a second until the kernel has
        answered one on shell and iopub has shown an "idle" for one: iopub is a
        subscription that may join late, so its first messages can be lost (then
        the next request's "idle" is the one seen), and no output of the first
        cell must be. Once the kernel has answered, it is up: the requests go out
        every 20 ms until iopub shows one's "idle".
        """
        kc = self.kc
        asked: set[str] = set()
        replied = idle = False
        next_request = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= next_request:
                asked.add(kc.kernel_info())
                next_request = time.monotonic() + (0.02 if replied else 0.1)
            got_any = False
            try:
                msg = await kc.shell_channel.get_msg(timeout=0 if replied else 0.05)
                got_any = True
                if msg["parent_header"].get("msg_id") in asked and msg["msg_type"] == "kernel_info_reply":
                    if not replied:
                        accept_kernel_info(kc, msg)
                        next_request = 0.0  # its "idle" may have gone before iopub joined: ask again now
                    replied = True
            except Empty:
                pass
            try:
                msg = await kc.iopub_channel.get_msg(timeout=0.05)
                got_any = True
                if (
                    msg["parent_header"].get("msg_id") in asked
                    and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"
                ):
                    idle = True
            except Empty:
                pass
            if replied and idle:
                # What has come of the other kernel_info requests is let go now, without waiting for
                # more: what comes later has their parent, and nbclient takes a cell's messages by
                # its request's id only.
                while True:
                    try:
                        await kc.iopub_channel.get_msg(timeout=0)
                    except Empty:
                        break
                return
            if not got_any and not await self.km.is_alive():
                raise DeadKernelError("the kernel died while starting")
        raise RuntimeError("the kernel did not start in time")

    async def _start_kernel(self) -> None:
        self._kernel_count += 1
        for attempt in range(2):
            try:
                with timed(self.phases, "interpreter"):
                    self.sandbox.ensure()
                self.km = SandboxKernelManager(
                    self.sandbox,
                    self.limits,
                    self.sandbox.run_dir / f"kernel{self._kernel_count}-{attempt}",
                    self.kernel_cwd,
                    self.kernel_env,
                    self.kernel_arguments,
                    self.kernel_files,
                )
                self.km.phases = self.phases
                with timed(self.phases, "boot"):
                    await self.km.start_kernel()
                    # The client's sockets connect before the kernel has made its own, and zmq tries
                    # again after its reconnect interval (100 ms unless told): 5 ms here, over a
                    # local socket file. Set on the client's own context, which makes its sockets
                    # (jupyter_client gives each client a context of its own, not the manager's).
                    self.kc = self.km.client()
                    self.kc.context.setsockopt(zmq.RECONNECT_IVL, 5)
                    self.kc.start_channels()
                    await self._ready(time.monotonic() + max(60.0, self.startup_timeout))
                    self.kc.allow_stdin = False
                    self.km.lock()
                with timed(self.phases, "interpreter"):
                    self.km.sweep()
                self.km.cpu_ready = self.km.cpu
                return
            except (SandboxGone, DeadKernelError, RuntimeError) as error:
                await self._stop_kernel()
                if attempt:
                    raise RuntimeError(f"no kernel could start: {error}; {self.sandbox.log_tail()}") from error

    async def _stop_kernel(self) -> None:
        with timed(self.phases, "boot"):  # the reset inside is the interpreter's phase
            await self._let_kernel_go()

    async def _let_kernel_go(self) -> None:
        if self.km is not None:
            self._swept += self.km.swept
        km = self.km
        if self.kc is not None:
            try:
                self.kc.stop_channels()
            except Exception:
                pass
            self.kc = None
        if self.km is not None:
            await self.km.shutdown_kernel(now=True)
            self.km = None
        if km is not None and km.cpu is not None and km.cpu_ready is not None:
            self._cell_cpu += max(0.0, km.cpu - km.cpu_ready)

    # ------------------------------------------------------------ one cell
    async def _run_cell(self, index: int) -> str:
        """'ok', 'timeout' (interrupted, kernel fine), 'hung' or 'died'."""
        cell = self.nb.cells[index]
        self._timed_out = False
        if self.server is not None:
            self.server.start_cell(graded_id(cell))
        try:
            # Test cells (the only ones holding hidden tests) stay out of the kernel's input history:
            # In, _ih, _i and %history show no hidden code to a cell that prints them.
            await self.async_execute_cell(cell, index, store_history=graded_id(cell) is None)
        except CellTimeoutError:
            return "hung"
        except (DeadKernelError, SandboxGone):
            return "died"
        except Exception:
            if self.km is not None and not await self.km.is_alive():
                return "died"
            return "hung"
        finally:
            if self.server is not None:
                self.server.end_cell()
        if self._timed_out:
            return "timeout" if await self.km.is_alive() else "died"
        return "ok"

    # ------------------------------------------------------------ the notebook
    def run(self, nb) -> Execution:
        """Execute ``nb`` in place; what happened."""
        self.nb = nb
        self.reset_execution_trackers()
        return asyncio.run(self._run_notebook())

    async def _run_notebook(self) -> Execution:
        report = Execution()
        code_cells = [i for i, cell in enumerate(self.nb.cells) if cell.cell_type == "code" and cell.source.strip()]
        faulty: dict[int, Fault] = {}
        deadline = time.monotonic() + self.limits.notebook_seconds
        stopped_at: int | None = None
        stop_reason = ""
        while True:
            started = time.monotonic()
            try:
                await self._start_kernel()
            except RuntimeError as error:
                stopped_at, stop_reason = (code_cells[0] if code_cells else None), str(error)
                break
            report.kernels += 1
            report.kernel_seconds += time.monotonic() - started
            if self.server is not None:
                self.server.new_kernel([graded_id(self.nb.cells[i]) for i in faulty])
            restart = False
            for index in code_cells:
                if index in faulty:
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0.5:
                    stopped_at = index
                    stop_reason = f"not run: the notebook reached its time limit ({self.limits.notebook_seconds:g} s)"
                    break
                self.timeout = max(1, int(min(self.limits.cell_seconds, remaining)))
                began = time.monotonic()
                outcome = await self._run_cell(index)
                report.cell_seconds += time.monotonic() - began
                cell = self.nb.cells[index]
                if outcome in ("ok", "timeout"):
                    if self.km is not None:
                        with timed(self.phases, "interpreter"):
                            report.stray_processes += self.km.sweep()
                    if outcome == "timeout":
                        report.faults.append(Fault(index, "timeout", f"interrupted after {self.timeout} s"))
                    headroom = self.km.headroom_mb if self.km is not None else None
                    if headroom is None or headroom > max(128.0, self.limits.memory_mb / 10):
                        continue
                    # The cell keeps (nearly) all the memory a notebook may have: every later
                    # cell would fail for want of it. It counts as failed, like a crash.
                    outcome = "memory"
                if outcome == "hung":
                    message = (
                        f"This cell ran past its time limit ({self.timeout} s) and did not stop when "
                        "interrupted, so its kernel was stopped; the rest of the notebook ran in a "
                        "fresh kernel without this cell."
                    )
                    name = "CellTimeoutError"
                elif outcome == "memory":
                    message = (
                        f"This cell kept almost all the memory a notebook may use "
                        f"({self.limits.memory_mb} MB), so the rest of the notebook ran in a fresh "
                        "kernel without this cell."
                    )
                    name = "MemoryError"
                else:
                    message = (
                        "The kernel stopped while running this cell (an exit, a crash, or the memory "
                        "or CPU limit); the rest of the notebook ran in a fresh kernel without this cell."
                    )
                    name = "DeadKernelError"
                if not any(o.get("output_type") == "error" and o.get("ename") == name for o in cell.outputs):
                    cell.outputs.append(error_output(name, message))
                faulty[index] = Fault(index, outcome, message)
                report.faults.append(faulty[index])
                restart = True
                break
            stopped = time.monotonic()
            await self._stop_kernel()
            report.kernel_seconds += time.monotonic() - stopped
            if not restart or stopped_at is not None:
                break
            if report.kernels > self.limits.restarts:
                stopped_at = next((i for i in code_cells if i not in faulty and i > max(faulty)), None)
                stop_reason = f"not run: the notebook stopped its kernel {len(faulty)} times"
                break
        if stopped_at is not None:
            for index in code_cells:
                if index >= stopped_at and index not in faulty:
                    self.nb.cells[index].outputs = [error_output("NotRun", stop_reason)]
                    report.faults.append(Fault(index, "not-run", stop_reason))
        report.stray_processes += self._swept
        report.cell_cpu_seconds = self._cell_cpu
        report.errored = sorted(self._errored)
        report.phases = dict(self.phases)
        for index in sorted(self._cut):
            report.truncated.append(index)
            note = (
                f"... output cut: this cell output more than {self.limits.output_mb:g} MB; the rest is not kept ...\n"
            )
            self.nb.cells[index].outputs.append(new_output("stream", name="stdout", text=note))
        return report
