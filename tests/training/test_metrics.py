"""The metrics logger's outputs: where TensorBoard files each metric, and the peak memory a run reports."""

from __future__ import annotations

import builtins
import resource
import subprocess
import sys

from omrl.training.metrics import peak_rss_gb


def test_tensorboard_puts_the_evaluation_under_eval_and_the_rest_under_train(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from omrl.config.options import LoggingConfig
    from omrl.training.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path, LoggingConfig(output_dir=str(tmp_path), tensorboard=True), 1)
    logger.log(1, {"loss": 0.5, "eval_success": 0.25})
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "eval/success"}


def test_tensorboard_asked_for_but_not_installed_is_said_once_and_the_run_goes_on(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from omrl.config.options import LoggingConfig
    from omrl.training.metrics import MetricsLogger

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as on an install without the extra: import fails
    out = io.StringIO()
    logger = MetricsLogger(
        tmp_path, LoggingConfig(output_dir=str(tmp_path), tensorboard=True), 1, console=Console(file=out)
    )
    logger.log(1, {"loss": 0.5})
    logger.close()
    said = " ".join(out.getvalue().split())
    assert said.count("tensorboard is not installed") == 1 and "pip install 'omrl[tensorboard]'" in said, said
    assert not (tmp_path / "tensorboard").exists() and '"loss": 0.5' in (tmp_path / "metrics.jsonl").read_text()


def test_peak_memory_is_the_runs_own_not_the_process_that_started_it():
    # ru_maxrss outlives exec: a run started by a 1 GB process read 1 GB as its own peak
    launcher = (
        "import subprocess, sys\n"
        "held = bytearray(1_000_000_000)\n"
        "held[::4096] = b'\\x01' * len(held[::4096])  # touched: resident\n"
        "child = 'from omrl.training.metrics import peak_rss_gb; print(peak_rss_gb())'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True, check=True).stdout)\n"
    )
    done = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 0.01 < float(done.stdout) < 0.6  # the child's own imports (about 0.08 GB), not the launcher's 1 GB


def test_without_procfs_the_peak_comes_from_the_resource_module(monkeypatch):
    real_open = builtins.open

    def no_procfs(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_procfs)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # KiB on Linux
    got = peak_rss_gb()
    assert 0.01 < before <= got <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def test_a_base_install_without_tensorboard_defaults_it_off_and_says_nothing():
    """The README's first command warned "logging.tensorboard is on but tensorboard is not installed" on a
    fresh machine: the default it could not honour."""
    import subprocess

    hide = (
        "import sys; sys.modules['tensorboard'] = None; "  # find_spec then raises: as it answers None when absent
        "import importlib.util as u; real = u.find_spec; "
        "u.find_spec = lambda name, *a: None if name == 'tensorboard' else real(name, *a); "
        "from omrl.config.sections import LoggingConfig; print(LoggingConfig().tensorboard)"
    )
    shown = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "False"
