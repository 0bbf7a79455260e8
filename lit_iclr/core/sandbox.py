"""Run model-written Python code in a separate process that the operating system locks in.

A model (an LLM evolver, a program synthiser ...) writes a function; the platform calls it on text input. The code is
untrusted, so it never runs in the training process. The boundary is the operating system; the Python-level layers
in front of it only turn most hostile code away early and with a clear message:

OS layers (`sandbox_layers()` says which are active on this machine; each one that is not says why):

- **namespaces**: the worker is PID 1 of new pid, network, mount, IPC and UTS namespaces (`unshare --fork
  --kill-child`): no network at all (its own network namespace, loopback down), and killing it kills every process
  it started, `setsid()` or not (the kernel empties a pid namespace when its init dies);
- **empty root**: a private tmpfs (size `disk_kb`, 64 inodes) mounted on a fresh empty folder, and `chroot` into it:
  its only writable place, and no other file is visible (no `/proc`, `/bin/sh`, project files or data);
- **unprivileged user** `nobody` (setgroups/setgid/setuid after the set-up), `no_new_privs`;
- **rlimits**: CPU (`cpu_s`), address space (`memory_mb`), file size (`disk_kb`), 16 descriptors, processes
  (`nproc`, 0 by default: no fork), no core dumps;
- inherited descriptors closed, empty environment, its own session; the code and every call go over stdin, the
  replies come back over stdout, read by the parent with a wall-clock limit (`timeout_s`) and a byte limit.

Python layers (first line, kept): `check_source` (no dunder names or attributes, no frame/code attributes such as
`gi_frame`, `f_back`, `f_globals`, `tb_frame`, no `async`, `global`, `class`, no `format` tricks) and RestrictedPython's
compiler and runtime guards (`safer_getattr`, guarded writes and unpacking); only a small set of builtins (no `open`,
`__import__`, `getattr`, `eval`, `exec`, `type` ...); `re`/`math`/`json` as whitelisted function namespaces (not the
modules); an audit hook that refuses files, imports, frame access (`object.__getattr__`, `sys._getframe`), processes,
sockets and ctypes and that cannot be switched off by rebinding a name.

`SandboxedFunction(code, entry)` keeps one worker alive for many calls (the cost of a call is a pipe round trip, not a
process start); after a timeout or crash the worker is killed and the next call starts a fresh one. A failing call
raises `SandboxError` with a one-line reason; callers decide the fallback (EvoTest keeps the parent's extractor).
"""
from __future__ import annotations

import ast
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

SAFE_BUILTINS = (
    "abs", "all", "any", "bool", "chr", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "hash", "int",
    "isinstance", "len", "list", "map", "max", "min", "ord", "range", "repr", "reversed", "round", "set", "slice",
    "sorted", "str", "sum", "tuple", "zip", "True", "False", "None",
    "Exception", "ValueError", "KeyError", "IndexError", "TypeError", "StopIteration", "ZeroDivisionError", "NameError",
    "AttributeError", "RuntimeError", "LookupError", "ArithmeticError",
)
# Attributes that lead from an object to frames, code or globals (the escape of issue 37 walked gi_frame -> f_back ->
# f_globals), plus `format` tricks; RestrictedPython refuses the same set (its INSPECT_ATTRIBUTES, CVE-2023-37271).
FRAME_ATTRIBUTES = {
    "gi_frame", "gi_code", "gi_yieldfrom", "gi_running", "cr_frame", "cr_code", "cr_await", "cr_origin", "ag_frame",
    "ag_code", "ag_await", "tb_frame", "tb_next", "f_back", "f_builtins", "f_code", "f_generator", "f_globals",
    "f_locals", "f_trace", "co_code", "co_consts", "co_names",
}
FORBIDDEN_ATTRIBUTES = {"format", "format_map", "mro"} | FRAME_ATTRIBUTES
# Builtins the sandbox does not provide and no extractor needs; naming them is refused up front (a clearer message than
# the NameError the worker would raise).
FORBIDDEN_NAMES = {"open", "eval", "exec", "compile", "getattr", "setattr", "delattr", "globals", "locals", "vars",
                   "breakpoint", "memoryview"}
FORBIDDEN_NODES = (ast.Global, ast.Nonlocal, ast.AsyncFunctionDef, ast.AsyncFor, ast.AsyncWith, ast.Await, ast.ClassDef)
NOBODY = 65534
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
PYTHON_LAYERS = ("all", "runtime", "none")


class SandboxError(RuntimeError):
    """Model-written code was rejected, failed, ran out of time/memory, or returned something unusable."""


def _restricted_python_path() -> str | None:
    try:
        import RestrictedPython
    except ImportError:
        return None
    return os.path.dirname(os.path.dirname(os.path.abspath(RestrictedPython.__file__)))


def check_source(code: str) -> ast.Module:
    """Parse `code` and reject constructs that reach outside the sandbox's namespace; raise `SandboxError`.

    Our own checks run first (short messages), then RestrictedPython's compiler (when installed) with its policy."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise SandboxError(f"syntax error at line {e.lineno}: {e.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, FORBIDDEN_NODES):
            raise SandboxError(f"{type(node).__name__} is not allowed")
        if isinstance(node, ast.Attribute) and (node.attr.startswith("_") or node.attr in FORBIDDEN_ATTRIBUTES):
            raise SandboxError(f"attribute {node.attr!r} is not allowed")
        if isinstance(node, ast.Name) and (node.id.startswith("__") or node.id in FORBIDDEN_NAMES):
            raise SandboxError(f"name {node.id!r} is not allowed")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n not in ("re", "math", "json") for n in names):
                raise SandboxError(f"import of {', '.join(names)} is not allowed (only re, math, json)")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__" in node.value:
            raise SandboxError("string constants holding '__' are not allowed")
    if _restricted_python_path() is not None:
        from RestrictedPython import compile_restricted_exec

        errors = compile_restricted_exec(code, filename="<model-code>").errors
        if errors:
            raise SandboxError(f"RestrictedPython: {errors[0]}")
    return tree


# ----------------------------------------------------------------------------------------------- which layers exist
UNSHARE_FLAGS = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child")


def _unshare_prefix() -> tuple[list[str] | None, str]:
    """The `unshare` command that works here (root: plain; otherwise in a new user namespace) or None and why."""
    exe = shutil.which("unshare") or ("/usr/bin/unshare" if os.path.exists("/usr/bin/unshare") else None)
    if exe is None:
        return None, "no `unshare` binary (util-linux) found"
    cmd = [exe, *UNSHARE_FLAGS] if os.geteuid() == 0 else [exe, "--user", "--map-root-user", *UNSHARE_FLAGS]
    try:
        r = subprocess.run([*cmd, "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=20, env={})
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"`{' '.join(cmd)} true` failed: {e}"
    if r.returncode != 0:
        return None, f"`{' '.join(cmd)} true` failed: {r.stderr.decode(errors='replace').strip()[:200]}"
    return cmd, ""


@functools.cache
def _plan() -> dict:
    """How workers are started on this machine, found once per process: the fullest plan whose trial run works;
    `plan["off"]` names each layer it lacks and why."""
    root = os.geteuid() == 0
    prefix, why_no_ns = _unshare_prefix()
    why = {  # why a layer would be off, refined by failed trial runs below
        "namespaces": why_no_ns, "tmpfs": why_no_ns or "needs the namespaces",
        "chroot": "neither root nor a user namespace: cannot chroot",
        "unprivileged_user": "not running as root: cannot switch to user nobody (the worker runs as this user)",
    }
    candidates = []
    uid = NOBODY if root else None
    if prefix is not None:
        candidates.append({"unshare": prefix, "tmpfs": True, "chroot": True, "uid": uid})
        candidates.append({"unshare": prefix, "tmpfs": False, "chroot": True, "uid": uid})
    if root:
        candidates.append({"unshare": None, "tmpfs": False, "chroot": True, "uid": uid})
    candidates.append({"unshare": None, "tmpfs": False, "chroot": False, "uid": None})
    for i, plan in enumerate(candidates):
        has = {"namespaces": plan["unshare"] is not None, "tmpfs": plan["tmpfs"], "chroot": plan["chroot"],
               "unprivileged_user": plan["uid"] is not None}
        plan["off"] = {k: why[k] for k, on in has.items() if not on}
        if _restricted_python_path() is None:
            plan["off"]["restricted_python"] = "RestrictedPython is not installed (pip install -e '.[evotest]')"
        if i == len(candidates) - 1:
            break
        reason = "trial run gave a wrong answer"
        try:
            with SandboxedFunction("def f(x):\n    return x\n", "f", timeout_s=20, _plan=plan) as fn:
                if fn("ok") == "ok":
                    break
        except SandboxError as e:
            reason = f"trial run failed: {e}"
        # each step down gives up one layer: the failed trial is the reason it is off
        if plan["tmpfs"]:
            why["tmpfs"] = reason
        elif plan["unshare"] is not None:
            why["namespaces"] = reason
            if not root:
                why["chroot"] = why["tmpfs"] = reason
        else:
            why["chroot"] = why["unprivileged_user"] = reason
    _warn_off(plan)
    return plan


def _warn_off(plan: dict) -> None:
    if plan["off"]:
        warnings.warn("sandbox: model-written code runs with these layers off: "
                      + "; ".join(f"{k} ({v})" for k, v in plan["off"].items()), RuntimeWarning, stacklevel=3)


def sandbox_layers() -> dict[str, str]:
    """Each layer -> "on" or "off: <reason>" for workers started on this machine (the fullest plan that works)."""
    off = _plan()["off"]
    names = ("namespaces", "tmpfs", "chroot", "unprivileged_user", "no_new_privs", "rlimits", "session",
             "restricted_python", "restricted_builtins", "audit_hook")
    out = {n: ("off: " + off[n] if n in off else "on") for n in names}
    return out


# ------------------------------------------------------------------------------------------------------ the worker
class SandboxedFunction:
    """Call `entry(*args)` defined in untrusted `code`, each call in a locked-down worker process.

    Args:
        code: Python source defining `entry`.
        entry: Name of the function to call.
        timeout_s: Wall-clock limit per call (and for loading the code).
        max_output: Longest result string kept (characters); longer results are cut in the child.
        memory_mb: Address-space limit of the worker.
        cpu_s: Total CPU seconds the worker may use over its life (a backstop behind `timeout_s`).
        disk_kb: Size of the worker's private tmpfs and its largest file (RLIMIT_FSIZE).
        nproc: RLIMIT_NPROC of the worker's user (0: it cannot fork; counts all processes of user nobody).
        python_layers: "all" (always, for model code). "runtime" (no source check nor RestrictedPython; restricted
            builtins and audit hook only) and "none" (plain Python with os, socket, ctypes ... loaded) exist only so
            tests can show that the layers below hold on their own.
    """

    def __init__(self, code: str, entry: str, timeout_s: float = 1.0, max_output: int = 4000, memory_mb: int = 512,
                 cpu_s: int = 60, disk_kb: int = 1024, nproc: int = 0, python_layers: str = "all",
                 _plan: dict | None = None):
        if python_layers not in PYTHON_LAYERS:
            raise ValueError(f"python_layers must be one of {PYTHON_LAYERS}, not {python_layers!r}")
        if python_layers == "all":
            check_source(code)
        self.code, self.entry, self.python_layers = code, entry, python_layers
        self.timeout_s, self.max_output, self.memory_mb, self.cpu_s = timeout_s, max_output, memory_mb, cpu_s
        self.disk_kb, self.nproc = disk_kb, nproc
        self._plan_override = _plan
        self.layers: list[str] = []  # what the current (last) worker reported as active
        self._proc: subprocess.Popen | None = None
        self._workdir: str | None = None
        self._init_pid: int | None = None  # the worker's pid as seen from here (PID 1 of its namespace)
        self._init_fd: int | None = None  # pidfd of that process: kills it without a pid-reuse race
        self._starting = False

    # ------------------------------------------------------------------------------------------- process handling
    def _start(self) -> None:
        plan = self._plan_override if self._plan_override is not None else _plan()
        self._workdir = tempfile.mkdtemp(prefix="sandbox-")
        if plan["chroot"] and not plan["tmpfs"] and plan["uid"] is not None:
            os.chown(self._workdir, plan["uid"], plan["uid"])  # plain folder as the root: the worker's only writable place
        prefix = list(plan["unshare"] or [])
        self._proc = subprocess.Popen(
            [*prefix, sys.executable, "-I", "-S", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, cwd=self._workdir, env={}, close_fds=True, start_new_session=True)
        child_plan = {
            "workdir": self._workdir, "tmpfs": plan["tmpfs"], "chroot": plan["chroot"], "uid": plan["uid"],
            "gid": plan["uid"], "disk_kb": self.disk_kb, "inodes": 64, "mode": self.python_layers,
            "rp_path": _restricted_python_path(),
            "rlimits": {"cpu_s": self.cpu_s, "as": self.memory_mb << 20, "fsize": self.disk_kb << 10, "nofile": 16,
                        "nproc": self.nproc},
        }
        request = {"code": self.code, "entry": self.entry, "max_output": self.max_output, "builtins": SAFE_BUILTINS,
                   "plan": child_plan}
        self._starting = True
        self._send(request)
        try:
            reply = self._receive()
        finally:
            self._starting = False
        if not reply.get("ok"):
            self.close()
            raise SandboxError(reply.get("error", "could not load the code"))
        self.layers = list(reply.get("layers", [])) + ["session"]
        if prefix:
            self._find_init()

    def _find_init(self) -> None:
        """The pid (and a pidfd) of `unshare`'s one child, the namespace's init, which has just replied."""
        pid = self._proc.pid
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            kids = []
            for d in os.listdir("/proc"):
                try:
                    with open(f"/proc/{d}/stat") as f:
                        if d.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            kids.append(int(d))
                except (OSError, ValueError, IndexError):
                    pass
        if len(kids) == 1:
            self._init_pid = kids[0]
            try:
                self._init_fd = os.pidfd_open(kids[0])
            except (OSError, AttributeError):
                self._init_fd = None

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
                try:
                    code = self._proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    code = None
                self.close()
                if self._starting:
                    raise SandboxError(f"the sandbox process died while starting (exit {code})")
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
        """Kill the worker and everything it started, wait until they are gone, and remove its working folder."""
        if self._proc is not None:
            if self._init_fd is not None:  # the namespace's init: the kernel then kills every process inside
                try:
                    signal.pidfd_send_signal(self._init_fd, signal.SIGKILL)
                except OSError:
                    pass
                os.close(self._init_fd)
                self._init_fd = None
            elif self._init_pid is not None:
                try:
                    os.kill(self._init_pid, signal.SIGKILL)
                except OSError:
                    pass
            try:  # unshare exits once its child is reaped, i.e. once the namespace is empty
                self._proc.wait(timeout=5 if self._init_pid is not None else 0)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # the whole session's group (all there is without namespaces)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
            for f in (self._proc.stdin, self._proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            self._proc = None
            self._init_pid = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
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
