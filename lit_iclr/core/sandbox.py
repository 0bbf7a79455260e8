"""Run model-written Python code in a separate, locked-down process.

A model (an LLM evolver, a program synthesiser ...) writes a function; the platform calls it on text input. The code is
untrusted, so it never runs in the training process:

- **separate process** (`python -I -S`, empty environment, empty working folder), killed with its process group;
- **time limit** per call (wall clock, checked by the parent) plus an `RLIMIT_CPU` backstop;
- **memory limit** (`RLIMIT_AS`), **no file writes** (`RLIMIT_FSIZE` = 0), few file descriptors;
- **no imports, no files, no network**: the code is checked before it runs (no dunder names or attributes, no
  `format` tricks), it sees only a small set of builtins (no `open`, `__import__`, `getattr`, `eval`, `exec` ...),
  `re`/`math`/`json` as whitelisted function namespaces (not the modules), and an audit hook in the child refuses
  `open`, `import`, `socket.*`, `os.*`, `subprocess.*`, `ctypes.*` ... even if something slips past the first layers;
- **bounded output**: the result must be a string (or JSON-able), cut to `max_output` characters in the child, and the
  parent reads at most a fixed number of bytes per reply.

`SandboxedFunction(code, entry)` keeps one worker alive for many calls (the cost of a call is a pipe round trip, not a
process start); after a timeout or crash the worker is killed and the next call starts a fresh one. A failing call
raises `SandboxError` with a one-line reason; callers decide the fallback (EvoTest keeps the parent's extractor).
"""
from __future__ import annotations

import ast
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

SAFE_BUILTINS = (
    "abs", "all", "any", "bool", "chr", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "hash", "int",
    "isinstance", "len", "list", "map", "max", "min", "ord", "range", "repr", "reversed", "round", "set", "slice",
    "sorted", "str", "sum", "tuple", "zip", "True", "False", "None",
    "Exception", "ValueError", "KeyError", "IndexError", "TypeError", "StopIteration", "ZeroDivisionError", "NameError",
    "AttributeError", "RuntimeError", "LookupError", "ArithmeticError",
)
FORBIDDEN_ATTRIBUTES = {"format", "format_map", "mro"}
FORBIDDEN_NODES = (ast.Global, ast.Nonlocal, ast.AsyncFunctionDef, ast.Await, ast.ClassDef)


class SandboxError(RuntimeError):
    """Model-written code was rejected, failed, ran out of time/memory, or returned something unusable."""


def check_source(code: str) -> ast.Module:
    """Parse `code` and reject constructs that reach outside the sandbox's namespace; raise `SandboxError`."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise SandboxError(f"syntax error at line {e.lineno}: {e.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, FORBIDDEN_NODES):
            raise SandboxError(f"{type(node).__name__} is not allowed")
        if isinstance(node, ast.Attribute) and (node.attr.startswith("_") or node.attr in FORBIDDEN_ATTRIBUTES):
            raise SandboxError(f"attribute {node.attr!r} is not allowed")
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            raise SandboxError(f"name {node.id!r} is not allowed")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n not in ("re", "math", "json") for n in names):
                raise SandboxError(f"import of {', '.join(names)} is not allowed (only re, math, json)")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__" in node.value:
            raise SandboxError("string constants holding '__' are not allowed")
    return tree


# The child: compiles the code with restricted builtins, installs the audit hook, then answers one JSON line per call.
_CHILD = r"""
import sys, json, re, math
_inp, _out = sys.stdin.buffer, sys.stdout.buffer
_req = json.loads(_inp.readline())
_max = int(_req["max_output"])

class _NS:
    def __init__(self, mod, names):
        for n in names:
            setattr(self, n, getattr(mod, n))

_mods = {
    "re": _NS(re, ["search", "match", "fullmatch", "findall", "finditer", "sub", "split", "compile", "escape",
                   "IGNORECASE", "I", "MULTILINE", "M", "DOTALL", "S"]),
    "math": _NS(math, ["sqrt", "log", "exp", "floor", "ceil", "inf", "pi", "isfinite", "fabs"]),
    "json": _NS(json, ["dumps", "loads"]),
}
def _import(name, globals=None, locals=None, fromlist=(), level=0):
    if name in _mods and level == 0:
        return _mods[name]
    raise ImportError("import of " + str(name) + " is not allowed")

import builtins as _b
_safe = {n: getattr(_b, n) for n in _req["builtins"]}
_safe["__import__"] = _import
_printed = []
def _print(*a, **k):
    if sum(len(x) for x in _printed) < _max:
        _printed.append(" ".join(str(x) for x in a)[:_max])
_safe["print"] = _print
_g = {"__builtins__": _safe, "__name__": "sandbox", "re": _mods["re"], "math": _mods["math"], "json": _mods["json"]}

_BLOCK = ("open", "import", "compile", "os.", "subprocess.", "socket.", "shutil.", "ctypes.", "sys._getframe",
          "code.__new__", "function.__new__", "pty.", "glob.", "urllib.", "http.", "signal.", "resource.", "mmap.",
          "winreg.", "sqlite3.", "fcntl.", "syslog.", "webbrowser.", "builtins.input", "cpython.")
def _hook(event, args):
    if event.startswith(_BLOCK):
        raise RuntimeError("sandbox: " + event + " is not allowed")

_code = compile(_req["code"], "<model-code>", "exec")
sys.addaudithook(_hook)

def _reply(obj):
    _out.write((json.dumps(obj) + "\n").encode())
    _out.flush()

try:
    exec(_code, _g)
    _fn = _g[_req["entry"]]
    _reply({"ok": True})
except BaseException as e:
    _reply({"ok": False, "error": "load: " + type(e).__name__ + ": " + str(e)[:200]})
    raise SystemExit(0)

while True:
    line = _inp.readline()
    if not line:
        break
    _printed.clear()
    try:
        args = json.loads(line)
        r = _fn(*args)
        if not isinstance(r, str):
            r = json.dumps(r)
        _reply({"ok": True, "result": r[:_max]})
    except BaseException as e:
        _reply({"ok": False, "error": type(e).__name__ + ": " + str(e)[:200]})
"""


def _limits(cpu_s: int, memory_mb: int) -> None:  # runs in the child between fork and exec
    import resource

    os.setsid()
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class SandboxedFunction:
    """Call `entry(*args)` defined in untrusted `code`, each call in a locked-down worker process.

    Args:
        code: Python source defining `entry`.
        entry: Name of the function to call.
        timeout_s: Wall-clock limit per call (and for loading the code).
        max_output: Longest result string kept (characters); longer results are cut in the child.
        memory_mb: Address-space limit of the worker.
        cpu_s: Total CPU seconds the worker may use over its life (a backstop behind `timeout_s`).
    """

    def __init__(self, code: str, entry: str, timeout_s: float = 1.0, max_output: int = 4000, memory_mb: int = 512,
                 cpu_s: int = 60):
        check_source(code)
        self.code, self.entry = code, entry
        self.timeout_s, self.max_output, self.memory_mb, self.cpu_s = timeout_s, max_output, memory_mb, cpu_s
        self._proc: subprocess.Popen | None = None
        self._workdir: tempfile.TemporaryDirectory | None = None

    # ------------------------------------------------------------------------------------------- process handling
    def _start(self) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="sandbox-")
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, cwd=self._workdir.name, env={}, close_fds=True,
            preexec_fn=lambda: _limits(self.cpu_s, self.memory_mb))
        request = {"code": self.code, "entry": self.entry, "max_output": self.max_output, "builtins": SAFE_BUILTINS}
        self._send(request)
        reply = self._receive()
        if not reply.get("ok"):
            self.close()
            raise SandboxError(reply.get("error", "could not load the code"))

    def _send(self, obj: Any) -> None:
        try:
            self._proc.stdin.write((json.dumps(obj) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            raise SandboxError("the sandbox process died") from None

    def _receive(self) -> dict:
        fd = self._proc.stdout.fileno()
        limit = 6 * self.max_output + 1024  # JSON escapes a character in at most 6 bytes (\uXXXX)
        buf = b""
        deadline = time.monotonic() + self.timeout_s
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise SandboxError(f"timed out after {self.timeout_s:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self._proc.poll()
                self.close()
                raise SandboxError(f"the sandbox process died (exit {code}; memory or CPU limit?)")
            buf += chunk
            if len(buf) > limit:
                self.close()
                raise SandboxError("output over the limit")
        try:
            return json.loads(buf)
        except ValueError:
            self.close()
            raise SandboxError("unreadable reply") from None

    def close(self) -> None:
        """Kill the worker (and anything it started) and remove its working folder."""
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
            for f in (self._proc.stdin, self._proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            self._proc = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    # ------------------------------------------------------------------------------------------------- calling
    def __call__(self, *args: Any) -> str:
        """`entry(*args)` (args must be JSON-able) -> its result as a string; `SandboxError` on any failure."""
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()
        self._send(list(args))
        reply = self._receive()
        if not reply.get("ok"):
            raise SandboxError(reply.get("error", "call failed"))
        return reply["result"]

    def __enter__(self) -> SandboxedFunction:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def run_sandboxed(code: str, entry: str, *args: Any, **limits: Any) -> str:
    """One call of `entry(*args)` from untrusted `code` in a fresh sandbox process (see `SandboxedFunction`)."""
    with SandboxedFunction(code, entry, **limits) as fn:
        return fn(*args)
