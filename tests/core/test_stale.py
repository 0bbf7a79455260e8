"""benchmarks/stale.py lists a card table exactly when the code it measured changed after its recorded commit."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import stale  # noqa: E402


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _repo(root: Path) -> None:
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.org")
    _git(root, "config", "user.name", "t")
    for rel, text in {
        "lit_iclr/__init__.py": "", "lit_iclr/core/__init__.py": "",
        "lit_iclr/core/stats.py": "from .numbers import x\n", "lit_iclr/core/numbers.py": "x = 1\n",
        "lit_iclr/core/figures.py": "y = 2\n",
        "lit_iclr/toy/__init__.py": "from ..core.stats import x\n", "benchmarks/toy.py": "print(1)\n",
        "lit_iclr/other/__init__.py": "from lit_iclr.core.figures import y\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "code")


def _card(root: Path, sha: str) -> Path:
    card = root / "seeds" / "toy.md"
    card.parent.mkdir(exist_ok=True)
    card.write_text(f"# Toy\n## Headline\n| a | b |\n|---|---|\n| 1 | 2 |\n\nMeasured at commit {sha} with: "
                    "`python benchmarks/toy.py --seeds 3`\n\n## Config\n| k | v |\n|---|---|\n")
    return card


def test_tables_and_their_measured_line_are_parsed():
    text = ("# T\n## Speed\n| a |\n|---|\nMeasured at commit abc1234 with: `python benchmarks/x.py`\n| b |\n|:--|\n\n"
            "Measured at commit abc1235 with: `python benchmarks/y.py --seeds 0` (seeds 1, 2 likewise) and `python "
            "benchmarks/z.py`\n```\n# not a heading\n| not | a table |\n|---|---|\n```\nA paragraph line:\n"
            "|diff| 1e-7 after one step\n")
    tables = stale.card_tables(text, "x.md")
    assert [(t.line, t.title, t.commit, t.command) for t in tables] == [
        (3, "Speed", "abc1234", "python benchmarks/x.py"), (6, "Speed", "abc1235", "python benchmarks/y.py --seeds 0")]
    assert tables[1].commands == "python benchmarks/y.py --seeds 0 ; python benchmarks/z.py"


def test_a_table_is_stale_only_when_its_code_changed(tmp_path, monkeypatch):
    _repo(tmp_path)
    monkeypatch.setattr(stale, "ROOT", tmp_path)
    sha = _git(tmp_path, "rev-parse", "--short", "HEAD")
    card = _card(tmp_path, sha)
    # the package, core modules reached through core's own imports, and the benchmark the command names
    assert stale.code_paths("toy", "python benchmarks/toy.py --seeds 3") == [
        "benchmarks/toy.py", "lit_iclr/core/numbers.py", "lit_iclr/core/stats.py", "lit_iclr/toy"]
    assert "0 stale, 1 current, 1 unrecorded" in stale.report([card], rule="file")[0]

    (tmp_path / "lit_iclr/core/figures.py").write_text("y = 3\n")  # imported only by another method
    _git(tmp_path, "commit", "-qam", "unrelated")
    assert "0 stale" in stale.report([card], rule="file")[0]

    (tmp_path / "lit_iclr/core/numbers.py").write_text("x = 2\n")  # reached through core/stats.py
    _git(tmp_path, "commit", "-qam", "related")
    lines = stale.report([card], rule="file")
    assert "1 stale, 0 current" in lines[0]
    assert any("seeds/toy.md:3 (Headline)" in line and "lit_iclr/core/numbers.py" in line
               and "`python benchmarks/toy.py --seeds 3`" in line for line in lines)


def test_an_unknown_commit_is_reported_not_raised(tmp_path, monkeypatch):
    _repo(tmp_path)
    monkeypatch.setattr(stale, "ROOT", tmp_path)
    lines = stale.report([_card(tmp_path, "deadbee")])
    assert any("deadbee is not in this history" in line for line in lines)


def test_a_table_marked_not_measured_is_counted_apart_and_never_unrecorded(tmp_path, monkeypatch):
    _repo(tmp_path)
    monkeypatch.setattr(stale, "ROOT", tmp_path)
    card = _card(tmp_path, _git(tmp_path, "rev-parse", "--short", "HEAD"))
    card.write_text(card.read_text() + "| 3 | 4 |\n\n<!-- not measured -->\n")
    tables = stale.card_tables(card.read_text(), "toy.md")
    assert [t.measured for t in tables] == [True, False]
    assert "0 stale, 1 current, 0 unrecorded, 0 history, 1 not measurements" in stale.report([card])[0]


# --- the symbol rule: a fake package whose benchmark reaches core/ops.used (which calls helper and reads SCALE) ------
OPS = '''"""Two functions a method may use."""
SCALE = 2


def helper(x):
    return x + 1


def used(x):
    """Doubles."""
    return helper(x) * SCALE


def unused(x):
    return x - 1
'''


def _symbol_repo(root: Path) -> Path:
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.org")
    _git(root, "config", "user.name", "t")
    for rel, text in {
        "lit_iclr/__init__.py": "", "lit_iclr/core/__init__.py": "", "lit_iclr/core/ops.py": OPS,
        "lit_iclr/toy/__init__.py": "",
        # `from pkg import module`, then `module.attr`
        "lit_iclr/toy/method.py": "from lit_iclr.core import ops\n\n\ndef run(x):\n    return ops.used(x)\n",
        "benchmarks/toy.py": "from lit_iclr.toy.method import run\n\nif __name__ == '__main__':\n    print(run(1))\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "code")
    return root / "lit_iclr/core/ops.py"


def _measured_now(root: Path) -> Path:
    """The card's table, measured at the current HEAD."""
    return _card(root, _git(root, "rev-parse", "--short", "HEAD"))


def _edit(root: Path, path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    _git(root, "commit", "-qam", f"edit {old!r}")


def _stale(root: Path, card: Path, rule: str = "symbol") -> list[str]:
    return [line for line in stale.report([card], root=root, rule=rule) if line.startswith("- seeds/toy.md:3")]


def test_symbol_rule_follows_the_definitions_the_benchmark_reaches(tmp_path):
    ops = _symbol_repo(tmp_path)
    card = _measured_now(tmp_path)
    assert _stale(tmp_path, card) == []

    _edit(tmp_path, ops, "return x - 1", "return x - 2")  # a function nothing reaches
    assert _stale(tmp_path, card) == []
    card = _measured_now(tmp_path)

    _edit(tmp_path, ops, "return helper(x) * SCALE", "return helper(x) * SCALE + 0")  # the function the method calls
    [line] = _stale(tmp_path, card)
    assert "lit_iclr/core/ops.py:used" in line and "ops.py:helper" not in line and "unused" not in line
    card = _measured_now(tmp_path)

    _edit(tmp_path, ops, "return x + 1", "return x + 3")  # a function the used one calls
    [line] = _stale(tmp_path, card)
    assert "lit_iclr/core/ops.py:helper" in line and "ops.py:used" not in line
    card = _measured_now(tmp_path)

    _edit(tmp_path, ops, "SCALE = 2", "SCALE = 3")  # a module-level constant it reads
    [line] = _stale(tmp_path, card)
    assert "lit_iclr/core/ops.py:SCALE" in line
    card = _measured_now(tmp_path)

    _edit(tmp_path, ops, '"""Doubles."""', '"""Doubles its argument, after adding one."""')  # a docstring only
    assert _stale(tmp_path, card) == []


def test_the_file_rule_lists_an_edit_to_an_unused_function_the_symbol_rule_does_not(tmp_path):
    ops = _symbol_repo(tmp_path)
    card = _measured_now(tmp_path)
    _edit(tmp_path, ops, "return x - 1", "return x - 2")
    [line] = _stale(tmp_path, card, rule="file")
    assert "lit_iclr/core/ops.py" in line
    assert _stale(tmp_path, card) == []


def test_module_level_code_and_a_rebound_import_count_as_changes(tmp_path):
    ops = _symbol_repo(tmp_path)
    card = _measured_now(tmp_path)
    _edit(tmp_path, ops, "SCALE = 2\n", "SCALE = 2\nprint('imported')\n")  # runs on import: the whole module
    [line] = _stale(tmp_path, card)
    assert "lit_iclr/core/ops.py (module-level code)" in line

    # `ops` now names another module whose `used` existed already: run()'s text is the same, its meaning is not
    (tmp_path / "lit_iclr/core/ops2.py").write_text("def used(x):\n    return 0\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "ops2")
    card = _measured_now(tmp_path)
    assert _stale(tmp_path, card) == []
    _edit(tmp_path, tmp_path / "lit_iclr/toy/method.py", "from lit_iclr.core import ops\n",
          "from lit_iclr.core import ops2 as ops\n")
    [line] = _stale(tmp_path, card)
    assert "lit_iclr/toy/method.py:run" in line


def test_a_history_table_is_counted_apart_and_never_listed(tmp_path):
    ops = _symbol_repo(tmp_path)
    card = _measured_now(tmp_path)
    _edit(tmp_path, ops, "return x + 1", "return x + 3")
    assert len(_stale(tmp_path, card)) == 1
    card.write_text(card.read_text().replace(" with: ", " (history) with: "))
    assert [t.history for t in stale.card_tables(card.read_text(), "toy.md")] == [True, False]
    lines = stale.report([card], root=tmp_path)
    assert "0 stale, 0 current, 1 unrecorded, 1 history" in lines[0]
    assert _stale(tmp_path, card) == [] and any(line.startswith("History tables") and "toy.md 1" in line
                                                for line in lines)
