"""Which measured tables in the method cards may no longer describe the code.

Every measured table in `seeds/<method>.md` carries one line directly under it:

    Measured at commit <sha> with: `<command>`

A table is listed as stale when, since that commit, anything changed in the code it measured: the method's package
`lit_iclr/<method>/`, the `lit_iclr/core/` modules that package imports (followed through core's own imports), and the
files its command names (a benchmark script, a config). Tables without the line are counted per card, since nothing can
tell whether they are still true. A table that is not a measurement (a map from the paper's symbols to the code, a list
of options) carries `<!-- not measured -->` in that place instead, and is only counted. The list is printed, never a
failure (CI prints it after the tests).

    .venv/bin/python benchmarks/stale.py            # markdown list of stale tables, then the unrecorded counts
    .venv/bin/python benchmarks/stale.py --card vgf # one card
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASURED = re.compile(r"^Measured at commit `?([0-9a-f]{7,40})`? with: `(.+)`\s*$")
NOT_MEASURED = "<!-- not measured -->"
PATH_IN_COMMAND = re.compile(r"(?:^|\s|=)((?:benchmarks|configs|lit_iclr|scripts|data)/[\w./-]+)")


@dataclass
class Table:
    card: str
    line: int          # 1-based line of the table's header row
    title: str         # the nearest heading above it
    commit: str | None
    command: str | None
    measured: bool = True  # False: marked `<!-- not measured -->` (a mapping or options table)


def card_tables(text: str, card: str) -> list[Table]:
    """Each markdown table (a run of lines starting with `|`), its heading, and the measured-at line right under it."""
    lines = text.splitlines()
    tables, heading, i = [], "", 0
    while i < len(lines):
        if lines[i].startswith("#"):
            heading = lines[i].lstrip("#").strip()
        if lines[i].startswith("|"):
            start = i
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            j = i
            while j < len(lines) and not lines[j].strip():  # at most one blank line between table and its line
                j += 1
                if j - i > 1:
                    break
            below = lines[j].strip() if j < len(lines) else ""
            m = MEASURED.match(below)
            tables.append(Table(card, start + 1, heading, m.group(1) if m else None, m.group(2) if m else None,
                                measured=below != NOT_MEASURED))
            continue
        i += 1
    return tables


def _imports(path: Path) -> set[str]:
    """`lit_iclr.core.<x>` modules imported by one file (absolute or relative imports)."""
    try:
        tree = ast.parse(path.read_text())
    except (SyntaxError, UnicodeDecodeError):
        return set()
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
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


def _module_file(name: str) -> Path | None:
    rel = Path(*name.split("."))
    for candidate in (ROOT / rel.with_suffix(".py"), ROOT / rel / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def code_paths(method: str, command: str | None) -> list[str]:
    """The method package, the core modules it reaches, and the files the command names (repo-relative)."""
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
        for name in _imports(f):
            target = _module_file(name)
            if target is not None and target not in seen:
                paths.add(str(target.relative_to(ROOT)))
                todo.append(target)
    return sorted(paths)


def changed_since(commit: str, paths: list[str]) -> list[str] | None:
    """Files under `paths` changed between `commit` and HEAD; None when the commit is unknown here (e.g. a shallow clone)."""
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    if known.returncode != 0:
        return None
    out = subprocess.run(["git", "diff", "--name-only", commit, "HEAD", "--", *paths], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


def report(cards: list[Path]) -> list[str]:
    stale, unknown, unrecorded, fresh, descriptive = [], [], {}, 0, 0
    for card in cards:
        method = card.stem
        for t in card_tables(card.read_text(), card.name):
            if not t.measured:
                descriptive += 1
                continue
            if t.commit is None:
                unrecorded[card.name] = unrecorded.get(card.name, 0) + 1
                continue
            changed = changed_since(t.commit, code_paths(method, t.command))
            where = f"seeds/{t.card}:{t.line} ({t.title or 'no heading'})"
            if changed is None:
                unknown.append(f"- {where}: commit {t.commit} is not in this history")
            elif changed:
                shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
                stale.append(f"- {where}: measured at {t.commit}; changed since: {shown}. Rerun: `{t.command}`")
            else:
                fresh += 1
    lines = [f"## Stale card tables ({len(stale)} stale, {fresh} current, {sum(unrecorded.values())} unrecorded, "
             f"{descriptive} not measurements)", ""]
    lines += stale or ["- none: every recorded table's code is unchanged since it was measured"]
    lines += unknown
    if unrecorded:
        lines += ["", "Tables with no `Measured at commit ... with: ...` line (cannot be checked): " +
                  ", ".join(f"{k} {v}" for k, v in sorted(unrecorded.items()))]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--card", action="append", help="method name (seeds/<name>.md); default: every card")
    args = ap.parse_args(argv)
    cards = [ROOT / "seeds" / f"{c}.md" for c in args.card] if args.card else sorted((ROOT / "seeds").glob("*.md"))
    missing = [str(c) for c in cards if not c.exists()]
    if missing:
        print(f"no such card: {', '.join(missing)} (cards are seeds/<method>.md)", file=sys.stderr)
        return 2
    print("\n".join(report(cards)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
