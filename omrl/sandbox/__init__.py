"""Running untrusted code: :func:`run_sandboxed` (:mod:`.run`) starts it in fresh namespaces with
limits; :mod:`.child` is the helper that sets up the inside."""

from omrl.sandbox.run import LANGUAGES, SandboxResult, run_sandboxed, sandbox_python

__all__ = ["LANGUAGES", "SandboxResult", "run_sandboxed", "sandbox_python"]
