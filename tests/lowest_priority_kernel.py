"""The kernel of a stock nbgrader run beside the other tests (``grading_harness.Beside``): ipykernel,
started as its own launcher starts it, once its session's share of the CPU is the lowest.

jupyter_client starts every kernel in a session of its own, and Linux's scheduler (with its
autogroups, on here) shares the CPU between sessions first, then by nice within each: a
kernel's nice, inherited from a nice 19 nbgrader, weighed nothing beside another session's. Writing
19 to ``/proc/self/autogroup`` lowers this kernel's session as a whole (any user may lower their own).
"""

import sys

del sys.path[0]  # this file's folder, tests/: none of the suite's modules is the kernel's to import

try:
    with open("/proc/self/autogroup", "w") as autogroup:
        autogroup.write("19")
except OSError:  # a system without autogroups: the kernel's own nice, 19 from nbgrader, is what counts
    pass

from ipykernel import kernelapp  # noqa: E402  (after the priority, as ipykernel_launcher does after sys.path)

kernelapp.launch_new_instance()
