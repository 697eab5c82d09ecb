"""Running untrusted code: :func:`run_sandboxed` (:mod:`.run`) starts it in fresh namespaces with
limits (:mod:`.limits`, the run's spec; :mod:`.process`, its processes and pipes); :mod:`.child` is the
helper that sets up the inside, :mod:`.cgroup` bounds each run's memory and :mod:`.seccomp` denies the
calls that would escape that bound. A live interpreter that keeps its
state between calls (a code tool's) is :mod:`.interpreter`, the program it runs :mod:`.driver`."""

from omrl.sandbox.limits import LANGUAGES, sandbox_python
from omrl.sandbox.run import SandboxResult, run_sandboxed

__all__ = ["LANGUAGES", "SandboxResult", "run_sandboxed", "sandbox_python"]
