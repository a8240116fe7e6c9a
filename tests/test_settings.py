"""One table of settings (ggml-sparq/include/llama-sparq-settings.def): every row reaches every
front end it is shown in, and a row added to a copy of the table is seen by the same checks.

Each front end is observed from the outside, as a user meets it: Llama's keywords, the Python
server's fields and flags, the C struct as cffi binds it, `llama-completion --help` (the common
flags and their environment variables), llama-bench's --help and its JSON columns, llama-server's
/props and /metrics. `missing()` then lists, per front end, the rows it does not show; with the
installed table nothing is missing, and with a demo row appended to a copy of the table exactly
that row is missing everywhere (what a front end that skipped a row would look like)."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_sparq import tool_path
from llama_sparq.bindings import settings as table

ROOT = Path(__file__).resolve().parent.parent
DEF = ROOT / "ggml-sparq" / "include" / "llama-sparq-settings.def"
DEMO_ROW = '''
LLAMA_SPARQ_SETTING(int32_t, demo_budget, 7, SPARQ_INTS(1, 100), SPARQ_NONE,
    "a demo setting (tests/test_settings.py)",
    SPARQ_IN_ALL)
'''



def with_demo_row() -> str:
    """The table's text with DEMO_ROW after its last row (before the #undef lines that end the file)."""
    text = DEF.read_text()
    assert text.count("\n#undef LLAMA_SPARQ_SETTING\n") == 1
    return text.replace("\n#undef LLAMA_SPARQ_SETTING\n", DEMO_ROW + "\n#undef LLAMA_SPARQ_SETTING\n")


sys.path.insert(0, str(ROOT / "bench"))
from server_load import Server  # noqa: E402


def run(args, timeout=120):
    return subprocess.run([str(a) for a in args], capture_output=True, encoding="utf-8", errors="replace",
                          timeout=timeout, stdin=subprocess.DEVNULL, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))


@pytest.fixture(scope="module")
def seen(tiny_model, tmp_path_factory):
    """What every front end shows, gathered once."""
    from llama_sparq import Llama, _sparq
    from llama_sparq.server import SparqModelSettings, _add_sparq_args

    parser = argparse.ArgumentParser()
    _add_sparq_args(parser)
    out = {
        "struct": [f for f in _sparq.fields()],
        "python": [p for p in inspect.signature(Llama.__init__).parameters],
        "python_server": list(SparqModelSettings.model_fields),
        "python_server_flags": [o for a in parser._actions for o in a.option_strings],
        "flags_help": run([tool_path("llama-completion"), "--help"]).stdout,
        "bench_help": run([tool_path("llama-bench"), "--help"]).stdout,
    }
    res = run([tool_path("llama-bench"), "-m", tiny_model, "-p", "0", "-n", "1", "-r", "1", "-t", "1", "-o", "json",
               "--sparq", "1", "--sparq-k", "8"])
    assert res.returncode == 0, res.stderr[-2000:]
    out["bench_columns"] = list(json.loads(res.stdout)[0])
    log = tmp_path_factory.mktemp("server") / "server.log"
    with Server(tiny_model, ["-c", 1024, "-np", 1, "--sparq", "--sparq-k", 8], log_path=log, start_timeout=120) as srv:
        out["props"] = srv.get("/props")["sparq"]
        out["metrics"] = list(srv.metrics())
    return out


def missing(rows, seen) -> dict:
    """Per front end, the names of the rows shown there by the table that it does not show."""
    def absent(front, present):
        return [r.name for r in rows if front in r.shown and not present(r)]

    return {
        "struct (cffi)": [r.name for r in rows if r.name not in seen["struct"]],
        "Llama keyword": absent("python", lambda r: r.keyword in seen["python"]),
        "Python server field": absent("python", lambda r: r.keyword in seen["python_server"]),
        "Python server flag": absent("python", lambda r: r.flag in seen["python_server_flags"]),
        "common flag (llama-completion --help)": absent("flags", lambda r: f"{r.flag} " in seen["flags_help"]
                                                        or f"{r.flag}," in seen["flags_help"]),
        "environment variable (--help)": absent("flags", lambda r: f"env: {r.env})" in seen["flags_help"]),
        "llama-bench flag (--help)": absent("bench", lambda r: f"  {r.flag} <" in seen["bench_help"]),
        "llama-bench column": absent("bench", lambda r: r.keyword in seen["bench_columns"]),
        "/props": absent("props", lambda r: r.name in seen["props"]),
        "/metrics": absent("metrics", lambda r: any(m == r.metric or m.startswith(r.metric + "{")
                                                    for m in seen["metrics"])),
    }


def test_every_row_reaches_every_front_end(seen):
    rows = table.table()
    assert [r.name for r in rows][:3] == ["enabled", "r", "k"] and len(rows) >= 15
    gaps = {front: names for front, names in missing(rows, seen).items() if names}
    assert not gaps, f"front ends that miss rows of llama-sparq-settings.def: {gaps}"


def test_a_row_added_to_a_copy_of_the_table_is_missed_by_every_front_end(seen, tmp_path):
    """The checks above follow the table: a demo row appended to a copy is reported missing by
    each front end (they were built from the real table), and nothing else is."""
    copy = tmp_path / "llama-sparq-settings.def"
    copy.write_text(with_demo_row())
    rows = table.table(copy)
    assert rows[-1].name == "demo_budget" and rows[-1].keyword == "sparq_demo_budget"
    assert (rows[-1].flag, rows[-1].env, rows[-1].metric) == ("--sparq-demo-budget", "LLAMA_ARG_SPARQ_DEMO_BUDGET",
                                                              "sparq_demo_budget")
    gaps = missing(rows, seen)
    assert all(names == ["demo_budget"] for names in gaps.values()), gaps


def test_a_row_added_to_a_copy_of_the_table_reaches_the_c_front_ends(tmp_path):
    """The C side of one new row, without another edit: compiled against a copy of the include
    folder whose table has the demo row, the struct gains the field (after the others: offsets
    unchanged), and the tools' descriptors give it a flag, an environment variable and a
    llama-bench column."""
    include = tmp_path / "include"
    include.mkdir()
    (include / "llama-sparq.h").write_text((DEF.parent / "llama-sparq.h").read_text())
    (include / "llama-sparq-settings.def").write_text(with_demo_row())
    src = tmp_path / "demo.cpp"
    src.write_text(r'''
#include "llama-bench-sparq.h"
#include <cstddef>
#include <cstdio>
int main() {
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        printf("%s %s %s\n", sparq_settings[i].name, sparq_spelling_of(i).flag.c_str(), sparq_spelling_of(i).env.c_str());
    }
    for (const std::string & f : sparq_bench_add_fields({ "n_depth", "test_time" })) {
        printf("column %s\n", f.c_str());
    }
    printf("offset %zu %zu\n", offsetof(llama_sparq_params, k_frac), offsetof(llama_sparq_params, demo_budget));
    return 0;
}
''')
    from test_bindings import _upstream_includes

    lib = tool_path("llama-bench").parent
    exe = tmp_path / "demo"
    res = run(["c++", "-std=c++17", f"-I{include}", f"-I{ROOT / 'ggml-sparq' / 'tools'}", *_upstream_includes(),
               src, "-o", exe, f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}"], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = run([exe]).stdout.splitlines()
    assert "demo_budget --sparq-demo-budget LLAMA_ARG_SPARQ_DEMO_BUDGET" in out
    columns = [l.split()[1] for l in out if l.startswith("column ")]
    assert columns[0] == "n_depth" and columns[-1] == "test_time" and "sparq_demo_budget" in columns
    k_frac, demo = map(int, out[-1].split()[1:])
    from llama_sparq.bindings import ffi

    assert k_frac == ffi.offsetof("struct llama_sparq_params", "k_frac") and demo > k_frac


def test_the_table_is_read_as_the_c_compiler_reads_it():
    """Python's parse of the table agrees with the header's struct as cffi binds it, and a bad row
    is refused naming the row."""
    from llama_sparq.bindings import ffi

    rows = table.table()
    fields = [(n, f.type.cname) for n, f in ffi.typeof("struct llama_sparq_params").fields if n != "size"]
    assert fields == [(r.name, {"bool": "_Bool"}.get(r.ctype, r.ctype)) for r in rows]
    assert {r.name: r.kind for r in rows}["selector"] == "enum" and {r.name: r.kind for r in rows}["coverage"] == "float"
    assert "1024 with the cache in host memory" in {r.name: r.help for r in rows}["min_kv"]  # LLAMA_SPARQ_STR resolved
    for bad, message in [
        ("LLAMA_SPARQ_SETTING(double, x, 0, SPARQ_ANY, SPARQ_NONE, \"h\", SPARQ_IN_ALL)", "type 'double'"),
        ("LLAMA_SPARQ_SETTING(int32_t, x, 0, SPARQ_ANY, SPARQ_NONE, \"h\", SPARQ_IN_NOWHERE)", "SPARQ_IN_NOWHERE"),
        ("LLAMA_SPARQ_SETTING(int32_t, x, 0, SPARQ_ANY, \"h\", SPARQ_IN_ALL)", "6 columns"),
        ("LLAMA_SPARQ_SETTING(bool, k, 0, SPARQ_ANY, SPARQ_NONE, \"h\", SPARQ_IN_ALL)", "name 'k'"),
    ]:
        with pytest.raises(table.SettingsError, match=message):
            table.parse(DEF.read_text() + bad, table.header_defines(), name="copy.def")
