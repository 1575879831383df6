"""Which linted files a file imports, read from its parse where there is one, else from
its text (name lists in parentheses over several lines, Black's layout, and backslash
continuations included), and matched to linted files: lint.facts' rules, as its
docstring states them."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# `from a import b, c`, `from . import (\n    b,  # why\n    c,\n)` (Black's layout for long
# imports), `from a import b, \\\n c`: the names run to the closing parenthesis or over
# backslash-continued lines
FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)[ \t]*([\w.]*)[ \t]+import[ \t]*"
                  r"(\((?:[^)#]|#[^\n]*\n)*\)|(?:[\w.,* \t]|\\\r?\n)+)", re.M)
IMPORT = re.compile(r"^[ \t]*import[ \t]+((?:[\w., \t]|\\\r?\n)+)", re.M)
COMMENT = re.compile(r"#[^\n]*")
TOP_LEVEL = re.compile(r"^(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)|^(\w+)[ \t]*(?::[^=\n]*)?=[^=]",
                       re.M)


def defined_names(text: str) -> frozenset[str]:
    """What a module's text defines at its top level: functions, classes, assignments."""
    return frozenset(a or b for a, b in TOP_LEVEL.findall(text))


@dataclass
class Modules:
    """How import statements name the linted files: `files`, the unique endings of their
    module paths (`suffixes`), and what each defines at its top level (`defines`)."""

    files: set[str]
    suffixes: dict[str, str]
    defines: dict[str, frozenset[str]] = field(default_factory=dict)
    _owners: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def absolute(self, module: str, importer: str) -> str:
        """The file of `import module` in `importer`: next to it first (a script's own
        folder comes first on sys.path), else the unique file whose module path ends so."""
        base = Path(importer).parent.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if str(candidate) in self.files:
                return str(candidate)
        return self.suffixes.get(module, "")

    def exporting(self, package: str, members: list[str]) -> set[str]:
        """For `from package import members` where `package` is no linted file: the one
        linted file in a folder named `package` that defines each member (what the
        package's unlinted `__init__.py` re-exports)."""
        if not self._owners:  # name → the files defining it, built on first use
            for file, names in self.defines.items():
                for defined in names:
                    self._owners.setdefault(defined, []).append(file)
        parts = tuple(package.split("."))
        found = set()
        for member in members:
            owners = [f for f in self._owners.get(member, ())
                      if Path(f).parent.parts[-len(parts):] == parts]
            found |= set(owners) if len(owners) == 1 else set()
        return found


def import_statements(text: str, nodes: Sequence[ast.AST] | None = None
                      ) -> tuple[list[str], list[tuple[str, str, list[str]]]]:
    """The modules of the file's `import a.b` statements, and (leading dots, module,
    imported names) of its `from` imports: from its parse when there is one (`nodes`:
    its import statements, or every node of the tree), else read from the text (parenthesised and
    backslash-continued name lists included)."""
    if nodes is not None:
        plain = [a.name for n in nodes if isinstance(n, ast.Import) for a in n.names]
        froms = [("." * n.level, n.module or "", [a.name for a in n.names])
                 for n in nodes if isinstance(n, ast.ImportFrom)]
        return plain, froms
    plain = [m for found in IMPORT.findall(text) for m in _names(found)]
    return plain, [(dots, module, _names(names)) for dots, module, names in FROM.findall(text)]


def _names(listed: str) -> list[str]:
    """`a as b, c` (within parentheses, with comments and line continuations) → [a, c]."""
    listed = COMMENT.sub("", listed).strip().strip("()").replace("\\", " ")
    return [m.split()[0] for m in listed.split(",") if m.strip()]


def imported_files(name: str, text: str, modules: Modules,
                   nodes: Sequence[ast.AST] | None = None) -> set[str]:
    """The linted files that file `name` imports (`nodes`: its parse's, if there is one,
    else read from its text): `import a.b`, `from a import b` (module `a`, or module `a.b`, or
    the file of package `a` that defines `b`), `from .b import c`, `from . import b` —
    see the module docstring."""
    plain, froms = import_statements(text, nodes)
    found = {modules.absolute(module, name) for module in plain}
    for dots, module, members in froms:
        if dots:
            folder = Path(name).parent
            for _ in range(len(dots) - 1):
                folder = folder.parent
            base = folder.joinpath(*module.split(".")) if module else folder
            candidates = [base.with_suffix(".py"), base / "__init__.py",
                          *(base / f"{m}.py" for m in members)]
            found |= {str(c) for c in candidates if str(c) in modules.files}
            continue
        package = modules.absolute(module, name)
        subs = {modules.absolute(f"{module}.{m}", name) for m in members} - {""}
        found |= {package} | subs
        if not package and not subs:
            found |= modules.exporting(module, members)
    return found - {"", name}
