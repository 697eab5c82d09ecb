"""verifiers environments for tests/envs/test_verifiers_env.py, written as verifiers' docs write them: a module
with ``load_environment(**args)`` returning a ``vf.SingleTurnEnv``, ``vf.MultiTurnEnv`` or ``vf.ToolEnv``."""
