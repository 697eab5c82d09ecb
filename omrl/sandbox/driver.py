"""The program a sandboxed `omrl.sandbox.interpreter.Interpreter` runs: a Python REPL fed over a pipe.

It runs inside the sandbox on the base Python (standard library only), as the sandbox's
unprivileged user; `Interpreter` passes this file's source as the run's ``main.py``. It is not
imported by omrl itself.

Protocol, one JSON object a line (``ensure_ascii``, so a line never holds a raw newline): it writes
``{"ready": true}`` once set up, then answers each request ``{"id": ..., "code": ..., "timeout_s": ...,
"max_chars": ...}`` with ``{"id", "stdout", "stderr", "error", "timed_out", "truncated"}`` (the
host drops the interpreter on any other answer). A process the code forked never answers: it
exits when it comes back to the REPL loop. The protocol uses copies of the original stdin and stdout; the code's own fds 0, 1 and 2 are /dev/null and two
files in the scratch dir, so what the code (or a program it starts) prints is caught and never
mixes with the protocol. Variables live in one namespace from call to call. Like a notebook cell,
the value of a last bare expression is printed.
"""

import ast
import json
import os
import signal
import sys
import traceback

_OUT, _ERR = "/scratch/.omrl-stdout", "/scratch/.omrl-stderr"


class CellTimeout(BaseException):
    """Raised in the code at its time limit; a BaseException so that ``except Exception`` misses it."""


def main() -> None:
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGALRM, _on_alarm)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    me = os.getpid()
    _reply(replies, {"ready": True})
    for line in requests:
        request = json.loads(line)
        reply = run_cell(request["code"], namespace, request["timeout_s"], request["max_chars"])
        if os.getpid() != me:  # a child the code forked, back in the loop: only the REPL itself answers
            os._exit(0)
        _reply(replies, {"id": request["id"], **reply})


def run_cell(code: str, namespace: dict, timeout_s: float, max_chars: int) -> dict:
    """Run ``code`` in ``namespace`` with its output caught, stopped at ``timeout_s``."""
    _redirect_output()
    error = timed_out = False
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        _execute(code, namespace)
    except CellTimeout:
        timed_out = error = True
        print(f"TimeoutError: the code ran past {timeout_s:g} s and was stopped", file=sys.stderr)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the REPL goes on
        error = True
        _print_traceback(exc)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    sys.stdout.flush()
    sys.stderr.flush()
    stdout, cut_out = _read(_OUT, max_chars, tail=False)
    stderr, cut_err = _read(_ERR, max_chars, tail=True)  # a traceback's last line says the most
    return {"stdout": stdout, "stderr": stderr, "error": error, "timed_out": timed_out, "truncated": cut_out or cut_err}


def _execute(code: str, namespace: dict) -> None:
    """exec the cell; a last bare expression is evaluated apart and its value printed (as a notebook does)."""
    tree = ast.parse(code, filename="<cell>", mode="exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))


def _print_traceback(exc: BaseException) -> None:
    """The traceback from the cell's frames on (the driver's own are cut)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
        tb = tb.tb_next
    sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))


def _redirect_output() -> None:
    """Point fds 1 and 2 at fresh files, and sys.stdout and sys.stderr at those fds.

    Each call's files are new ones (the last call's are unlinked first, not truncated): a process an
    earlier cell forked still holds that call's file, and its late writes (a buffer it flushes on its way
    out) must land there, never in this call's output."""
    for fd, path in ((1, _OUT), (2, _ERR)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(new, fd)
        os.close(new)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)


def _read(path: str, max_chars: int, tail: bool) -> tuple[str, bool]:
    """The first (or last) ``max_chars`` characters of a file, and whether there was more."""
    span = 4 * max_chars + 4  # UTF-8 takes at most 4 bytes a character
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if tail and size > span:
                f.seek(size - span)
            data = f.read(span)
    except OSError:  # the code deleted it
        return "", False
    text = data.decode("utf-8", errors="replace")
    cut = size > len(data) or len(text) > max_chars
    return (text[-max_chars:] if tail else text[:max_chars]), cut


def _reply(replies, message: dict) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def _on_alarm(signum, frame):
    raise CellTimeout()


if __name__ == "__main__":
    main()
