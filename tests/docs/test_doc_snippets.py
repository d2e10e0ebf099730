"""The Python snippets of README.md and docs/*.md import what they name: every
``import X`` / ``from X import a, b`` line of a fenced ``python`` block resolves against
the installed packages (a renamed or moved module fails here, not in a user's shell)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _imports() -> list[tuple[str, str, int, tuple[str, ...]]]:
    """(doc, module, line in the block, names) for each import statement of each block."""
    out = []
    for doc in DOCS:
        for block in BLOCK.findall(doc.read_text()):
            lines = [ln for ln in block.splitlines() if re.match(r"\s*(from|import)\s", ln)]
            for stmt in ast.parse("\n".join(ln.strip() for ln in lines)).body:
                if isinstance(stmt, ast.ImportFrom):
                    out.append((doc.name, stmt.module, stmt.lineno, tuple(a.name for a in stmt.names)))
                elif isinstance(stmt, ast.Import):
                    out.extend((doc.name, a.name, stmt.lineno, ()) for a in stmt.names)
    return out


IMPORTS = _imports()


def test_the_docs_have_python_snippets_with_imports():
    assert len(IMPORTS) >= 3, IMPORTS   # an empty list would make the check below pass


@pytest.mark.parametrize("doc,module,line,names", IMPORTS,
                         ids=[f"{d}:{m}" for d, m, _, _ in IMPORTS])
def test_snippet_imports_resolve(doc, module, line, names):
    mod = importlib.import_module(module)
    missing = [n for n in names if n != "*" and not hasattr(mod, n)
               and importlib.util.find_spec(f"{module}.{n}") is None]
    assert not missing, f"{doc}: `from {module} import ...` names {missing}, which {module} does not have"
