"""Children that die with the thread that started them, without a ``preexec_fn``.

A ``preexec_fn`` runs Python in the forked child before exec, which the subprocess docs warn can deadlock when
the parent has other threads; the parent's ``Popen`` then waits for that child forever (in the kubelet stand-in:
a pod that never starts and no error anywhere). util-linux's ``setpriv`` sets PR_SET_PDEATHSIG in C and execs
the command, so the child's pid is the command's. The signal follows the *thread* that forked the child.
"""

from __future__ import annotations

import shutil

SETPRIV = shutil.which("setpriv")


def die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGKILL when the forking thread (hence this process) dies."""
    if SETPRIV is None:
        raise RuntimeError("setpriv (util-linux) is required to start harness processes; install util-linux")
    return [SETPRIV, "--pdeathsig", "KILL", "--", *argv]
