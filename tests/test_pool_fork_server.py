"""The local pool's fork server is a fork of the grade command, holding nothing of the command's.

``runners.start_fork_server_here`` starts multiprocessing's fork server in a
fork of the calling process (so the server and the pool processes forked from
it share the command's imports: nbgrader's 85 MB), instead of a new
interpreter. Checked from outside, in a process that stands for the command:
it holds a file open (the gradebook) and a signal handler of its own, and
starts a pool process through the server. The server is the command's child
running the command's program (a fork, not a new interpreter); neither it nor
the pool process holds the command's file; the pool process has the usual
signal handlers; and the server ends with the command. With a second thread
running, the function leaves it to multiprocessing: a fork would copy one
thread and leave held any lock the other held.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from processes import still_running

REPOSITORY = Path(__file__).resolve().parent.parent

COMMAND = textwrap.dedent(
    """
    import json, multiprocessing, os, signal, sys, threading, time

    from autograder.engine.runners import start_fork_server_here

    sys.path.insert(0, "tests")  # run from the checkout
    from processes import open_files as fds


    def report(queue):
        server = os.getppid()
        with open(f"/proc/{server}/stat") as stat:
            server_parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{server}/cmdline", "rb") as cmdline:
            server_command = cmdline.read().split(b"\\0")[:-1]
        queue.put({
            "server": server,
            "server_parent": server_parent,
            "server_command": [part.decode() for part in server_command],
            "server_files": fds(server),
            "process_files": fds("self"),
            "sigterm_usual": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        })


    if __name__ == "__main__":
        gradebook = open(sys.argv[1], "a")  # what the command holds open: never the server's
        signal.signal(signal.SIGTERM, lambda *_: None)
        if sys.argv[2] == "threaded":
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["json"])
        forked = start_fork_server_here()
        queue = context.SimpleQueue()
        process = context.Process(target=report, args=(queue,))
        process.start()
        seen = queue.get()
        process.join()
        with open(f"/proc/self/cmdline", "rb") as cmdline:
            mine = [part.decode() for part in cmdline.read().split(b"\\0")[:-1]]
        print(json.dumps({"forked": forked, "pid": os.getpid(), "command": mine, **seen}))
    """
)


def start(tmp_path: Path, mode: str) -> dict:
    script = tmp_path / "command.py"
    script.write_text(COMMAND)
    gradebook = tmp_path / "gradebook.db"
    done = subprocess.run(
        [sys.executable, str(script), str(gradebook), mode],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    seen["gradebook"] = str(gradebook)
    return seen


def test_the_fork_server_is_a_fork_of_the_command_holding_none_of_its_files(tmp_path):
    seen = start(tmp_path, "alone")
    assert seen["forked"] is True
    assert seen["server_parent"] == seen["pid"]
    assert seen["server_command"] == seen["command"], "the server is a fork of the command, not a new interpreter"
    assert seen["gradebook"] not in seen["server_files"], seen["server_files"]
    assert seen["gradebook"] not in seen["process_files"], seen["process_files"]
    assert seen["sigterm_usual"], "the command's own signal handler reached a pool process"
    assert not still_running([seen["server"]]), "the fork server outlived the command"


def test_with_a_second_thread_the_server_is_a_new_interpreter(tmp_path):
    seen = start(tmp_path, "threaded")
    assert seen["forked"] is False
    assert seen["server_command"] != seen["command"]
    assert any("multiprocessing.forkserver" in part for part in seen["server_command"]), seen["server_command"]
    assert seen["gradebook"] not in seen["server_files"] and seen["sigterm_usual"]
    assert not still_running([seen["server"]])
