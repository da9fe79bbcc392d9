"""What runs in a learner's kernel: the checks the notebooks call, and nothing that can answer them.

Installed with the notebooks (the student set), in class and in self-study. It holds no
reference solution, no catalogue of mistakes and no comparison: those are the grader's
(``autograder``), installed only where grading happens.

- ``kernel_boot``: run by every graded kernel before student code: the snapshot, then the seal;
- ``trusted``: the snapshot of torch/numpy/builtins, and the detector of what was replaced since;
- ``checks``: ``check`` (every hidden test) and ``diagnose``: run the learner's code on a judge's
  cases (``observe``), let the judge decide;
- ``cases``: ``Case`` and ``ModuleCase`` (how a case runs the learner's code), ``Shipment``;
- ``verdict``: the wire to the grader outside a sandbox (``Link``, one of the two judges);
- ``modules``: a module made from reference cells a judge hands in;
- ``course``: where the notebooks and (in self-study) ``solutions/`` are, seen from the kernel;
- ``selfstudy``: the self-check, solutions after trying, progress.
"""
