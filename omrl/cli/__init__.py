"""The ``omrl`` command line: a typer app, one small module per command (``<command>_cmd.py``).
:mod:`.settings` is the one rule for the settings a run plays (a trained model's, flags, overrides),
:mod:`.model_prompts` what a fine-tuned model implies for a command's config, :mod:`.play_flags` the
flags the commands that play episodes share, :mod:`.play_checks` what they refuse before a model loads,
:mod:`.env_options` how ``omrl env play`` and ``serve`` take an env's options.

Errors that omrl raises on purpose (:class:`omrl.errors.OmrlError`) print as one
line and exit with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import typer
from rich.console import Console
from rich.markup import escape  # messages name extras such as omrl[plot]: markup would eat the brackets
from rich.text import Text

from omrl import __version__
from omrl.processes import is_main_process, process_label, process_rank, world_size

app = typer.Typer(
    name="omrl",
    help="Train LLM agents with reinforcement learning in multi-turn environments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
err_console = Console(stderr=True)
T = TypeVar("T")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"omrl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    """Train LLM agents with reinforcement learning in multi-turn environments."""


def _add_builtin_commands() -> None:
    from omrl.cli import (
        check_template_cmd,
        checkpoint_cmd,
        config_cmd,
        data_cmd,
        env_cmd,
        eval_cmd,
        plot_cmd,
        plugins_cmd,
        rm_cmd,
        rollout_cmd,
        sft_cmd,
        sweep_cmd,
        train_cmd,
        view_cmd,
    )

    for module in (
        plugins_cmd,
        config_cmd,
        env_cmd,
        rollout_cmd,
        eval_cmd,
        sweep_cmd,
        sft_cmd,
        train_cmd,
        rm_cmd,
        data_cmd,
        view_cmd,
        plot_cmd,
        check_template_cmd,
        checkpoint_cmd,
    ):
        module.add_to(app)


# commands that only read files: loading plugins (and with them torch) would only delay them
LIGHT_COMMANDS = ("view", "plot")


def _keep_flag_names_whole() -> None:
    """In ``--help`` at 80 columns every flag name prints whole. A ``--x/--no-x`` pair shows its two names
    on two lines of one cell: typer gives ``--no-x`` a column of its own, and next to a long ``--x`` the
    two left the help too little room, so rich cut or folded the names (``--per-device-train-b``).
    A name wider than a narrower terminal still folds rather than being cut."""
    import copy

    from typer import rich_utils

    for name in ("highlighter", "negative_highlighter"):
        plain = getattr(rich_utils, name, None)
        if plain is None or getattr(plain, "_omrl_folds", False):
            continue

        class Folding(type(plain)):
            _omrl_folds = True

            def __call__(self, text):
                out = super().__call__(text)
                out.overflow = "fold"
                return out

        setattr(rich_utils, name, Folding())

    panel = rich_utils._print_options_panel
    if getattr(panel, "_omrl_pairs", False):
        return

    def pairs_in_one_cell(*, params, **kwargs):
        shown = []
        for param in params:
            if any(o.startswith("--") for o in param.secondary_opts):
                param = copy.copy(param)  # typer reads the names from the param: the command keeps its own
                param.opts = ["\n".join([*param.opts, *param.secondary_opts])]
                param.secondary_opts = []
            shown.append(param)
        return panel(params=shown, **kwargs)

    pairs_in_one_cell._omrl_pairs = True
    rich_utils._print_options_panel = pairs_in_one_cell


def build_app(plugins: bool = True) -> typer.Typer:
    """The root app with built-in commands and (unless ``plugins`` is False) plugin commands added."""
    if not getattr(app, "_omrl_built", False):
        _add_builtin_commands()
        _keep_flag_names_whole()
        app._omrl_built = True
    if plugins and not getattr(app, "_omrl_plugins", False):
        from omrl.plugins import load_plugins

        load_plugins().hook.register_commands(cli=app)
        app._omrl_plugins = True
    _one_line_summaries(app)
    return app


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """Each command's help with its paragraphs of prose on one line each, its summary too: typer's rich mode
    keeps a docstring's line breaks, which cut sentences where the source wrapped them. A paragraph that is a
    list (a line opening with '-', '*' or a space) keeps its lines."""
    import inspect

    def reflowed(paragraph: str) -> str:
        lines = paragraph.split("\n")
        return paragraph if any(line[:1] in ("-", "*", " ") for line in lines) else " ".join(lines)

    for info in typer_app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback) or ""
        if doc:
            info.help = "\n\n".join(reflowed(paragraph) for paragraph in doc.split("\n\n"))
            info.short_help = info.short_help or info.help.split("\n\n")[0]
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


# failures of the machine or the files, not of omrl: reported as such, with exit status 2
WORLD_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EACCES: "permission denied",
    errno.EPERM: "the operation is not permitted there",
    errno.EROFS: "the file system is read-only",
    errno.EIO: "an I/O error",
    errno.ENOMEM: "out of memory",
    errno.EMFILE: "too many open files",
}


TERMINATED: list[int] = []  # the SIGTERM this process was sent, once it was


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While the block runs, SIGTERM (a scheduler's preemption, ``docker stop``, ``kill``) stops a command
    as Ctrl-C does: its env servers and processes are stopped, the checkpoints kept are named with the
    command that resumes them, and it exits 143. By default Python dies at once, leaving them running and
    saying nothing. A handler someone else set (an embedder's) stays, as does any off the main thread."""
    import signal
    import threading

    def terminate(signum: int, frame: object) -> None:
        TERMINATED.append(signum)
        raise KeyboardInterrupt("terminated (SIGTERM)")

    ours = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    if ours:
        signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        if ours:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_on_interrupt(run: Callable[[], T], console: Console, lost: Callable[[], str] | None = None) -> T:
    """``run()``; on Ctrl-C, print what was kept and how to resume (the recipes say it; ``lost()`` says what
    was not, where nothing is) and exit 130 (143 on SIGTERM: :func:`stop_on_sigterm`)."""
    try:
        return run()
    except KeyboardInterrupt as stop:
        said = f"terminated (SIGTERM): {stop}" if TERMINATED and "SIGTERM" not in str(stop) else str(stop)
        said = f"{said or 'interrupted'}: {lost()}" if lost is not None else said
        if TERMINATED and world_size() > 1:  # how a launcher ends the survivors
            said += (
                " (under accelerate launch, a SIGTERM most often means another process of the run failed: "
                "its error is in the launcher's report)"
            )
        if is_main_process():  # every process of a launch was stopped: said once, for all
            console.print(Text(said or "interrupted", style="yellow"), highlight=False, soft_wrap=True)
        raise typer.Exit(143 if TERMINATED else 130) from stop


def report_error(exc: BaseException, debug: bool) -> int:
    """Print one line for ``exc`` (or the traceback with --debug); return the exit status."""
    from omrl.errors import OmrlError
    from omrl.plugins import plugin_in_traceback

    world = isinstance(exc, (OSError, MemoryError)) and (isinstance(exc, MemoryError) or exc.errno in WORLD_ERRNOS)
    who = escape(process_label())  # under a launch each process may fail its own way: each says which it is
    if debug:
        err_console.print_exception()
    elif world:
        what = "out of memory" if isinstance(exc, MemoryError) else WORLD_ERRNOS[exc.errno]
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        err_console.print(
            f"[bold red]error:[/] {who}{escape(f'{what}{where}: {exc}')}", highlight=False, soft_wrap=True
        )
        return 2
    elif isinstance(exc, OmrlError):
        err_console.print(f"[bold red]error:[/] {who}{escape(str(exc))}", highlight=False, soft_wrap=True)
    elif peer_failed(exc):
        err_console.print(
            f"[bold red]error:[/] process {process_rank()} of this run lost its connection to another, "
            f"which failed first: its error, above or in its log, is the reason ({type(exc).__name__}: "
            f"{escape(str(exc)[:300])})",
            highlight=False,
            soft_wrap=True,
        )
    else:  # a bug: of the third-party plugin whose code raised it, where one did
        culprit = plugin_in_traceback(exc.__traceback__)
        whose = f"raised in {culprit}: a bug in that plugin" if culprit else "this is a bug in omrl or a plugin"
        err_console.print(
            f"[bold red]error:[/] {who}{type(exc).__name__}: {escape(str(exc))} "
            f"({escape(whose)}; run with --debug for the traceback)",
            highlight=False,
            soft_wrap=True,
        )
    return 2 if isinstance(exc, OmrlError) else 1


# what torch.distributed's backends say when the process at the other end of a collective is gone
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crash", "Broken pipe")


def peer_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is this process of a run of several finding another one gone (it failed first, and
    its own error says why), not a bug where it was raised."""
    if world_size() < 2:
        return False
    distributed = sys.modules.get("torch.distributed")  # never imported for this: a run of several has it
    if distributed is not None and isinstance(exc, getattr(distributed, "DistError", ())):
        return True
    return isinstance(exc, RuntimeError) and any(words in str(exc) for words in PEER_GONE)


#: device files whose presence means a GPU DeepSpeed could use (NVIDIA, AMD)
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


def quiet_third_parties() -> None:
    """omrl draws its own progress bars and says its own warnings, one line each: turn off the hub's and
    transformers' bars (unless the user set them) and print Python warnings without their source lines."""
    import warnings

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when huggingface_hub loads
    if not any(Path(device).exists() for device in ACCELERATOR_DEVICES):
        # DeepSpeed, imported by accelerate when installed, would log "Setting accelerator to CPU" on every run
        os.environ.setdefault("DS_ACCELERATOR", "cpu")

    own = Path(__file__).resolve().parents[1]  # the omrl package: its warnings speak to the user, not of code

    def one_line(message, category, filename, lineno, file=None, line=None) -> None:
        if not is_main_process():  # under accelerate launch the main process says it once for all
            return
        if Path(filename).resolve().is_relative_to(own):
            text = f"warning: {message}"
        else:
            text = f"warning: {category.__name__}: {message} ({Path(filename).name}:{lineno})"
        err_console.print(Text(text, style="yellow"), soft_wrap=True)

    warnings.showwarning = one_line


def _app_for(argv: list[str], light: bool) -> typer.Typer:
    """The app for ``argv``. ``omrl --version`` and ``omrl --help`` (no command named) still answer where a
    third-party plugin fails to import, without its commands and saying so: they are how one finds out."""
    from omrl.plugins import PluginError

    if light:
        return build_app(plugins=False)
    try:
        return build_app()
    except PluginError as exc:
        if next((a for a in argv if not a.startswith("-")), None) is not None:
            raise
        err_console.print(f"[yellow]warning:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return build_app(plugins=False)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_third_parties()
    debug = "--debug" in argv or bool(os.environ.get("OMRL_DEBUG"))
    if "--debug" in argv:  # an option of omrl itself, wherever it is typed: `omrl plot RUN --debug` too
        argv = ["--debug", *(arg for arg in argv if arg != "--debug")]
    try:
        light = next((a for a in argv if not a.startswith("-")), None) in LIGHT_COMMANDS
        if not light:
            from omrl.threads import configure_threads

            configure_threads()  # before any model runs: a busy machine must not be oversubscribed
        command = typer.main.get_command(_app_for(argv, light))
        # standalone mode: typer reports usage errors and exits with their status itself
        with stop_on_sigterm():
            command.main(args=argv, prog_name="omrl", standalone_mode=True)
    except Exception as exc:  # noqa: BLE001 - the one place errors become exit codes
        sys.exit(report_error(exc, debug))
