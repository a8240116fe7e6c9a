"""SparQ's settings' table (``llama-sparq-settings.def``, next to ``llama-sparq.h``) read in Python.

The C side expands the file's ``LLAMA_SPARQ_SETTING(type, name, default, range, or, help, shown)``
rows with the preprocessor (the file's opening comment says what each column holds); this module
parses the same rows, so the cffi struct (``cdef.py``), ``Llama``'s keywords and the Python
server's config come from the one table. Pure Python, no cffi: it also serves the tests and
the docs' checks without a build.

Each front end's spelling of a setting is derived here once, as in the C tools
(``ggml-sparq/tools/sparq-settings.h``): the keyword ``sparq_<name>`` (``sparq`` for
``enabled``), the flag ``--sparq-<name>``, the environment variable ``LLAMA_ARG_SPARQ_<NAME>``,
the ``/props`` field ``<name>`` and the ``/metrics`` gauge ``llamacpp:sparq_<name>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# installed: llama_sparq/bindings -> llama_sparq/include; a source checkout: bindings/ -> ggml-sparq/include
INCLUDE_DIRS = (_HERE.parent / "include", _HERE.parent / "ggml-sparq" / "include")
HEADER = "llama-sparq.h"
TABLE = "llama-sparq-settings.def"

# the `shown` column's names -> the front ends they stand for
FRONT_ENDS = ("flags", "bench", "props", "metrics", "python")
_SHOWN = {"SPARQ_IN_FLAGS": {"flags"}, "SPARQ_IN_BENCH": {"bench"}, "SPARQ_IN_PROPS": {"props"},
          "SPARQ_IN_METRICS": {"metrics"}, "SPARQ_IN_PYTHON": {"python"}, "SPARQ_IN_ALL": set(FRONT_ENDS),
          "SPARQ_BENCH_MD_ALWAYS": {"bench_md"}}
_RANGES = ("SPARQ_ANY", "SPARQ_INTS", "SPARQ_INTS_TO", "SPARQ_SHARE", "SPARQ_VALUES", "SPARQ_NAMES")
_TYPES = {"bool": "bool", "int32_t": "int", "float": "float"}


class SettingsError(ValueError):
    """The settings' table cannot be read (the message names the file and the row)."""


@dataclass(frozen=True)
class Setting:
    """One row of the table."""

    ctype: str        # bool, int32_t, float
    name: str         # the field of struct llama_sparq_params
    default: str      # its C expression
    range: str        # its C text (SPARQ_INTS(1, 65536), ...)
    alt: str          # SPARQ_OR(...) or SPARQ_NONE
    help: str
    shown: frozenset  # FRONT_ENDS (and "bench_md")

    @property
    def kind(self) -> str:
        """bool, int, float or enum (an int32_t with SPARQ_NAMES)."""
        return "enum" if self.range.startswith("SPARQ_NAMES") else _TYPES[self.ctype]

    @property
    def keyword(self) -> str:
        """Llama's keyword, the Python server's field, llama-bench's column."""
        return keyword(self.name)

    @property
    def flag(self) -> str:
        return "--" + self.keyword.replace("_", "-")

    @property
    def env(self) -> str:
        return "LLAMA_ARG_" + self.keyword.upper()

    @property
    def metric(self) -> str:
        return "sparq_" + self.name


def keyword(field: str) -> str:
    """The front ends' name of a field: enabled -> sparq, r -> sparq_r, ..."""
    return "sparq" if field == "enabled" else "sparq_" + field


def field_of(key: str) -> str | None:
    """The field of a keyword (sparq -> enabled, sparq_r -> r); None for another name."""
    if key == "sparq":
        return "enabled"
    f = key[len("sparq_"):] if key.startswith("sparq_") else None
    return None if f == "enabled" else f


def include_dir() -> Path:
    for d in INCLUDE_DIRS:
        if (d / HEADER).is_file():
            return d
    raise SettingsError(f"llama-sparq: the C header {HEADER} is not installed with the package (looked in "
                        + ", ".join(str(d) for d in INCLUDE_DIRS) + ")")


def _strip_comments(text: str) -> str:
    return re.sub(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/', lambda m: m.group(0) if m.group(0)[0] == '"' else " ",
                  text, flags=re.S)


def _split_args(body: str) -> list[str]:
    """The top-level comma-separated arguments of a macro call's body."""
    args, depth, cur, i = [], 0, [], 0
    while i < len(body):
        c = body[i]
        if c == '"':
            m = re.match(r'"(?:\\.|[^"\\])*"', body[i:])
            cur.append(m.group(0))
            i += len(m.group(0))
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    args.append("".join(cur).strip())
    return args


def _string(expr: str, defines: dict, where: str) -> str:
    """A C string expression of adjacent literals and LLAMA_SPARQ_STR(NAME) (an integer define)."""
    out, rest = [], expr.strip()
    while rest:
        m = re.match(r'"((?:\\.|[^"\\])*)"\s*', rest)
        if m:
            out.append(re.sub(r"\\(.)", r"\1", m.group(1)))
        else:
            m = re.match(r"LLAMA_SPARQ_STR\(\s*(\w+)\s*\)\s*", rest)
            if not m or m.group(1) not in defines:
                raise SettingsError(f"{where}: the help is not string literals and LLAMA_SPARQ_STR(<an integer "
                                    f"#define of {HEADER}>): {expr!r}")
            out.append(str(defines[m.group(1)]))
        rest = rest[m.end():]
    return "".join(out)


def parse(text: str, defines: dict | None = None, name: str = TABLE) -> tuple:
    """The rows of a table's text; ``defines`` resolves LLAMA_SPARQ_STR(NAME) in the texts."""
    body = _strip_comments(text)
    rows, seen = [], set()
    for m in re.finditer(r"\bLLAMA_SPARQ_SETTING\s*\(", body):
        depth, i = 1, m.end()
        while depth and i < len(body):
            if body[i] == '"':
                i += len(re.match(r'"(?:\\.|[^"\\])*"', body[i:]).group(0))
                continue
            depth += {"(": 1, ")": -1}.get(body[i], 0)
            i += 1
        args = _split_args(body[m.end():i - 1])
        where = f"{name}: row {len(rows) + 1}"
        if len(args) != 7:
            raise SettingsError(f"{where}: {len(args)} columns, expected 7 (type, name, default, range, or, help, "
                                f"shown)")
        ctype, field, default, rng, alt, help_, shown = args
        if ctype not in _TYPES or not re.fullmatch(r"[a-z_][a-z0-9_]*", field) or field in seen:
            raise SettingsError(f"{where}: type {ctype!r} (bool, int32_t or float) or name {field!r} (a new "
                                f"lower-case field) is not allowed")
        if not rng.startswith(_RANGES) or (rng.startswith("SPARQ_NAMES") and ctype != "int32_t"):
            raise SettingsError(f"{where} ({field}): range {rng!r} is not one of {', '.join(_RANGES)} (an enum's "
                                f"SPARQ_NAMES is int32_t's)")
        fronts = set()
        for tok in (t.strip() for t in shown.split("|")):
            if tok not in _SHOWN:
                raise SettingsError(f"{where} ({field}): front end {tok!r} is not one of {', '.join(_SHOWN)}")
            fronts |= _SHOWN[tok]
        seen.add(field)
        rows.append(Setting(ctype, field, default, re.sub(r"\s+", " ", rng), re.sub(r"\s+", " ", alt),
                            _string(help_, defines or {}, f"{where} ({field})"), frozenset(fronts)))
    if not rows or rows[0].name != "enabled":
        raise SettingsError(f"{name}: the first row must be `enabled` (found {[r.name for r in rows][:1]})")
    return tuple(rows)


_table: dict = {}


def header_defines(path: Path | None = None) -> dict:
    """The integer #defines of the header's cffi region (LLAMA_SPARQ_ABI_VERSION, ...)."""
    from .cdef import integer_defines

    p = path or include_dir() / HEADER
    return integer_defines(p.read_text(), str(p))


def abi_version() -> int:
    """LLAMA_SPARQ_ABI_VERSION: the ABI is written in the header only."""
    return header_defines()["LLAMA_SPARQ_ABI_VERSION"]


def table(path: Path | None = None) -> tuple:
    """The rows of the installed table (or of ``path``), in the struct's order."""
    p = Path(path) if path else include_dir() / TABLE
    if p not in _table:
        if not p.is_file():
            raise SettingsError(f"llama-sparq: the settings' table {p} is missing (installed with {HEADER})")
        header = p.parent / HEADER
        _table[p] = parse(p.read_text(), header_defines(header if header.is_file() else None), str(p))
    return _table[p]


def by_keyword(rows=None) -> dict:
    """keyword -> Setting."""
    return {s.keyword: s for s in (rows if rows is not None else table())}
