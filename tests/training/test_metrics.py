"""The metrics logger's outputs: where TensorBoard files each metric."""

from __future__ import annotations


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


def test_peak_memory_is_the_runs_own_not_the_process_that_started_it():
    # ru_maxrss outlives exec: a run started by a 1.5 GB process read 1.5 GB as its own peak
    import subprocess
    import sys

    from omrl.training.metrics import peak_rss_gb

    launcher = (
        "import subprocess, sys\n"
        "held = bytearray(1_500_000_000)\n"
        "held[::4096] = b'\\x01' * len(held[::4096])  # touched: resident\n"
        "child = 'from omrl.training.metrics import peak_rss_gb; print(peak_rss_gb())'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True, check=True).stdout)\n"
    )
    done = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    child_peak = float(done.stdout)
    assert 0.01 < child_peak < 1.0  # the child's own imports, well under the launcher's 1.5 GB
    assert peak_rss_gb() > 0.01
