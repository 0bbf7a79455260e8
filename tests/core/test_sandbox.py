"""Model-written code in the sandbox: results come back; hostile code is stopped (loops, files, imports, output, escapes)."""
from __future__ import annotations

import time

import pytest

from lit_iclr.core.sandbox import SandboxedFunction, SandboxError, check_source, run_sandboxed

EXTRACTOR = '''
import re

def extract_state(history):
    rooms = re.findall(r"-= (.+?) =-", " ".join(o for a, o in history))
    return "room: " + (rooms[-1] if rooms else "unknown") + " | steps: " + str(len(history))
'''


def test_runs_model_code_and_keeps_the_worker():
    with SandboxedFunction(EXTRACTOR, "extract_state") as fn:
        assert fn([["", "-= Kitchen =- a room"], ["go east", "-= Hall =- a hall"]]) == "room: Hall | steps: 2"
        pid = fn._proc.pid
        assert fn([["", "no header"]]) == "room: unknown | steps: 1"
        assert fn._proc.pid == pid  # one worker serves many calls


def test_infinite_loop_times_out_and_the_next_call_gets_a_fresh_worker():
    code = "def f(x):\n    if x == 'loop':\n        while True:\n            pass\n    return x.upper()\n"
    with SandboxedFunction(code, "f", timeout_s=0.5) as fn:
        t0 = time.perf_counter()
        with pytest.raises(SandboxError, match="timed out"):
            fn("loop")
        assert time.perf_counter() - t0 < 5
        assert fn("ok") == "OK"


def test_file_write_is_refused_and_leaves_no_file(tmp_path):
    target = tmp_path / "pwned.txt"
    with pytest.raises(SandboxError, match="open"):
        run_sandboxed(f"def f(x):\n    open({str(target)!r}, 'w').write('x')\n    return 'done'\n", "f", 1)
    assert not target.exists()


@pytest.mark.parametrize("code", [
    "import os\ndef f(x): return os.listdir('/')\n",
    "import socket\ndef f(x): return 1\n",
    "from subprocess import run\ndef f(x): return 1\n",
    "def f(x): return ().__class__.__base__.__subclasses__()\n",
    "def f(x): return __import__('os')\n",
    "def f(x):\n    s = '{0.' + '_' + '_class_' + '_}'\n    return s.format(x)\n",
    "def f(x): return '__globals__'\n",
])
def test_imports_dunders_and_format_escapes_are_rejected_before_running(code):
    with pytest.raises(SandboxError):
        check_source(code)
    with pytest.raises(SandboxError):
        SandboxedFunction(code, "f")  # refused before any process starts


def test_import_os_never_runs():
    with pytest.raises(SandboxError, match="not allowed"):
        run_sandboxed("import os\ndef f(x): return os.listdir('/')\n", "f", 1)


def test_dangerous_builtins_are_missing():
    names = ("getattr", "setattr", "eval", "exec", "open", "compile", "globals", "vars", "input", "breakpoint", "type")
    body = "".join(f"    try:\n        {n}\n    except NameError:\n        missing.append({n!r})\n" for n in names)
    out = run_sandboxed("def f(x):\n    missing = []\n" + body + "    return ','.join(missing)\n", "f", 1)
    assert out.split(",") == list(names)


def test_huge_output_is_cut_and_a_memory_bomb_is_stopped():
    out = run_sandboxed("def f(x): return 'x' * 10 ** 7\n", "f", 1, max_output=1000)
    assert out == "x" * 1000
    with pytest.raises(SandboxError):
        run_sandboxed("def f(x): return 'x' * 10 ** 10\n", "f", 1, memory_mb=256)
    # printing a lot does not reach the parent either
    assert run_sandboxed("def f(x):\n    for i in range(10 ** 5):\n        print('y' * 100)\n    return 'ok'\n",
                         "f", 1, timeout_s=5) == "ok"


def test_audit_hook_blocks_escapes_that_slip_past_the_source_check(tmp_path):
    """Defence in depth: skip the source check and walk to os.system through object subclasses; the child's audit
    hook refuses the call, so no file appears."""
    target = tmp_path / "escaped"
    code = (
        "def f(x):\n"
        "    for c in ().__class__.__base__.__subclasses__():\n"
        "        if c.__name__ == '_wrap_close':\n"
        f"            c.__init__.__globals__['system']('touch {target}')\n"
        "            return 'called'\n"
        "    return 'no os'\n")
    fn = SandboxedFunction.__new__(SandboxedFunction)  # bypass __init__'s check_source on purpose
    fn.code, fn.entry, fn.timeout_s, fn.max_output, fn.memory_mb, fn.cpu_s = code, "f", 2.0, 100, 512, 10
    fn._proc = fn._workdir = None
    try:
        result = fn(1)
        assert result == "no os"  # os not even loaded in the child
    except SandboxError as e:
        assert "os.system" in str(e)
    finally:
        fn.close()
    assert not target.exists()


def test_bad_code_reports_a_one_line_reason():
    with pytest.raises(SandboxError, match="syntax error"):
        SandboxedFunction("def f(:\n", "f")
    with pytest.raises(SandboxError, match="load"):
        run_sandboxed("def g(x): return x\n", "f", 1)  # entry missing
    with pytest.raises(SandboxError, match="ZeroDivisionError"):
        run_sandboxed("def f(x): return 1 / 0\n", "f", 1)
