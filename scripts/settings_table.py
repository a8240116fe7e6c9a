#!/usr/bin/env python3
"""The README's table of SparQ's settings, written from the settings' table
(ggml-sparq/include/llama-sparq-settings.def), so that it cannot drift from what the C library
accepts.

    python scripts/settings_table.py           # rewrite the table between README.md's markers
    python scripts/settings_table.py --check   # exit 1, showing the difference, if it is stale

Each row comes from one row of the .def, read by bindings/settings.py (pure Python, no build):
the Python keyword and the tools' flag from the field's name (the metavar by its kind, as
ggml-sparq/tools/common-sparq.h gives it), the default from its C default (an enum's by the C
API's names), its meaning and the allowed values from its `or` and `range` columns. What the
.def holds only as C expressions (a default that depends on another setting) and a short name
for the README's first column are kept here, in LABELS and CONDITIONAL; each entry of
CONDITIONAL repeats the C expression it stands for, so that an edit of that expression in the
.def stops this script until the words are edited too. A row without a label stops it as well.
tests/test_docs.py fails when README.md's table differs from what this writes.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEF = ROOT / "ggml-sparq" / "include" / "llama-sparq-settings.def"
README = ROOT / "README.md"
BEGIN = "<!-- settings-table: begin (scripts/settings_table.py writes it) -->"
END = "<!-- settings-table: end -->"

# the README's name of each setting (its first column), by field
LABELS = {
    "enabled": "on/off",
    "r": "components `r` (step 1)",
    "k": "positions `k`",
    "l": "local window `l`",
    "min_kv": "dense threshold (KV cells)",
    "all_rows": "all query rows (teacher forcing)",
    "selector": "selector",
    "gqa": "GQA choice",
    "mean_v": "mean-V (step 5)",
    "basis": "step-1 basis",
    "index_lists": "`index`: lists",
    "index_probe": "`index`: lists read per step",
    "coverage": "calibrated k: coverage target",
    "k_min": "calibrated k: fewest cells",
    "k_frac": "calibrated k: most cells (share)",
    "kt_bits": "bits per K^T element",
    "topk_buckets": "approximate top-k: buckets",
}

# (field, column) -> (the .def's C expression, the README's words for it): the `or` meanings and
# the range bounds that the .def writes as expressions of the other settings
CONDITIONAL = {
    ("r", "or"): ('p->kt_bits == 4 ? "3/8 of the head size (rounded)" : p->kt_bits == 8 ? "5/16 of the head size '
                  '(rounded)" : "head size / 4"',
                  "3/8 of the head size (rounded); 5/16 with `sparq_kt_bits=8`; head size / 4 with "
                  "`sparq_kt_bits=16`"),
    ("l", "or"): ('p->k > 0 ? "k / 4" : "k_min / 4"', "k / 4 (calibrated k: k_min / 4)"),
    ("l", "bound"): ('p->k > 0 ? "k" : "k_min"', "k (calibrated k: k_min)"),
}

METAVAR = {"int": "N", "float": "F", "enum": "NAME"}


class TableError(RuntimeError):
    """The generator cannot render a row (the message says which and what to edit)."""


def settings_module():
    """bindings/settings.py of the source tree, imported without the package (no build, no cffi)."""
    name = "_sparq_bindings_src"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bindings" / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / "bindings")])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return importlib.import_module(name + ".settings")


def int_defines() -> dict:
    """Integer #defines of the public headers, `(1 << n)` included."""
    out = {}
    for h in ("llama-sparq.h", "ggml-sparq.h"):
        for m in re.finditer(r"^\s*#\s*define\s+(\w+)\s+(\(?\s*\d+\s*(?:<<\s*\d+\s*)?\)?)\s*(?://.*)?$",
                             (DEF.parent / h).read_text(), re.M):
            out[m.group(1)] = m.group(2).replace(" ", "")
    return out


def enum_names() -> dict:
    """The C API's names of each enum setting (the name arrays of llama-sparq-api.cpp, and the
    selectors' beside their registry in llama-sparq-selectors.cpp), by the names function the .def's
    SPARQ_NAMES gives, and each enumerator's value (llama-sparq.h)."""
    api = "".join((ROOT / "ggml-sparq" / "llama" / f).read_text()
                  for f in ("llama-sparq-api.cpp", "llama-sparq-selectors.cpp"))
    names = {}
    for m in re.finditer(r"sparq_(\w+)_names\s*\[[^\]]*\]\s*=\s*\{([^}]*)\}", api):
        names[f"llama_sparq_{m.group(1)}_name"] = re.findall(r'"([^"]*)"', m.group(2))
    values = {m.group(1): int(m.group(2)) for m in
              re.finditer(r"^\s*(LLAMA_SPARQ_\w+)\s*=\s*(\d+)\s*,", (DEF.parent / "llama-sparq.h").read_text(), re.M)}
    return names, values


def power(text: str) -> str:
    m = re.fullmatch(r"\(?1<<(\d+)\)?", text)
    return f"2^{m.group(1)}" if m else text


def c_args(text: str, macro: str) -> list[str]:
    """The arguments of `MACRO(a, b, ...)` (top-level commas only)."""
    settings = settings_module()
    body = text[len(macro):].strip()
    assert body.startswith("(") and body.endswith(")"), text
    return settings._split_args(body[1:-1])


def conditional(row, column: str, expr: str) -> str:
    """The words for a C expression of the .def, from CONDITIONAL (which must still match it)."""
    entry = CONDITIONAL.get((row.name, column))
    norm = re.sub(r"\s+", " ", expr.strip())
    if entry is None:
        raise TableError(f"{row.name}: its {column} is a C expression ({norm}); add its words to CONDITIONAL "
                         f"in scripts/settings_table.py")
    if re.sub(r"\s+", " ", entry[0]) != norm:
        raise TableError(f"{row.name}: the .def's {column} is now {norm!r}, CONDITIONAL's words are for "
                         f"{entry[0]!r}: edit them in scripts/settings_table.py")
    return entry[1]


def text_or(row, expr: str, defines: dict) -> str:
    """A string expression of the .def, or the CONDITIONAL words for a C expression."""
    settings = settings_module()
    try:
        return settings._string(expr, defines, row.name)
    except settings.SettingsError:
        return conditional(row, "or", expr)


def render_value(row, value: str, names: dict, values: dict) -> str:
    value = value.strip()
    if row.kind == "bool":
        return {"true": "on", "false": "off"}[value]
    if row.kind == "enum":
        fn = c_args(row.range, "SPARQ_NAMES")[0]
        return f"`{names[fn][values[value]]}`"
    if row.kind == "float":
        return value.rstrip("fF")
    return value


def render_row(row, defines: dict, ints: dict, names: dict, values: dict) -> list[str]:
    if row.name not in LABELS:
        raise TableError(f"the setting {row.name!r} has no label: add one to LABELS in scripts/settings_table.py")
    label = LABELS[row.name]
    if row.kind == "bool":
        tools = f"`{row.flag}` / `--no-{row.flag[2:]}`"
    else:
        tools = f"`{row.flag} {METAVAR[row.kind]}`"

    default = render_value(row, row.default, names, values)
    alt_value = None
    if row.alt.startswith("SPARQ_OR"):
        alt_value, meaning = c_args(row.alt, "SPARQ_OR")
        if alt_value.strip() == row.default.strip():
            default = f"{default} = {text_or(row, meaning, defines)}"

    rng = row.range
    if rng.startswith("SPARQ_ANY"):
        allowed = "on, off"
    elif rng.startswith("SPARQ_INTS_TO"):
        lo, bound, _ = c_args(rng, "SPARQ_INTS_TO")
        bound = bound.strip()
        words = bound[1:-1] if re.fullmatch(r'"[^"]*"', bound) else conditional(row, "bound", bound)
        allowed = f"{lo}..{words}"
    elif rng.startswith("SPARQ_INTS"):
        lo, hi = (a.strip() for a in c_args(rng, "SPARQ_INTS"))
        allowed = f">= {lo}" if hi == "INT32_MAX" else f"{lo}..{power(ints.get(hi, hi))}"
    elif rng.startswith("SPARQ_SHARE"):
        allowed = "(0, 1]"
    elif rng.startswith("SPARQ_VALUES"):
        allowed = ", ".join(a.strip() for a in c_args(rng, "SPARQ_VALUES"))
    elif rng.startswith("SPARQ_NAMES"):
        allowed = ", ".join(f"`{n}`" for n in names[c_args(rng, "SPARQ_NAMES")[0]])
    else:
        raise TableError(f"{row.name}: range {rng!r} is not one this script renders")
    if alt_value is not None:
        allowed += f", or {alt_value.strip()}"
    return [label, f"`{row.keyword}`", tools, default, allowed]


def render(def_path: Path = DEF) -> str:
    """The markdown table for the rows of `def_path`."""
    settings = settings_module()
    defines = settings.header_defines(DEF.parent / "llama-sparq.h")
    rows = settings.parse(Path(def_path).read_text(), defines, str(def_path))
    stale = sorted(set(LABELS) - {r.name for r in rows})
    if stale:
        raise TableError(f"LABELS names settings the .def no longer has: {stale}")
    ints = int_defines()
    names, values = enum_names()
    lines = ["| setting | Python | tools | default | allowed |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append("| " + " | ".join(render_row(row, defines, ints, names, values)) + " |")
    return "\n".join(lines) + "\n"


def readme_table(text: str) -> tuple[int, int]:
    """The span of README's table between the markers (the markers' own lines excluded)."""
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b:
        raise TableError(f"README.md has no {BEGIN!r} ... {END!r} markers")
    return b + len(BEGIN) + 1, e


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md's table is stale, writing nothing")
    args = ap.parse_args(argv)
    text = README.read_text()
    b, e = readme_table(text)
    want = render()
    if text[b:e] == want:
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(text[b:e].splitlines(True), want.splitlines(True),
                                                   "README.md", "from llama-sparq-settings.def"))
        print("README.md's settings table is stale: run python scripts/settings_table.py", file=sys.stderr)
        return 1
    README.write_text(text[:b] + want + text[e:])
    print("README.md: settings table written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
