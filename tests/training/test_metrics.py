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
