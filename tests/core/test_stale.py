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
    text = "# T\n## Speed\n| a |\n|---|\nMeasured at commit abc1234 with: `python benchmarks/x.py`\n| b |\n"
    tables = stale.card_tables(text, "x.md")
    assert [(t.line, t.title, t.commit, t.command) for t in tables] == [
        (3, "Speed", "abc1234", "python benchmarks/x.py"), (6, "Speed", None, None)]


def test_a_table_is_stale_only_when_its_code_changed(tmp_path, monkeypatch):
    _repo(tmp_path)
    monkeypatch.setattr(stale, "ROOT", tmp_path)
    sha = _git(tmp_path, "rev-parse", "--short", "HEAD")
    card = _card(tmp_path, sha)
    # the package, core modules reached through core's own imports, and the benchmark the command names
    assert stale.code_paths("toy", "python benchmarks/toy.py --seeds 3") == [
        "benchmarks/toy.py", "lit_iclr/core/numbers.py", "lit_iclr/core/stats.py", "lit_iclr/toy"]
    assert "0 stale, 1 current, 1 unrecorded" in stale.report([card])[0]

    (tmp_path / "lit_iclr/core/figures.py").write_text("y = 3\n")  # imported only by another method
    _git(tmp_path, "commit", "-qam", "unrelated")
    assert "0 stale" in stale.report([card])[0]

    (tmp_path / "lit_iclr/core/numbers.py").write_text("x = 2\n")  # reached through core/stats.py
    _git(tmp_path, "commit", "-qam", "related")
    lines = stale.report([card])
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
    assert "0 stale, 1 current, 0 unrecorded, 1 not measurements" in stale.report([card])[0]
