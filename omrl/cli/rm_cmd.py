"""``omrl rm``: train and evaluate reward models (outcome and process) on trajectory files.

omrl rm train [PRESET] [key=value ...] --data ROLLOUTS --kind orm --label success --output-dir runs/rm
omrl rm train --data expert.parquet:0.3,policy/:0.7 ...   (several datasets mixed by weight)
omrl rm eval --model runs/rm --data HELD_OUT_ROLLOUTS
"""

from __future__ import annotations

from typing import Optional

import typer

from omrl.cli.sft_cmd import DATASET_TRAINER_KEYS, EPOCHS_OPTION, LEARNING_RATE_OPTION, LORA_RANK_OPTION, SEED_OPTION

rm_app = typer.Typer(help="Train and evaluate agent reward models (outcome and process).", no_args_is_help=True)

FLAG_KEYS = {
    **DATASET_TRAINER_KEYS,
    "data": "dataset",
    "eval_data": "eval_dataset",
    "kind": "kind",
    "label": "label",
    "objective": "objective",
}


@rm_app.command("train")
def train(
    args: Optional[list[str]] = typer.Argument(
        None, help="An optional preset name or YAML path, then key=value overrides (see `omrl config keys rm-train`)."
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Base model: the policy's (same tokenizer)."),
    data: Optional[str] = typer.Option(
        None, "--data", help="Trajectory parquet (file or directory); several with weights: a.parquet:0.5,b:0.5."
    ),
    eval_data: Optional[str] = typer.Option(None, "--eval-data", help="Held-out trajectories to report on."),
    kind: Optional[str] = typer.Option(None, "--kind", help="orm (per episode) or prm (per turn)."),
    label: Optional[str] = typer.Option(None, "--label", help="orm: success, score; prm: mc, mc_score, step_reward."),
    objective: Optional[str] = typer.Option(None, "--objective", help="bce, mse or bt (pairs, orm)."),
    learning_rate: Optional[float] = LEARNING_RATE_OPTION,
    num_train_epochs: Optional[float] = EPOCHS_OPTION,
    output_dir: Optional[str] = typer.Option(None, "--output-dir", "-o", help="Where the reward model is saved."),
    lora_rank: Optional[int] = LORA_RANK_OPTION,
    seed: Optional[int] = SEED_OPTION,
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest complete checkpoint."),
) -> None:
    """Train a reward model on trajectories; saved in Hugging Face format (loadable with transformers)."""
    from transformers.utils import logging as hf_logging

    from omrl.cli import err_console, stop_on_interrupt
    from omrl.config import command_line_config
    from omrl.config.options import RmTrainRunConfig
    from omrl.config.presets import preset_inputs, resumed_preset
    from omrl.data.mixture import dataset_inputs, mix_line
    from omrl.outputs import check_run_dir
    from omrl.parallel import is_main_process
    from omrl.rm.train import run_rm_train

    flags = {FLAG_KEYS[name]: value for name, value in locals().items() if name in FLAG_KEYS}
    preset = resumed_preset(output_dir, resume, None)  # a resume plays the run's own config.yaml, as sft's does
    cfg = command_line_config(RmTrainRunConfig, args, {**flags, "resume": True if resume else None}, preset)
    datasets = dataset_inputs(cfg.dataset, "--data")  # each dataset of a mixture
    inputs = {"--model": cfg.model.name, **datasets, "--eval-data": cfg.eval_dataset, **preset_inputs(args, resume)}
    check_run_dir(cfg.logging.output_dir, inputs, cfg.resume)
    hf_logging.disable_progress_bar()
    summary = stop_on_interrupt(lambda: run_rm_train(cfg), err_console)
    if is_main_process():
        typer.echo(
            f"trained the {cfg.kind} reward model on {summary['examples']} examples in {summary['steps']} "
            f"steps (final loss {summary['final_loss']:.4f}); reward model saved in {summary['output_dir']}"
        )
        if "data_mix" in summary:
            unit = "pairs" if cfg.objective == "bt" else "examples"
            typer.echo(f"dataset mixture: {mix_line(summary['data_mix'], unit)}")
        if "eval" in summary:
            _print_report(summary["eval"])


@rm_app.command("eval")
def evaluate(
    args: Optional[list[str]] = typer.Argument(
        None, help="An optional preset name or YAML path, then key=value overrides (see `omrl config keys rm-eval`)."
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Reward model directory (from `omrl rm train`)."),
    data: Optional[str] = typer.Option(None, "--data", help="Held-out trajectory parquet (file or directory)."),
    report: Optional[str] = typer.Option(
        None, "--report", help="JSON report path (default: <model>/rm_eval-<data>.json)."
    ),
    text: Optional[bool] = typer.Option(
        None,
        "--text/--no-text",
        help="Re-encode the chats with the reward model's tokenizer (default: as the model was trained).",
    ),
) -> None:
    """Accuracy, AUC and calibration on held-out episodes, and best-of-N selection against random and oracle."""
    import warnings
    from pathlib import Path

    from omrl.config import command_line_config, user_sets
    from omrl.config.options import RmEvalRunConfig
    from omrl.errors import ConfigError
    from omrl.models import check_model_files
    from omrl.outputs import check_outputs
    from omrl.rm.data import check_trajectory_ids
    from omrl.rm.evaluate import evaluate_reward_model, write_rm_report
    from omrl.rm.model import RewardModel

    flags = {"model.name": model, "dataset": data, "report": report, "text": text}
    cfg = command_line_config(RmEvalRunConfig, args, flags)
    model, data = cfg.model.name, cfg.dataset
    if not Path(model).expanduser().is_dir():
        raise ConfigError(
            f"omrl rm eval: --model {model!r} is not a folder; give a reward model directory that `omrl rm train` wrote"
        )
    if not data:
        raise ConfigError("omrl rm eval needs --data: held-out trajectories (a parquet file or folder)")
    given = text is not None or user_sets(args, "text")
    text = cfg.text if given else trained_with_text(Path(model).expanduser())
    # named after the data: the held-out report rm train wrote (rm_eval.json) is not replaced
    report_path = (
        Path(cfg.report) if cfg.report else Path(model) / f"rm_eval-{Path(data).expanduser().resolve().stem}.json"
    )
    check_outputs({"--report": report_path}, {"the --model": model, "the --data": data})
    check_model_files(Path(model).expanduser())  # a damaged file is named, not met mid-load
    reward_model = RewardModel.load(model)
    if not text:  # the episodes' own ids are scored: one the model lacks is named before any work
        check_trajectory_ids(data, reward_model.tokenizer)
    result = evaluate_reward_model(model, data, text=text, reward_model=reward_model)
    path = write_rm_report(result, report_path)
    if "auc" in result["scores"] and result["scores"]["auc"] is None:
        warnings.warn(
            f"every example in {data} has the same outcome, so auc and pair accuracy are undefined (-): a reward "
            "model is measured on data where some episodes won and some lost",
            stacklevel=1,  # said by the command itself: its caller is typer
        )
    _print_report(result)
    typer.echo(f"report written to {path}")


def trained_with_text(model_dir) -> bool:
    """Whether the reward model in ``model_dir`` was trained with ``text=true`` (its config.yaml says;
    False when it has none, e.g. a model from elsewhere)."""
    import yaml

    config = model_dir / "config.yaml"
    if not config.is_file():
        return False
    return bool((yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("text", False))


def _print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    scores = Table(title=f"{report['kind']} ({report['objective']}, label {report['label']}) on {report['data']}")
    scores.add_column("metric")
    scores.add_column("value", justify="right")
    for key, value in {**report["scores"], **{f"pair_{k}": v for k, v in report.get("pairs", {}).items()}}.items():
        scores.add_row(key, f"{value:.4f}" if isinstance(value, float) else "-" if value is None else str(value))
    console.print(scores)
    for measure, what in (("", "success"), ("_score", "env score")):
        if not report.get("selection"):
            break
        table = Table(title=f"best-of-N {what}: picked by the reward model vs a random pick (pass@1) vs the oracle")
        for column in ("N", "tasks", "selected", "random", "oracle", "gain (paired)"):
            table.add_column(column, justify="right")
        for row in report["selection"]:
            table.add_row(
                str(row["n"]),
                str(row["tasks"]),
                *(
                    f"{row[k + measure]:.3f} ± {row[k + measure + '_se']:.3f}"
                    for k in ("selected", "random", "oracle", "gain")
                ),
            )
        console.print(table)


def add_to(app: typer.Typer) -> None:
    app.add_typer(rm_app, name="rm")
