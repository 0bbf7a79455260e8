"""Model-written code in the sandbox: results come back; hostile code is stopped (loops, files, imports, output, escapes).

The escape tests write hostile code, run it through the sandbox and check on the machine that its effect did NOT
happen: a canary outside the folder still unread / undeleted, no file written outside, nothing reached a loopback
listener, `/bin/sh` never ran, no process survives the run, a fork bomb stays bounded. Each escape is tried three ways:
with every layer (refused by the source check), with the source checks skipped (`python_layers="runtime"`: the
restricted builtins and the audit hook must hold), and as plain Python with os/socket/ctypes at hand
(`python_layers="none"`: the OS layers alone must hold).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from lit_iclr.core import sandbox
from lit_iclr.core.sandbox import SandboxedFunction, SandboxError, check_source, run_sandboxed, sandbox_layers

EXTRACTOR = '''
import re

def extract_state(history):
    rooms = re.findall(r"-= (.+?) =-", " ".join(o for a, o in history))
    return "room: " + (rooms[-1] if rooms else "unknown") + " | steps: " + str(len(history))
'''
SECRET = "SECRET-42"
LAYERS = sandbox_layers()


def needs(*layers):
    off = {n: LAYERS[n] for n in layers if LAYERS[n] != "on"}
    return pytest.mark.skipif(bool(off), reason="; ".join(f"{n} {v}" for n, v in off.items()))


# ------------------------------------------------------------------------------------------------ fixtures, probes
@pytest.fixture
def outside():
    """A folder outside the sandbox that anyone may read and write (so only the sandbox stops access): a canary to
    read, a victim to delete, room for markers."""
    d = Path(tempfile.mkdtemp(prefix="sandbox-outside-"))
    d.chmod(0o777)
    (d / "canary").write_text(SECRET)
    (d / "canary").chmod(0o666)
    (d / "victim").write_text("still here")
    (d / "victim").chmod(0o666)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    s.settimeout(0.3)
    yield s
    s.close()


def nothing_connected(listener) -> bool:
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        return True
    conn.close()
    return False


def pid_namespace(fn: SandboxedFunction) -> str:
    return os.readlink(f"/proc/{fn._init_pid}/ns/pid")


def members(ns: str) -> list[int]:
    """Processes (pids as seen here) living in pid namespace `ns`."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/ns/pid") == ns:
                    out.append(int(d))
            except OSError:
                pass
    return out


def assert_no_effect(outside: Path, listener=None):
    assert (outside / "canary").read_text() == SECRET
    assert (outside / "victim").read_text() == "still here"
    assert sorted(p.name for p in outside.iterdir()) == ["canary", "victim"]  # no marker, no written file
    if listener is not None:
        assert nothing_connected(listener)


def issue_escape(outside: Path, port: int, children: int = 20) -> str:
    """The escape of issue 37, which passed the old source check: walk a running generator's frames (gi_frame, f_back,
    f_globals) to the child's module globals, switch the audit hook off by rebinding _BLOCK, then read a file outside,
    connect to a socket, delete a file, run /bin/sh and fork setsid() children."""
    return f'''
def extract_state(history):
    out = []
    def walk():
        yield gen.gi_frame.f_back.f_back.f_globals
    gen = walk()
    for g in gen:
        break
    g["_BLOCK"] = ("nothing-is-blocked",)
    b = g["_b"]
    dd = "_" * 2
    imp = b.getattr(b, dd + "import" + dd)
    os = imp("os")
    try:
        out.append("read:" + b.open({str(outside / "canary")!r}).read())
    except BaseException as e:
        out.append("read refused " + repr(e))
    try:
        socket = imp("socket")
        s = socket.socket()
        s.settimeout(2)
        s.connect(("127.0.0.1", {port}))
        s.sendall(b"escaped")
        out.append("connected")
    except BaseException as e:
        out.append("connect refused " + repr(e))
    try:
        os.remove({str(outside / "victim")!r})
        out.append("deleted")
    except BaseException as e:
        out.append("delete refused " + repr(e))
    out.append("sh status " + str(os.system("/bin/sh -c 'touch {outside}/sh-ran-uid$(id -u)'")))
    forked = 0
    for i in range({children}):
        try:
            pid = os.fork()
        except BaseException as e:
            out.append("fork refused " + repr(e))
            break
        if pid == 0:
            os.setsid()
            b.open({str(outside)!r} + "/pid-" + str(os.getpid()), "w").close()
            imp("time").sleep(60)
            b.getattr(os, "_exit")(0)
        forked += 1
    out.append("forked " + str(forked))
    return " | ".join(out)
'''


# --------------------------------------------------------------------------------------------------- plain working
def test_runs_model_code_and_keeps_the_worker():
    with SandboxedFunction(EXTRACTOR, "extract_state") as fn:
        assert fn([["", "-= Kitchen =- a room"], ["go east", "-= Hall =- a hall"]]) == "room: Hall | steps: 2"
        pid = fn._proc.pid
        assert fn([["", "no header"]]) == "room: unknown | steps: 1"
        assert fn._proc.pid == pid  # one worker serves many calls


def test_restricted_python_runs_ordinary_extractor_code():
    """Unpacking loops, item writes, augmented assignment, comprehensions, f-strings, print: RestrictedPython's guards
    let ordinary code through (the values are checked against plain Python)."""
    code = (
        "import re, json\n"
        "def f(history):\n"
        "    seen = {}\n"
        "    n = 0\n"
        "    for action, obs in history:\n"
        "        seen[action] = obs[:3]\n"
        "        n += 1\n"
        "    print('ignored', n)\n"
        "    words = [w.upper() for w in re.findall(r'[a-z]+', ' '.join(seen.values()))]\n"
        "    return json.dumps({'n': f'{n} steps', 'words': words, 'top': max(*[len(w) for w in words])})\n")
    hist = [["look", "hello there"], ["go", "a hall"]]
    ns: dict = {}
    exec(code, ns)
    assert run_sandboxed(code, "f", hist) == ns["f"](hist)


def test_infinite_loop_times_out_and_the_next_call_gets_a_fresh_worker():
    code = "def f(x):\n    if x == 'loop':\n        while True:\n            pass\n    return x.upper()\n"
    with SandboxedFunction(code, "f", timeout_s=0.5) as fn:
        t0 = time.perf_counter()
        with pytest.raises(SandboxError, match="timed out"):
            fn("loop")
        assert time.perf_counter() - t0 < 5
        assert fn("ok") == "OK"


def test_huge_output_is_cut_and_a_memory_bomb_is_stopped():
    out = run_sandboxed("def f(x): return 'x' * 10 ** 7\n", "f", 1, max_output=1000)
    assert out == "x" * 1000
    with pytest.raises(SandboxError):
        run_sandboxed("def f(x): return 'x' * 10 ** 10\n", "f", 1, memory_mb=256)
    # printing a lot does not reach the parent either
    assert run_sandboxed("def f(x):\n    for i in range(10 ** 5):\n        print('y' * 100)\n    return 'ok'\n",
                         "f", 1, timeout_s=5) == "ok"


def test_bad_code_reports_a_one_line_reason():
    with pytest.raises(SandboxError, match="syntax error"):
        SandboxedFunction("def f(:\n", "f")
    with pytest.raises(SandboxError, match="load"):
        run_sandboxed("def g(x): return x\n", "f", 1)  # entry missing
    with pytest.raises(SandboxError, match="ZeroDivisionError"):
        run_sandboxed("def f(x): return 1 / 0\n", "f", 1)


# ------------------------------------------------------------------------------------------- which layers are on
def test_every_layer_is_active_where_the_machine_allows_it():
    """As root with util-linux `unshare` (this machine, CI) every layer must be on, and a worker reports them."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip(f"not root or no unshare here: {LAYERS}")
    assert LAYERS == {n: "on" for n in LAYERS}, LAYERS
    with SandboxedFunction(EXTRACTOR, "extract_state") as fn:
        fn([])
        assert set(fn.layers) == set(LAYERS)


def test_without_namespaces_the_sandbox_degrades_and_says_so(monkeypatch):
    """The plan of a machine with no namespaces and no root: the code still runs (rlimits, session, Python layers) and
    the worker reports exactly the layers it could set up."""
    plan = {"unshare": None, "tmpfs": False, "chroot": False, "uid": None, "off": {}}
    monkeypatch.setattr(sandbox, "_plan", lambda: plan)
    with SandboxedFunction(EXTRACTOR, "extract_state") as fn:
        assert fn([["", "-= Den =-"]]) == "room: Den | steps: 1"
        assert set(fn.layers) == {"rlimits", "no_new_privs", "session", "audit_hook", "restricted_builtins",
                                  "restricted_python"}


# ---------------------------------------------------------------------------------------- the escape of issue 37
def test_the_issue_escape_is_refused_by_the_source_check(outside, listener):
    code = issue_escape(outside, listener.getsockname()[1])
    with pytest.raises(SandboxError, match="f_globals|f_back|gi_frame"):
        check_source(code)
    with pytest.raises(SandboxError):
        SandboxedFunction(code, "extract_state")  # refused before any process starts
    assert_no_effect(outside, listener)


def test_the_issue_escape_with_the_source_checks_skipped_is_stopped_by_the_audit_hook(outside, listener):
    code = issue_escape(outside, listener.getsockname()[1])
    with SandboxedFunction(code, "extract_state", python_layers="runtime", timeout_s=5) as fn:
        with pytest.raises(SandboxError, match=r"object\.__getattr__ is not allowed"):  # gi_frame is audited
            fn([])
    assert_no_effect(outside, listener)


def test_the_issue_escape_cannot_disable_the_audit_hook_from_the_worker_globals(outside):
    """Reach the worker's module globals the way the escape did (here through `print.__globals__`, no frame needed),
    rebind the block list as the escape rebound _BLOCK, then open a file with the worker's own `os`: the hook's list
    is a constant of its own code, so it still refuses."""
    code = (
        "def f(x):\n"
        "    g = print.__globals__\n"
        "    g['BLOCKED_EVENTS'] = ()\n"
        "    g['install_audit_hook'] = None\n"
        f"    fd = g['os'].open({str(outside / 'canary')!r}, 0)\n"
        "    return 'read:' + str(g['os'].read(fd, 100))\n")
    with SandboxedFunction(code, "f", python_layers="runtime", timeout_s=5) as fn:
        with pytest.raises(SandboxError, match=r"sandbox: open is not allowed"):
            fn(1)
    assert_no_effect(outside)


@needs("namespaces", "tmpfs", "chroot", "unprivileged_user", "rlimits")
def test_the_issue_escape_with_every_python_layer_off_is_held_by_the_os(outside, listener):
    """The same effects as plain Python with os/socket/subprocess at hand: read, connect, delete, /bin/sh, 20 setsid()
    children (forks allowed here): nothing reaches the machine, and no child outlives the sandbox."""
    port = listener.getsockname()[1]
    code = (
        "import os, socket, subprocess, time\n"
        "def f(x):\n"
        "    out = []\n"
        "    for name, act in [\n"
        f"            ('read', lambda: open({str(outside / 'canary')!r}).read()),\n"
        f"            ('connect', lambda: socket.socket().connect((b'127.0.0.1', {port}))),\n"  # bytes: no idna codec
        f"            ('delete', lambda: os.remove({str(outside / 'victim')!r})),\n"
        f"            ('sh', lambda: subprocess.run(['/bin/sh', '-c', 'touch {outside}/sh-ran'], timeout=2)),\n"
        f"            ('system', lambda: os.system('touch {outside}/system-ran'))]:\n"
        "        try:\n"
        "            out.append(name + ' done ' + repr(act()))\n"
        "        except BaseException as e:\n"
        "            out.append(name + ' refused ' + type(e).__name__ + ' ' + str(getattr(e, 'errno', '')))\n"
        "    forked = 0\n"
        "    for i in range(20):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            try:\n"
        "                os.setsid()\n"
        "                time.sleep(60)\n"
        "            finally:\n"
        "                os._exit(0)\n"
        "        forked += 1\n"
        "    out.append('forked ' + str(forked) + ' uid ' + str(os.getuid()))\n"
        "    return ' | '.join(out)\n")
    fn = SandboxedFunction(code, "f", python_layers="none", timeout_s=10, nproc=64)
    try:
        out = fn(1)
        ns = pid_namespace(fn)
        time.sleep(0.2)
        assert len(members(ns)) == 21  # the worker and its 20 setsid() children, alive for now
    finally:
        fn.close()
    assert SECRET not in out
    assert "read refused FileNotFoundError 2" in out  # chroot: the path does not exist in the sandbox
    assert "connect refused OSError 101" in out  # ENETUNREACH: the network namespace has no usable interface
    assert "delete refused FileNotFoundError 2" in out and "sh refused FileNotFoundError 2" in out
    assert "forked 20 uid 65534" in out
    assert members(ns) == []  # killing the namespace's init took every setsid() child with it
    assert_no_effect(outside, listener)


# ---------------------------------------------------------------- every other escape: three layers, each must hold
# name -> hostile code (entry `f`); each tries to leave a trace in `outside` or read the canary.
def hostile_sources(outside: Path) -> dict[str, str]:
    canary, victim = str(outside / "canary"), str(outside / "victim")
    return {
        "coroutine frames": (
            "async def co():\n"
            "    return 1\n"
            "def f(x):\n"
            "    c = co()\n"
            "    g = c.cr_frame.f_back.f_globals\n"
            f"    return g['open']({canary!r}).read()\n"),
        "traceback frames": (
            "def f(x):\n"
            "    try:\n"
            "        1 / 0\n"
            "    except ZeroDivisionError as e:\n"
            "        g = e.__traceback__.tb_frame.f_back.f_globals\n"
            f"    return g['open']({canary!r}).read()\n"),
        "__subclasses__ walk": (
            "def f(x):\n"
            "    for c in ().__class__.__base__.__subclasses__():\n"
            "        if c.__name__ == '_wrap_close':\n"
            f"            c.__init__.__globals__['system']('touch {outside}/pwned')\n"
            f"            return c.__init__.__globals__['remove']({victim!r})\n"
            "    return 'no os'\n"),
        "ctypes": (
            "import ctypes\n"
            "def f(x):\n"
            "    libc = ctypes.CDLL(None)\n"
            f"    return libc.unlink({victim.encode()!r})\n"),
        "/proc/self/mem": (
            "def f(x):\n"
            "    m = open('/proc/self/mem', 'r+b')\n"
            "    return 'opened'\n"),
        "fork bomb": (
            "import os\n"
            "def f(x):\n"
            "    while True:\n"
            "        os.fork()\n"),
        "write outside": (
            "def f(x):\n"
            f"    open({str(outside / 'written')!r}, 'w').write('x')\n"
            "    return 'written'\n"),
        "read outside": f"def f(x):\n    return open({canary!r}).read()\n",
    }


CASES = list(hostile_sources(Path("/x")))


@pytest.mark.parametrize("case", CASES)
def test_each_escape_is_refused_before_running(case, outside):
    code = hostile_sources(outside)[case]
    with pytest.raises(SandboxError):
        check_source(code)
    with pytest.raises(SandboxError):
        SandboxedFunction(code, "f")
    assert_no_effect(outside)


@pytest.mark.parametrize("case", CASES)
def test_each_escape_with_the_source_checks_skipped_is_stopped_at_run_time(case, outside):
    """Restricted builtins (no open), the guarded import (no os, ctypes) and the audit hook (frames, os.system)."""
    code = hostile_sources(outside)[case]
    with SandboxedFunction(code, "f", python_layers="runtime", timeout_s=5) as fn:
        with pytest.raises(SandboxError, match="not allowed|not defined|NotImplementedError|AttributeError"):
            fn(1)
    assert_no_effect(outside)


@needs("namespaces", "tmpfs", "chroot", "unprivileged_user", "rlimits", "no_new_privs")
def test_os_layers_alone_hold_files_proc_ctypes_and_privileges(outside, listener):
    """Plain Python with ctypes: libc open/unlink/socket/connect, /proc/self/mem, mounting /proc, becoming root again,
    writing outside: all fail; the worker sees an empty root."""
    port = listener.getsockname()[1]
    code = (
        "import ctypes, json, os, socket, struct\n"
        "def f(x):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    r = {}\n"
        "    r['root'] = os.listdir('/')\n"
        f"    r['libc_open'] = libc.open({str(outside / 'canary').encode()!r}, 0)\n"
        f"    r['libc_unlink'] = libc.unlink({str(outside / 'victim').encode()!r})\n"
        f"    r['libc_creat'] = libc.creat({str(outside / 'created').encode()!r}, 0o644)\n"
        "    fd = libc.socket(2, 1, 0)\n"
        f"    addr = struct.pack('<HH4s8x', 2, socket.htons({port}), bytes([127, 0, 0, 1]))\n"
        "    r['libc_connect'] = libc.connect(fd, addr, len(addr))\n"
        "    r['connect_errno'] = ctypes.get_errno()\n"
        "    for k, act in [('proc_mem', lambda: open('/proc/self/mem', 'r+b')),\n"
        "                   ('mkdir_proc', lambda: os.mkdir('/proc')),\n"
        "                   ('mount_proc', lambda: libc.mount(b'proc', b'/proc', b'proc', 0, None)),\n"
        "                   ('setuid0', lambda: os.setuid(0)),\n"
        f"                   ('write_outside', lambda: open({str(outside / 'written')!r}, 'w').write('x'))]:\n"
        "        try:\n"
        "            r[k] = repr(act())\n"
        "        except BaseException as e:\n"
        "            r[k] = type(e).__name__\n"
        "    r['uid'] = os.getuid()\n"
        "    return json.dumps(r)\n")
    out = json.loads(run_sandboxed(code, "f", 1, python_layers="none", timeout_s=10))
    assert out["root"] == []  # an empty tmpfs
    assert out["libc_open"] == out["libc_unlink"] == out["libc_creat"] == out["libc_connect"] == -1
    assert out["connect_errno"] == 101  # ENETUNREACH
    assert out["proc_mem"] == "FileNotFoundError"  # no /proc inside the chroot
    assert out["mount_proc"] == "-1"  # nobody cannot mount
    assert out["setuid0"] == "PermissionError" and out["uid"] == 65534
    assert out["write_outside"] == "FileNotFoundError"
    assert_no_effect(outside, listener)


@needs("namespaces", "unprivileged_user", "rlimits")
def test_fork_bomb_is_bounded_and_leaves_nothing_behind():
    bomb = (
        "import os, time\n"
        "def f(x):\n"
        "    n = 0\n"
        "    while True:\n"
        "        try:\n"
        "            pid = os.fork()\n"
        "        except OSError as e:\n"
        "            if x != 'once':\n"
        "                time.sleep(0.5)  # the children keep forking meanwhile\n"
        "            return 'refused ' + type(e).__name__ + ' after ' + str(n)\n"
        "        if pid == 0:\n"
        "            try:\n"
        "                while True:\n"
        "                    try:\n"
        "                        os.fork()\n"
        "                    except OSError:\n"
        "                        time.sleep(0.01)\n"
        "            finally:\n"
        "                os._exit(0)\n"
        "        n += 1\n")
    # default nproc = 0: the first fork already fails
    assert run_sandboxed(bomb, "f", "once", python_layers="none", timeout_s=5) == "refused BlockingIOError after 0"
    # with room for 8 processes of user nobody, the bomb stays at 8 at most and dies with the sandbox
    fn = SandboxedFunction(bomb, "f", python_layers="none", timeout_s=20, nproc=8)
    try:
        assert fn("spin").startswith("refused")
        ns = pid_namespace(fn)
        assert 1 <= len(members(ns)) <= 8
    finally:
        fn.close()
    assert members(ns) == []


@needs("namespaces", "tmpfs")
def test_the_working_folder_is_the_only_writable_place_and_it_is_bounded():
    code = (
        "def f(x):\n"
        "    open('small', 'w').write('ok')\n"
        "    r = [open('small').read()]\n"
        "    try:\n"
        "        open('big', 'w').write('x' * (2 << 20))\n"
        "        r.append('big written')\n"
        "    except OSError as e:\n"
        "        r.append(type(e).__name__ + ' ' + str(e.errno))\n"
        "    n = 0\n"
        "    try:\n"
        "        for i in range(1000):\n"
        "            open('f' + str(i), 'w').close()\n"
        "            n += 1\n"
        "    except OSError as e:\n"
        "        r.append('files ' + str(n))\n"
        "    return ' | '.join(r)\n")
    out = run_sandboxed(code, "f", 1, python_layers="none", disk_kb=1024)
    small, big, files = out.split(" | ")
    assert small == "ok"
    assert big in ("OSError 27", "OSError 28")  # EFBIG (RLIMIT_FSIZE) or ENOSPC (tmpfs size)
    assert files.startswith("files ") and int(files.split()[1]) < 64  # tmpfs inode limit


@needs("namespaces")
def test_a_timed_out_worker_leaves_no_process():
    code = "def f(x):\n    while x:\n        pass\n    return 'ok'\n"
    fn = SandboxedFunction(code, "f", timeout_s=0.5)
    assert fn(0) == "ok"
    ns = pid_namespace(fn)
    with pytest.raises(SandboxError, match="timed out"):
        fn(1)
    assert fn._proc is None and members(ns) == []  # killed and reaped by the time the error is raised


# ---------------------------------------------------------------------------------------- the source check itself
@pytest.mark.parametrize("code", [
    "import os\ndef f(x): return os.listdir('/')\n",
    "import socket\ndef f(x): return 1\n",
    "from subprocess import run\ndef f(x): return 1\n",
    "def f(x): return ().__class__.__base__.__subclasses__()\n",
    "def f(x): return __import__('os')\n",
    "def f(x):\n    s = '{0.' + '_' + '_class_' + '_}'\n    return s.format(x)\n",
    "def f(x): return '__globals__'\n",
    "def f(x):\n    def g():\n        yield 1\n    return g().gi_frame\n",
    "def f(x):\n    return eval('1')\n",
])
def test_imports_dunders_frames_and_format_escapes_are_rejected_before_running(code):
    with pytest.raises(SandboxError):
        check_source(code)
    with pytest.raises(SandboxError):
        SandboxedFunction(code, "f")  # refused before any process starts


def test_dangerous_builtins_are_missing():
    """With the source checks skipped, the names are simply not there (RestrictedPython already refuses most of them
    by name, see the test above)."""
    names = ("getattr", "setattr", "eval", "exec", "open", "compile", "globals", "vars", "input", "breakpoint", "type")
    body = "".join(f"    try:\n        {n}\n    except NameError:\n        missing.append({n!r})\n" for n in names)
    out = run_sandboxed("def f(x):\n    missing = []\n" + body + "    return ','.join(missing)\n", "f", 1,
                        python_layers="runtime")
    assert out.split(",") == list(names)
