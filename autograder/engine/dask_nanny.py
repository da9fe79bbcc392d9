"""``dask worker --preload-nanny autograder.engine.dask_nanny`` (what ``./course worker`` runs).

Each nanny then starts its worker process from a fork server that imported what grading needs once
(torch, the executor, nbgrader's preprocessors: ``pool_preload``, as for the local pool's
processes), so the worker processes of one ``./course worker`` share that memory instead of each
importing its own copy (about 200 MB a process). As root the server also starts one sandbox host
for them all (``dask_host``). The nanny itself imports none of it.
"""

from __future__ import annotations

# what the fork server imports before it forks any worker process: Dask's own, the grader's, the host
PRELOAD = ["distributed", "autograder.engine.pool_preload", "autograder.engine.dask_host"]


def dask_setup(nanny) -> None:
    """Before the nanny starts its worker process (Dask runs a nanny's preloads first)."""
    import dask
    from distributed import utils

    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    context = utils.get_mp_context()  # Dask sets its own preload list once, here; ours replaces it
    context.set_forkserver_preload(PRELOAD)
