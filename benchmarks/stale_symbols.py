"""Symbol-level reachability between two commits, for benchmarks/stale.py (the default `--rule symbol`).

Nodes are the top-level definitions of each Python file (a function, a class, an assignment target, the
`if __name__ == "__main__":` block as `__main__`) plus one node per file, `<module>`, for its other module-level
statements (imports excluded). A class is one node: a change to any of its methods changes the class.

Edges are the names a definition references, resolved within its file and across the repository's files: a plain name
(a definition of the same file, or a name brought in by `import` / `from X import name`, absolute or relative, at any
depth of the file), `alias.attr` where `alias` is an imported module (`from pkg import module; module.f` resolves to
`f`), and string constants spelling `lit_iclr.<module>[.<name>]` (config `class_path`s, `importlib` targets).
Whatever cannot be resolved to one definition (a star import, a name a module does not define, a module used other
than as `module.attr`) depends on the whole module: all of its definitions and its `<module>` node. Every definition
also reaches its own file's `<module>` node, and a `<module>` node reaches the `<module>` nodes of its package and of the
modules its file imports at module level (the code that runs on import); these import-time edges are followed but not
compared.

A definition changed between two commits when its AST with docstrings removed differs, when it exists at only one of
them, or when its references resolve to different definitions (a changed import that rebinds a name). A `<module>` node
that changed marks the whole file changed.
"""
from __future__ import annotations

import ast
import copy
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

MODULE = "<module>"
MAIN = "__main__"
EMPTY = ast.dump(ast.Module(body=[], type_ignores=[]))
WHOLE = "*"  # pseudo-node: every definition of a file and its <module> node
SOURCES = ("lit_iclr", "benchmarks", "tests", "configs", "scripts", "cli.py")
ABSOLUTE = re.compile(r"^lit_iclr(?:\.\w+)+$")

Node = tuple[str, str]  # (repo-relative path, symbol)


class Git:
    """Trees and blobs of one repository, each read once (one `git cat-file --batch` process for the blobs)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._trees: dict[str, dict[str, str]] = {}
        self._blobs: dict[str, str] = {}
        self._batch: subprocess.Popen | None = None

    def known(self, rev: str) -> bool:
        return subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=self.root,
                              capture_output=True).returncode == 0

    def tree(self, rev: str) -> dict[str, str]:
        """path -> blob id of the source files at `rev`."""
        if rev not in self._trees:
            out = subprocess.run(["git", "ls-tree", "-r", "--full-tree", rev, "--", *SOURCES], cwd=self.root,
                                 capture_output=True, text=True, check=True).stdout
            rows = (line.split("\t", 1) for line in out.splitlines())
            self._trees[rev] = {path: meta.split()[2] for meta, path in rows if meta.split()[1] == "blob"}
        return self._trees[rev]

    def blob(self, sha: str) -> str:
        if sha not in self._blobs:
            if self._batch is None:
                self._batch = subprocess.Popen(["git", "cat-file", "--batch"], cwd=self.root, stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE)
            self._batch.stdin.write(f"{sha}\n".encode())
            self._batch.stdin.flush()
            size = int(self._batch.stdout.readline().split()[2])
            data = self._batch.stdout.read(size + 1)[:-1]
            self._blobs[sha] = data.decode("utf-8", errors="replace")
        return self._blobs[sha]

    def close(self) -> None:
        if self._batch is not None:
            self._batch.stdin.close()
            self._batch.wait()
            self._batch = None


def module_name(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@dataclass
class Module:
    """One file's definitions: normalised AST dumps, raw references, and what its imports bind."""
    path: str
    name: str
    package: str                                  # the package relative imports start from
    local: dict[str, str] = field(default_factory=dict)     # name bound at top level -> node holding it
    dumps: dict[str, str] = field(default_factory=dict)     # node -> AST dump without docstrings
    refs: dict[str, set] = field(default_factory=dict)      # node -> raw references
    aliases: dict[str, set] = field(default_factory=dict)   # local name -> {("module", m) | ("from", m, name)}
    stars: set[str] = field(default_factory=set)
    on_import: set[str] = field(default_factory=set)        # modules imported at module level


class _Strip(ast.NodeTransformer):
    """Docstrings removed (an emptied body becomes `pass`); imports kept unless `imports=False`."""

    def __init__(self, imports: bool = True):
        self.imports = imports

    def _body(self, node):
        self.generic_visit(node)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    visit_Module = visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _body

    def visit_Import(self, node):
        return node if self.imports else ast.Pass()

    visit_ImportFrom = visit_Import


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _references(node: ast.AST) -> set:
    found: set = set()

    class Visitor(ast.NodeVisitor):
        def visit_Attribute(self, n):
            chain = _dotted(n)
            if chain is None:
                self.generic_visit(n)
            else:
                found.add(("dotted", chain))

        def visit_Name(self, n):
            if not isinstance(n.ctx, ast.Store):
                found.add(("name", n.id))

        def visit_Constant(self, n):
            if isinstance(n.value, str) and ABSOLUTE.match(n.value):
                found.add(("absolute", n.value))

    Visitor().visit(node)
    return found


def _is_main(stmt: ast.stmt) -> bool:
    t = stmt.test if isinstance(stmt, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and len(t.comparators) == 1 and isinstance(t.comparators[0], ast.Constant)
            and t.comparators[0].value == "__main__")


def _targets(stmt: ast.stmt) -> list[str] | None:
    """Names an assignment binds, or None when it also assigns something else (an attribute, an item)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    names = []
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                names.append(n.id)
            elif isinstance(n, (ast.Attribute, ast.Subscript)):
                return None
    return names


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` names (relative levels counted from `package`)."""
    base = node.module or ""
    if not node.level:
        return base
    parent = package.split(".")
    parent = parent[: len(parent) - node.level + 1]
    return ".".join([*parent, base] if base else parent)


def analyse(path: str, text: str) -> Module:
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    mod = Module(path, name, package)
    try:
        tree = _Strip().visit(ast.parse(text))
    except (SyntaxError, ValueError):
        mod.dumps[MODULE] = f"unparsable:{text}"
        mod.refs[MODULE] = set()
        return mod
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                target = a.name if a.asname else a.name.split(".")[0]
                mod.aliases.setdefault(a.asname or target, set()).add(("module", target))
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            for a in node.names:
                if a.name == "*":
                    mod.stars.add(base)
                else:
                    mod.aliases.setdefault(a.asname or a.name, set()).add(("from", base, a.name))
    statements = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            mod.on_import |= {a.name for a in stmt.names}
            continue
        if isinstance(stmt, ast.ImportFrom):
            base = _from_base(stmt, package)
            mod.on_import |= {base, *(f"{base}.{a.name}" for a in stmt.names if a.name != "*")}
            continue
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [stmt.name]
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            names = _targets(stmt)
        elif _is_main(stmt):
            names = [MAIN]
        else:
            names = None
        if not names:
            statements.append(stmt)
            continue
        for n in names:
            mod.local[n] = n
            mod.dumps[n] = mod.dumps.get(n, "") + ast.dump(stmt)
            mod.refs.setdefault(n, set()).update(_references(stmt))
    # the rest of the module-level code: one node; the names it binds (in an `if`, a `try`) belong to it
    body = _Strip(imports=False).visit(ast.Module(body=copy.deepcopy(statements), type_ignores=[]))
    mod.dumps[MODULE] = ast.dump(body)
    mod.refs[MODULE] = _references(body)
    for stmt in statements:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                mod.local.setdefault(n.id, MODULE)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                mod.local.setdefault(n.name, MODULE)
    return mod


_ANALYSED: dict[tuple[str, str], Module] = {}


class Snapshot:
    """The repository's Python files at one commit, with references resolved to nodes."""

    def __init__(self, git: Git, rev: str):
        self.git, self.rev = git, rev
        self.tree = git.tree(rev)
        self.by_name = {module_name(p): p for p in self.tree if p.endswith(".py")}
        self._edges: dict[Node, frozenset] = {}

    def module_at(self, path: str) -> Module | None:
        sha = self.tree.get(path)
        if sha is None or not path.endswith(".py"):
            return None
        key = (path, sha)
        if key not in _ANALYSED:
            _ANALYSED[key] = analyse(path, self.git.blob(sha))
        return _ANALYSED[key]

    def module(self, name: str) -> Module | None:
        path = self.by_name.get(name)
        return self.module_at(path) if path else None

    def find(self, name: str, importer: Module | None = None) -> str | None:
        """The module `name` names: as written, or next to a script that is not in a package (`import scale_data`)."""
        if name in self.by_name:
            return name
        if importer is not None and importer.package:
            sibling = f"{importer.package}.{name}"
            if sibling in self.by_name and f"{Path(importer.path).parent}/__init__.py" not in self.tree:
                return sibling
        return None

    def nodes(self, path: str) -> set[Node]:
        mod = self.module_at(path)
        return {(path, MODULE)} | ({(path, n) for n in mod.dumps} if mod else set())

    # -- resolution: a value is (modules, nodes) ---------------------------------------------------------------------
    def _symbol(self, name: str, attr: str, depth: int) -> tuple[set, set]:
        mod = self.module(name)
        if mod is None:
            return set(), set()
        if attr in mod.local:
            return set(), {(mod.path, mod.local[attr])}
        if attr in mod.aliases and depth < 12:
            return self._alias(mod, attr, depth + 1)
        sub = self.find(f"{name}.{attr}")
        if sub is not None:
            return {sub}, set()
        return set(), {(mod.path, WHOLE)}  # a star import, or a name the module does not define

    def _target(self, mod: Module, target: tuple, depth: int) -> tuple[set, set]:
        found = self.find(target[1], mod)
        if found is None:
            return set(), set()  # outside the repository
        if target[0] == "module":
            return {found}, set()
        return self._symbol(found, target[2], depth)

    def _alias(self, mod: Module, name: str, depth: int = 0) -> tuple[set, set]:
        mods, nodes = set(), set()
        for t in mod.aliases.get(name, ()):
            m, n = self._target(mod, t, depth)
            mods |= m
            nodes |= n
        return mods, nodes

    def _walk(self, mods: set, nodes: set, attrs: list[str]) -> set[Node]:
        for attr in attrs:
            if not mods:
                break
            step_mods = set()
            for m in mods:
                sm, sn = self._symbol(m, attr, 0)
                step_mods |= sm
                nodes |= sn
            mods = step_mods
        return nodes | {(self.by_name[m], WHOLE) for m in mods}  # a module used as a value: all of it

    def resolve(self, mod: Module, ref: tuple) -> set[Node]:
        kind, text = ref
        if kind == "absolute":
            parts = text.split(".")
            return self._walk({"lit_iclr"} if "lit_iclr" in self.by_name else set(), set(), parts[1:])
        parts = text.split(".")
        base = parts[0]
        nodes: set[Node] = set()
        if base in mod.local:
            nodes.add((mod.path, mod.local[base]))
        mods, more = self._alias(mod, base)
        nodes |= more
        if base not in mod.local and base not in mod.aliases:
            for star in mod.stars:
                found = self.find(star, mod)
                if found is not None:
                    nodes.add((self.by_name[found], WHOLE))
        return self._walk(mods, nodes, parts[1:])

    def edges(self, node: Node) -> frozenset:
        """The nodes a definition's references resolve to (compared between commits)."""
        if node not in self._edges:
            mod = self.module_at(node[0])
            refs = mod.refs.get(node[1], set()) if mod else set()
            self._edges[node] = frozenset(n for r in refs for n in self.resolve(mod, r))
        return self._edges[node]

    def on_import(self, path: str) -> set[Node]:
        """Import-time edges of a `<module>` node: its package's and its module-level imports' `<module>` nodes."""
        mod = self.module_at(path)
        if mod is None:
            return set()
        out = set()
        for name in {mod.name.rpartition(".")[0], *mod.on_import}:
            found = self.find(name, mod) if name else None
            if found is not None and found != mod.name:
                out.add((self.by_name[found], MODULE))
        return out

    def reach(self, roots: set[Node], on_reach=None) -> set[Node]:
        """Every node reachable from `roots` (WHOLE pseudo-nodes expanded). `on_reach(node)` may return more roots."""
        seen: set[Node] = set()
        todo = list(roots)
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            path, sym = node
            if sym == WHOLE:
                todo += self.nodes(path)
                continue
            todo += self.edges(node)
            todo += self.on_import(path) if sym == MODULE else [(path, MODULE)]
            if on_reach is not None:
                todo += on_reach(node)
        return {n for n in seen if n[1] != WHOLE}


def changed(old: Snapshot, new: Snapshot, nodes: set[Node]) -> list[Node]:
    """The nodes whose definition or resolved references differ between two snapshots."""
    out = []
    for path, sym in sorted(nodes):
        a, b = old.module_at(path), new.module_at(path)
        da = a.dumps.get(sym) if a else EMPTY if sym == MODULE else None  # no file: no module-level code
        db = b.dumps.get(sym) if b else EMPTY if sym == MODULE else None
        if da != db or (a is not None and da is not None and old.edges((path, sym)) != new.edges((path, sym))):
            out.append((path, sym))
    return out
