"""The program a sandboxed `omrl.sandbox.interpreter.Interpreter` runs: a Python REPL fed over a pipe.

It runs inside the sandbox on the base Python (standard library only), as the sandbox's
unprivileged user; `Interpreter` passes this file's source as the run's ``main.py``. It is not
imported by omrl itself.

Protocol, one JSON object a line (``ensure_ascii``, so a line never holds a raw newline): it writes
``{"ready": true}`` once set up, then answers each request ``{"id": ..., "nonce": ..., "code": ...,
"timeout_s": ..., "max_chars": ...}`` with ``{"id", "nonce", "stdout", "stderr", "error", "timed_out",
"stdout_cut", "stderr_cut", "stdout_bytes", "stderr_bytes"}`` (the host drops the interpreter on any
other answer; the nonce, new each call, is what makes a reply written before its request useless). A
process the code forked never answers: it exits when it comes back to the REPL loop. The protocol
uses copies of the original stdin and stdout; the code's own fds 0, 1 and 2 are /dev/null and two
files in the scratch dir, so what the code (or a program it starts) prints is caught and never
mixes with the protocol. Variables live in one namespace from call to call. Like a notebook cell,
the value of a last bare expression is printed.

Output is bounded here, not by the limits: sys.stdout and sys.stderr write only as much to their
files as a reply can show, and count the rest, so a cell that prints megabytes gets its output cut
and says how much there was, instead of reaching the file-size limit and ending the interpreter.
"""

import ast
import io
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
        _reply(replies, {"id": request["id"], "nonce": request["nonce"], **reply})


def run_cell(code: str, namespace: dict, timeout_s: float, max_chars: int) -> dict:
    """Run ``code`` in ``namespace`` with its output caught, stopped at ``timeout_s``."""
    span = 4 * max_chars + 4  # UTF-8 takes at most 4 bytes a character
    (out, out_file), (err, err_file) = _redirect_output(span)
    error = timed_out = False
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        _execute(code, namespace)
    except CellTimeout:
        timed_out = error = True
        _say(err, err_file, f"TimeoutError: the code ran past {timeout_s:g} s and was stopped\n")
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the REPL goes on
        error = True
        _say(err, err_file, _traceback(exc))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    for stream in (out, err):  # the driver's own streams: the code may have replaced sys.stdout
        _flush(stream)
    stdout, stdout_cut, stdout_bytes = _read(_OUT, out_file, max_chars)
    stderr, stderr_cut, stderr_bytes = _read(_ERR, err_file, max_chars)  # a traceback's last line says the most
    return {
        "stdout": stdout,
        "stderr": stderr,
        "error": error,
        "timed_out": timed_out,
        "stdout_cut": stdout_cut,
        "stderr_cut": stderr_cut,
        "stdout_bytes": stdout_bytes,
        "stderr_bytes": stderr_bytes,
    }


def _execute(code: str, namespace: dict) -> None:
    """exec the cell; a last bare expression is evaluated apart and its value printed (as a notebook does)."""
    tree = ast.parse(code, filename="<cell>", mode="exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))


def _traceback(exc: BaseException) -> str:
    """The traceback from the cell's frames on (the driver's own are cut)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _say(stream: io.TextIOWrapper, file: "CappedFile", text: str) -> None:
    """Write the driver's own message after what the cell wrote, even if the cell closed or
    detached ``stream``."""
    try:
        stream.write(text)
    except ValueError:
        file.write(text.encode("utf-8", errors="replace"))


def _flush(stream: io.TextIOWrapper) -> None:
    try:
        stream.flush()
    except ValueError:  # the code closed or detached it: what it held is gone with it
        pass


class CappedFile(io.RawIOBase):
    """The file under a cell's sys.stdout or sys.stderr: it writes to ``fd`` until ``cap`` bytes
    went there and only counts the rest (for stderr, whose end says the most, it keeps the last
    ``cap`` bytes of the rest in memory). It never raises: a write the file-size or disk limit
    refuses (a program the code started filled the file) is counted as dropped."""

    def __init__(self, fd: int, cap: int, keep_end: bool):
        self.fd, self.cap, self.keep_end = fd, cap, keep_end
        self.written = self.dropped = 0
        self.end = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        # a view, not a copy: a cell that prints a string as large as its memory limit allows has no
        # room left for a second copy of it
        with memoryview(data) as view, view.cast("B") as data:
            size, kept = len(data), 0
            if self.written < self.cap:
                try:
                    kept = os.write(self.fd, data[: self.cap - self.written])
                except OSError:
                    kept = 0
                self.written += kept
            self.dropped += size - kept
            if self.keep_end and kept < size:
                self.end += data[max(kept, size - self.cap) :]  # only the end it keeps
                del self.end[: -self.cap]
        return size


def _redirect_output(cap: int) -> list[tuple[io.TextIOWrapper, CappedFile]]:
    """Point fds 1 and 2 at fresh files, and sys.stdout and sys.stderr at them through a `CappedFile`
    each; returns each stream with its file.

    Each call's files are new ones (the last call's are unlinked first, not truncated): a process an
    earlier cell forked still holds that call's file, and its late writes (a buffer it flushes on its way
    out) must land there, never in this call's output."""
    streams = []
    for fd, path in ((1, _OUT), (2, _ERR)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(new, fd)
        os.close(new)
        file = CappedFile(fd, cap, keep_end=fd == 2)
        streams.append((io.TextIOWrapper(io.BufferedWriter(file), encoding="utf-8", errors="replace"), file))
    sys.stdout, sys.stderr = (stream for stream, _ in streams)
    return streams


def _read(path: str, file: CappedFile, max_chars: int) -> tuple[str, bool, int]:
    """What a stream holds: the first ``max_chars`` characters of stdout, or the last of stderr;
    whether there was more; and how many bytes were written to it in all (by the code's own
    sys.stdout or sys.stderr, and straight to the fd by a program it started)."""
    span = file.cap
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if file.keep_end and size > span:
                f.seek(size - span)
            data = f.read(span)
    except OSError:  # the code deleted it
        data, size = b"", 0
    if file.keep_end:
        data = (data + file.end)[-span:]
    text = data.decode("utf-8", errors="replace")
    total = size + file.dropped
    cut = total > len(data) or len(text) > max_chars
    return (text[-max_chars:] if file.keep_end else text[:max_chars]), cut, total


def _reply(replies, message: dict) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def _on_alarm(signum, frame):
    raise CellTimeout()


if __name__ == "__main__":
    main()
