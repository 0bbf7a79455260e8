"""Which measured tables in the method cards may no longer describe the code.

Every measured table in `seeds/<method>.md` carries one line directly under it:

    Measured at commit <sha> with: `<command>`

A table is listed as stale when code it measured changed since that commit. Two rules:

- `--rule symbol` (the default; benchmarks/stale_symbols.py has the details): the roots are every definition of the
  Python files the command names (a benchmark script, `cli.py`, a test file with the `conftest.py` files above it), and,
  for a command that runs the CLI (it names `cli.py`, or its script imports `lit_iclr.cli` or runs `"cli.py"`) or that
  names no script, every definition of the method's package `lit_iclr/<method>/`. Everything the roots reference,
  followed across `lit_iclr` definition by definition, is compared between the commit and HEAD (AST without
  docstrings, plus what each name resolves to). Config files the command (or its script) names are compared file by
  file, and the `lit_iclr.*` classes they name are roots too. The list names the changed definitions.
- `--rule file`: the older file-level rule: anything changed in the method's package, the `lit_iclr/core/` modules it
  imports (followed through core's own imports), or the files its command names.

Tables without the line are counted per card, since nothing can tell whether they are still true. A table that is not
a measurement (a map from the paper's symbols to the code, a list of options) carries `<!-- not measured -->` in that
place instead, and is only counted. A table that records earlier code on purpose (under a heading such as "Earlier
measurements (before this revision)") says so in its line, which is then never checked, only counted apart:

    Measured at commit <sha> (history) with: `<command>`

The list is printed, never a failure (CI prints it after the tests).

    .venv/bin/python benchmarks/stale.py                # markdown list of stale tables, then the unrecorded counts
    .venv/bin/python benchmarks/stale.py --card vgf     # one card
    .venv/bin/python benchmarks/stale.py --rule file    # the file-level rule
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import stale_symbols

ROOT = Path(__file__).resolve().parent.parent
# the first backticked command is the one printed; any text may follow it (`... (rows 0-2) and `...``), and every
# backticked part of the line is searched for the files the table's code lives in
MEASURED = re.compile(r"^Measured at commit `?([0-9a-f]{7,40})`?( \(history\))? with: `([^`]+)`.*$")
COMMAND = re.compile(r"`([^`]+)`")
DELIMITER = re.compile(r"^\|?(\s*:?-+:?\s*\|)+\s*(:?-+:?\s*)?$")
NOT_MEASURED = "<!-- not measured -->"
PATH_IN_COMMAND = re.compile(r"(?:^|\s|=)((?:benchmarks|configs|lit_iclr|scripts|data)/[\w./-]+)")
PATH_IN_SYMBOL_COMMAND = re.compile(r"(?:^|[\s=\"'])((?:benchmarks|configs|lit_iclr|scripts|data|tests)/[\w./-]*|cli\.py)")
CONFIG_IN_TEXT = re.compile(r"configs/[\w./-]+\.ya?ml")
CLASS_IN_CONFIG = re.compile(r"\blit_iclr(?:\.\w+)+")


@dataclass
class Table:
    card: str
    line: int          # 1-based line of the table's header row
    title: str         # the nearest heading above it
    commit: str | None
    command: str | None
    measured: bool = True  # False: marked `<!-- not measured -->` (a mapping or options table)
    history: bool = False  # True: a record of earlier code (`Measured at commit <sha> (history) with: ...`)
    commands: str = ""     # every backticked part of the measured-at line, for the files they name


def card_tables(text: str, card: str) -> list[Table]:
    """Each markdown table (a run of lines starting with `|` that has a `|---|` delimiter row; code blocks skipped), its
    heading, and the measured-at line right under it (at most one blank line between)."""
    lines = text.splitlines()
    tables, heading, i, fenced = [], "", 0, False
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and lines[i].startswith("#"):
            heading = lines[i].lstrip("#").strip()
        elif not fenced and lines[i].startswith("|"):
            start = i
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            if not any(DELIMITER.match(line) for line in lines[start:i]):
                continue  # a line that merely starts with `|` (e.g. `|diff| ...` in a paragraph)
            j = i
            while j < len(lines) and not lines[j].strip():
                j += 1
                if j - i > 1:
                    break
            below = lines[j].strip() if j < len(lines) else ""
            m = MEASURED.match(below)
            commands = COMMAND.findall(below[m.start(3) - 1:]) if m else []
            tables.append(Table(card, start + 1, heading, m.group(1) if m else None, m.group(3) if m else None,
                                measured=below != NOT_MEASURED, history=bool(m and m.group(2)),
                                commands=" ; ".join(commands)))
            continue
        i += 1
    return tables


def _imports(path: Path, root: Path) -> set[str]:
    """`lit_iclr.core.<x>` modules imported by one file (absolute or relative imports)."""
    try:
        tree = ast.parse(path.read_text())
    except (SyntaxError, UnicodeDecodeError):
        return set()
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found |= {n for n in names if n.startswith("lit_iclr.core.")}
    return found


def _module_file(name: str, root: Path) -> Path | None:
    rel = Path(*name.split("."))
    for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def code_paths(method: str, command: str | None, root: Path | None = None) -> list[str]:
    """The method package, the core modules it reaches, and the files the command names (repo-relative)."""
    ROOT = root or globals()["ROOT"]  # noqa: N806
    paths: set[str] = set()
    todo = []
    package = ROOT / "lit_iclr" / method
    if package.is_dir():
        paths.add(f"lit_iclr/{method}")
        todo += sorted(package.rglob("*.py"))
    for p in PATH_IN_COMMAND.findall(command or ""):
        if (ROOT / p).exists():
            paths.add(p)
            if p.endswith(".py"):
                todo.append(ROOT / p)
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for name in _imports(f, ROOT):
            target = _module_file(name, ROOT)
            if target is not None and target not in seen:
                paths.add(str(target.relative_to(ROOT)))
                todo.append(target)
    return sorted(paths)


def changed_since(commit: str, paths: list[str], root: Path | None = None) -> list[str] | None:
    """Files under `paths` changed between `commit` and HEAD; None when the commit is unknown here (e.g. a shallow clone)."""
    root = root or ROOT
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root, capture_output=True)
    if known.returncode != 0:
        return None
    out = subprocess.run(["git", "diff", "--name-only", commit, "HEAD", "--", *paths], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


class SymbolRule:
    """`--rule symbol`: the definitions a table's command reaches, compared between its commit and HEAD."""

    def __init__(self, root: Path):
        self.git = stale_symbols.Git(root)
        self.head = stale_symbols.Snapshot(self.git, "HEAD")
        self._old: dict[str, stale_symbols.Snapshot] = {}
        self._reached: dict[tuple[str, str], tuple[set, list[str]]] = {}

    def _packages(self, method: str, command: str) -> set:
        """The definitions of the method packages a CLI run may build: the card's own, and any method the command
        names (`-k "vgf or heapr"`); for a card without a package that names none (the platform card), all of them."""
        methods = {p.split("/")[1] for p in self.head.tree if p.startswith("lit_iclr/") and p.count("/") >= 2} - {"core"}
        named = {m for m in methods if m == method or re.search(rf"\b{m}\b", command)} or methods
        return {n for f in self.head.tree if f.endswith(".py") and f.count("/") >= 2 and f.split("/")[0] == "lit_iclr"
                and f.split("/")[1] in named for n in self.head.nodes(f)}

    def _configs_roots(self, configs: list[str]) -> set:
        roots = set()
        for c in configs:
            text = self.git.blob(self.head.tree[c])
            for name in set(CLASS_IN_CONFIG.findall(text)):
                roots |= self.head.resolve(None, ("absolute", name))
        return roots

    def reached(self, method: str, command: str) -> tuple[set, list[str]]:
        """The nodes a command reaches at HEAD and the non-Python files it names (compared as files)."""
        key = (method, command)
        if key in self._reached:
            return self._reached[key]
        head, roots, files, scripts = self.head, set(), set(), False
        runs_cli = "lit_iclr.cli" in command
        for named in PATH_IN_SYMBOL_COMMAND.findall(command):
            named = named.rstrip("/")
            for f in head.tree:
                if f != named and not f.startswith(named + "/"):
                    continue
                if not f.endswith(".py"):
                    files.add(f)
                    continue
                scripts = True
                roots |= head.nodes(f)
                parts = Path(f).parts
                for i in range(1, len(parts)):  # pytest loads the conftest.py files above a test file
                    conftest = "/".join([*parts[:i], "conftest.py"])
                    if parts[0] == "tests" and conftest in head.tree:
                        roots |= head.nodes(conftest)
                text = self.git.blob(head.tree[f])
                runs_cli |= '"cli.py"' in text or f == "cli.py"
                files |= {c for c in CONFIG_IN_TEXT.findall(text) if c in head.tree}
        package = self._packages(method, command)
        if runs_cli or not scripts:
            roots |= package
        if not roots and not files:
            roots = {n for f in head.tree if f.startswith("lit_iclr/") and f.endswith(".py") for n in head.nodes(f)}
        roots |= self._configs_roots(sorted(files))

        def on_reach(node):  # a script that builds the CLI runs the method from its config
            return package if node[0] == "lit_iclr/cli.py" else ()

        self._reached[key] = (head.reach(roots, on_reach), sorted(files))
        return self._reached[key]

    def changed(self, method: str, commit: str, command: str) -> list[str] | None:
        if commit not in self._old:
            self._old[commit] = stale_symbols.Snapshot(self.git, commit) if self.git.known(commit) else None
        old = self._old[commit]
        if old is None:
            return None
        nodes, files = self.reached(method, command)
        found = sorted(stale_symbols.changed(old, self.head, nodes), key=lambda n: (n[0].startswith("lit_iclr/core/"), n))
        out = [f"{p} (module-level code)" if s == stale_symbols.MODULE else f"{p}:{s}" for p, s in found]
        return out + [f"{f} (file)" for f in files if old.tree.get(f) != self.head.tree.get(f)]


def report(cards: list[Path], root: Path | None = None, rule: str = "symbol") -> list[str]:
    root = root or ROOT
    symbols = SymbolRule(root) if rule == "symbol" else None
    stale, unknown, unrecorded, history, fresh, descriptive = [], [], {}, {}, 0, 0
    for card in cards:
        method = card.stem
        for t in card_tables(card.read_text(), card.name):
            if not t.measured:
                descriptive += 1
                continue
            if t.history:
                history[card.name] = history.get(card.name, 0) + 1
                continue
            if t.commit is None:
                unrecorded[card.name] = unrecorded.get(card.name, 0) + 1
                continue
            if symbols is not None:
                changed = symbols.changed(method, t.commit, t.commands or t.command)
            else:
                changed = changed_since(t.commit, code_paths(method, t.commands or t.command, root), root)
            where = f"seeds/{t.card}:{t.line} ({t.title or 'no heading'})"
            if changed is None:
                unknown.append(f"- {where}: commit {t.commit} is not in this history")
            elif changed:
                shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
                stale.append(f"- {where}: measured at {t.commit}; changed since: {shown}. Rerun: `{t.command}`")
            else:
                fresh += 1
    if symbols is not None:
        symbols.git.close()
    lines = [f"## Stale card tables ({len(stale)} stale, {fresh} current, {sum(unrecorded.values())} unrecorded, "
             f"{sum(history.values())} history, {descriptive} not measurements; rule: {rule})", ""]
    lines += stale or ["- none: every recorded table's code is unchanged since it was measured"]
    lines += unknown
    if unrecorded:
        lines += ["", "Tables with no `Measured at commit ... with: ...` line (cannot be checked): " +
                  ", ".join(f"{k} {v}" for k, v in sorted(unrecorded.items()))]
    if history:
        lines += ["", "History tables (records of earlier code, marked `(history)`, not checked): " +
                  ", ".join(f"{k} {v}" for k, v in sorted(history.items()))]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--card", action="append", help="method name (seeds/<name>.md); default: every card")
    ap.add_argument("--rule", choices=("symbol", "file"), default="symbol",
                    help="symbol: the definitions the command reaches (default); file: whole files, the older rule")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this checkout)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    cards = [root / "seeds" / f"{c}.md" for c in args.card] if args.card else sorted((root / "seeds").glob("*.md"))
    missing = [str(c) for c in cards if not c.exists()]
    if missing:
        print(f"no such card: {', '.join(missing)} (cards are seeds/<method>.md)", file=sys.stderr)
        return 2
    print("\n".join(report(cards, root, args.rule)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
