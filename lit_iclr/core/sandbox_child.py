"""The sandbox's worker process: trusted start-up code that locks itself in, then runs the model's code.

Started by `lit_iclr.core.sandbox` as `python -I -S sandbox_child.py` (inside `unshare --mount --net --pid --ipc --uts
--fork --kill-child` where the machine allows it, so this process is PID 1 of its own namespaces). It reads one JSON
request line from stdin, and, in this order, while it still holds the rights to do so:

1. imports what it will ever need (RestrictedPython's guards, `re`/`math`/`json`) and compiles the model's code;
2. mounts a small private tmpfs (size and inode limits) on its empty working folder and `chroot`s into it: no file of
   the machine is visible from then on, not even `/proc` or `/bin/sh`;
3. closes every inherited descriptor but stdin/stdout/stderr, sets the rlimits (CPU, AS, FSIZE, NOFILE, NPROC, CORE,
   MEMLOCK), sets `no_new_privs`, drops to the unprivileged user (setgroups/setgid/setuid) and re-arms the
   parent-death signal (the kernel clears it on the uid change);
4. installs the audit hook (it cannot be switched off from Python: the blocked events are constants of its code, and
   it is referenced by no global), then runs the module code with restricted builtins and answers one JSON line per
   call: [args] -> {"ok", "result" | "error"}.

This file imports nothing of the platform (it runs under `-I -S`, without site-packages).
"""
import json
import math
import os
import re
import sys

BLOCKED_EVENTS = (
    "open", "import", "compile", "os.", "subprocess.", "socket.", "shutil.", "ctypes.", "sys.", "object.",
    "code.__new__", "function.__new__", "pty.", "glob.", "urllib.", "http.", "signal.", "resource.", "mmap.", "fcntl.",
    "syslog.", "webbrowser.", "builtins.input", "builtins.breakpoint", "cpython.", "gc.", "marshal.", "pickle.",
    "_thread.", "_posixsubprocess.", "sqlite3.", "winreg.", "msvcrt.", "setopencodehook",
)
PRELOAD_UNSAFE = ("os", "socket", "subprocess", "ctypes", "shutil", "time", "signal", "select")  # python_layers="none"
RE_NAMES = ("search", "match", "fullmatch", "findall", "finditer", "sub", "split", "compile", "escape",
            "IGNORECASE", "I", "MULTILINE", "M", "DOTALL", "S")
MATH_NAMES = ("sqrt", "log", "exp", "floor", "ceil", "inf", "pi", "isfinite", "fabs")


class Namespace:
    """A whitelisted view of a module: the named functions and constants, not the module."""

    def __init__(self, mod, names):
        for n in names:
            setattr(self, n, getattr(mod, n))


def install_audit_hook():
    """Refuse the audit events of `BLOCKED_EVENTS` (files, imports, frames via `object.__getattr__` on gi_frame /
    cr_frame / tb_frame / __code__, `sys._getframe`, processes, sockets, ctypes ...) for the rest of the process.

    The hook is built from source with the tuple written into it as a constant, in a namespace of its own and kept by
    no global: rebinding a name (the escape of a walker that reached these globals) cannot switch it off."""
    src = ("def hook(event, args):\n"
           f"    if event.startswith({BLOCKED_EVENTS!r}):\n"
           "        raise RuntimeError('sandbox: ' + event + ' is not allowed')\n")
    ns = {}
    exec(src, {"__builtins__": {"RuntimeError": RuntimeError}}, ns)
    sys.addaudithook(ns.pop("hook"))


def restricted_globals(req, printed_limit, rp):
    """The module namespace of the model's code: restricted builtins, `re`/`math`/`json` views, RestrictedPython's
    runtime guards when the code was compiled by it."""
    import builtins

    mods = {"re": Namespace(re, RE_NAMES), "math": Namespace(math, MATH_NAMES), "json": Namespace(json, ("dumps", "loads"))}

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name in mods and level == 0:
            return mods[name]
        raise ImportError("import of " + str(name) + " is not allowed")

    safe = {n: getattr(builtins, n) for n in req["builtins"]}
    safe["__import__"] = guarded_import
    safe["print"] = lambda *a, **k: None  # output of print never reaches the parent
    g = {"__builtins__": safe, "__name__": "sandbox", **mods}
    if rp is not None:
        import operator

        ops = {"+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
               "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "<<=": operator.ilshift,
               ">>=": operator.irshift, "|=": operator.ior, "^=": operator.ixor, "&=": operator.iand,
               "@=": operator.imatmul}

        class Printed:  # RestrictedPython's `_print_`: print() collects at most `printed_limit` characters
            def __init__(self, _getattr_=None):
                self.txt, self.n = [], 0

            def _call_print(self, *objects, **kwargs):
                s = " ".join(str(o) for o in objects) + "\n"
                if self.n < printed_limit:
                    self.txt.append(s[:printed_limit - self.n])
                    self.n += len(self.txt[-1])

            def __call__(self):
                return "".join(self.txt)

        g.update({
            "_getattr_": rp.safer_getattr, "_getitem_": rp.default_guarded_getitem,
            "_getiter_": rp.default_guarded_getiter, "_iter_unpack_sequence_": rp.guarded_iter_unpack_sequence,
            "_unpack_sequence_": rp.guarded_unpack_sequence, "_write_": rp.full_write_guard,
            "_inplacevar_": lambda op, x, y: ops[op](x, y), "_apply_": lambda f, *a, **k: f(*a, **k),
            "_print_": Printed,
        })
    return g


def lock_in(plan):
    """Steps 2-3 of the module docstring; returns the layers that are now active."""
    import ctypes
    import resource  # an extension module: load it before the chroot hides the library folder

    layers = []
    libc = ctypes.CDLL(None, use_errno=True)
    if os.getpid() == 1:
        layers.append("namespaces")
    workdir = plan["workdir"]
    if plan["tmpfs"]:
        owner = plan["uid"] if plan["uid"] is not None else 0
        opts = f"size={plan['disk_kb']}k,nr_inodes={plan['inodes']},mode=0700,uid={owner},gid={owner}".encode()
        if libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", 2 | 4 | 8, opts) != 0:  # MS_NOSUID | MS_NODEV | MS_NOEXEC
            raise OSError(ctypes.get_errno(), "mount tmpfs on the working folder: " + os.strerror(ctypes.get_errno()))
        layers.append("tmpfs")
    if plan["chroot"]:
        os.chroot(workdir)
        os.chdir("/")
        layers.append("chroot")
    else:
        os.chdir(workdir)
    os.closerange(3, 1 << 16)
    lim = plan["rlimits"]
    for name, value in (("RLIMIT_CPU", (lim["cpu_s"], lim["cpu_s"] + 1)), ("RLIMIT_AS", (lim["as"], lim["as"])),
                        ("RLIMIT_FSIZE", (lim["fsize"], lim["fsize"])), ("RLIMIT_NOFILE", (lim["nofile"], lim["nofile"])),
                        ("RLIMIT_NPROC", (lim["nproc"], lim["nproc"])), ("RLIMIT_CORE", (0, 0)),
                        ("RLIMIT_MEMLOCK", (0, 0))):
        resource.setrlimit(getattr(resource, name), value)
    layers.append("rlimits")
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    layers.append("no_new_privs")
    if plan["uid"] is not None:
        os.setgroups([])
        os.setgid(plan["gid"])
        os.setuid(plan["uid"])
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise OSError("could still become root after dropping privileges")
        layers.append("unprivileged_user")
    if os.getpid() == 1:
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL: the namespace dies with `unshare`
    if plan["mode"] != "none":
        for m in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
            del sys.modules[m]
    return layers


def main():
    inp, out = sys.stdin.buffer, sys.stdout.buffer

    def reply(obj):
        out.write((json.dumps(obj) + "\n").encode())
        out.flush()

    req = json.loads(inp.readline())
    plan, mode, limit = req["plan"], req["plan"]["mode"], int(req["max_output"])
    stage = "load"
    try:
        rp = None
        if mode == "all" and plan["rp_path"]:
            sys.path.insert(0, plan["rp_path"])
            from RestrictedPython import Eval, Guards, compile_restricted_exec
            del sys.path[0]

            class rp:  # noqa: N801 - the guards the compiled code calls
                safer_getattr, full_write_guard = Guards.safer_getattr, Guards.full_write_guard
                guarded_iter_unpack_sequence = Guards.guarded_iter_unpack_sequence
                guarded_unpack_sequence = Guards.guarded_unpack_sequence
                default_guarded_getitem, default_guarded_getiter = Eval.default_guarded_getitem, Eval.default_guarded_getiter

            result = compile_restricted_exec(req["code"], filename="<model-code>")
            if result.errors:
                raise SyntaxError("; ".join(result.errors))
            code = result.code
        else:
            code = compile(req["code"], "<model-code>", "exec")
        if mode == "none":
            for name in PRELOAD_UNSAFE:
                __import__(name)
            g = {"__name__": "sandbox"}
        else:
            g = restricted_globals(req, limit, rp)
        stage = "setup"
        layers = lock_in(plan)
        if mode != "none":
            install_audit_hook()
            layers += ["audit_hook", "restricted_builtins"] + (["restricted_python"] if rp is not None else [])
        stage = "load"
        exec(code, g)
        fn = g[req["entry"]]
    except BaseException as e:
        reply({"ok": False, "error": stage + ": " + type(e).__name__ + ": " + str(e)[:300]})
        return
    del req, code
    reply({"ok": True, "layers": layers})
    while True:
        line = inp.readline()
        if not line:
            break
        try:
            r = fn(*json.loads(line))
            if not isinstance(r, str):
                r = json.dumps(r)
            reply({"ok": True, "result": r[:limit]})
        except BaseException as e:
            reply({"ok": False, "error": type(e).__name__ + ": " + str(e)[:200]})


if __name__ == "__main__":
    main()
