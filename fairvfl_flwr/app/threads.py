"""One BLAS thread per process, unless the operator chose otherwise.

A party's products are n × m with m in the tens: memory-bound, so a second BLAS thread
buys little on an idle machine. On a busy one (a SuperNode machine running several
ClientApp processes, a simulation, a test run) OpenBLAS's threads spin waiting for each
other and the same product becomes tens of times slower (bench/blas_threads.py,
docs/performance.md). An operator who sets one of ``THREAD_VARS`` keeps that choice.
"""

from __future__ import annotations

import os

from threadpoolctl import threadpool_limits

#: Environment variables through which an operator sets BLAS threads; any of them set wins.
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_blas_threads() -> bool:
    """Limit this process's BLAS to one thread; False where the environment chose."""
    if any(var in os.environ for var in THREAD_VARS):
        return False
    threadpool_limits(limits=1, user_api="blas")
    return True
