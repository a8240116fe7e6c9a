#!/usr/bin/env python3
"""Write docs/coverage.md: for every model architecture of the pinned llama.cpp whose layers attend
over a KV cache, whether decode runs SparQ on its full-attention layers, if not why, and which tiny
GGUF of the suite proves it.

Everything is read from source, so the table changes by regenerating it:

* the upstream side from the prepared tree (``scripts/upstream.py``: ``.upstream/llama.cpp-<commit>``
  or ``LLAMA_SPARQ_UPSTREAM_DIR``; ``make install`` or ``make upstream`` prepares it): the
  architectures (``llama-arch.cpp``), each one's model class and its files under ``src/models/``
  (``llama-model.cpp``, ``models.h``), the memory ``create_memory`` gives it, the hparams its
  loader sets (soft-capping, ALiBi, MLA sizes, sliding windows) and its graph's ``build_attn`` calls
  (their attention input, and whether they pass ``kq_b``, ``sinks`` or ``v_mla``);
* the fork's side from ``ggml-sparq/``: the refusals in order (``sparq_attn_variant``, the one list:
  each ``if (condition) return "phrase";``), the memories SparQ finds (``sparq_find_cache``), the
  attention inputs whose ``build_attn`` calls the hook (the patched ``llama-graph.cpp``) and the cache
  types the op reads (``ggml_sparq_cache_type_ok``).

The only knowledge kept here is :data:`CONDITIONS`, what each condition of ``sparq_attn_variant`` means
as a feature of an architecture's source; a condition it does not know stops the script with a message
naming it, so the list in C++ stays the one place that decides.

``python scripts/coverage_table.py`` writes the table; ``--check`` exits 1 when the committed file
differs from a fresh one; ``--json`` prints the rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "coverage.md"
NULLS = {"nullptr", "NULL", "0"}  # an argument not passed


class SourceError(RuntimeError):
    """The source does not have the shape this script reads; the message names what is missing."""


# --------------------------------------------------------------------------------------------------
# C++ text helpers
# --------------------------------------------------------------------------------------------------

def strip_comments(text: str) -> str:
    """Comments removed, string literals kept (a "//" inside a string is not a comment)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(text: str, i: int) -> int:
    """Index just past the bracket that closes the one at text[i]."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = [pairs[text[i]]]
    j = i + 1
    while stack:
        if j >= len(text):
            raise SourceError(f"unbalanced {text[i]!r} from: {text[i:i + 80]!r}")
        c = text[j]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")}]":
            if c != stack.pop():
                raise SourceError(f"mismatched brackets from: {text[i:i + 80]!r}")
        elif c == '"':
            j += 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
        j += 1
    return j


def split_args(s: str) -> list[str]:
    """Top-level comma-separated arguments of an argument list (without its parentheses)."""
    args, depth, cur, i = [], 0, [], 0
    while i < len(s):
        c = s[i]
        if c == '"':
            j = i + 1
            while s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            cur.append(s[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    if "".join(cur).strip():
        args.append("".join(cur).strip())
    return args


def body_of(text: str, signature: str, where: str) -> str:
    """The body (between its braces) of the function whose definition matches regex ``signature``."""
    m = re.search(signature, text)
    if not m:
        raise SourceError(f"{where}: no definition matching {signature!r}")
    i = text.index("{", m.end())
    return text[i + 1:matching(text, i) - 1]


def calls(text: str, name: str) -> list[tuple[int, list[str]]]:
    """(offset, arguments) of each call ``name(...)`` in text (not ``x.name_more(`` nor ``::name(``)."""
    out = []
    for m in re.finditer(r"(?<![\w:.>])" + re.escape(name) + r"\s*\(", text):
        i = m.end() - 1
        out.append((m.start(), split_args(text[i + 1:matching(text, i) - 1])))
    return out


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def read(path: Path) -> str:
    try:
        return strip_comments(path.read_text())
    except FileNotFoundError:
        raise SourceError(f"{path}: missing") from None


# --------------------------------------------------------------------------------------------------
# the fork's side
# --------------------------------------------------------------------------------------------------

# What each condition of sparq_attn_variant means as a feature of an architecture's source.
# ("model", key): the model's hparams or arch (checked for every layer); ("call", key): an attention
# call's tensors or shapes. A condition of the C++ list missing here stops the script.
CONDITIONS = {
    "hp.attn_soft_cap": ("model", "soft_cap"),
    "hp.f_max_alibi_bias > 0.0f": ("model", "alibi"),
    "hp.is_mla()": ("model", "mla"),
    "call->sinks": ("call", "sinks"),
    "call->v_mla": ("call", "v_mla"),
    "call->dv != call->dk": ("call", "dk_ne_dv"),
    "call->n_head_kv > 0 && call->dk * call->n_head_kv != call->k_row": ("call", "k_row"),
    "hp.attn_soft_cap && call->kq_scale != 1.0f": ("call", "soft_cap_scaled"),
    # a call's logit scale other than 1 (with `arch == X && ` before it: that architecture's calls)
    "call->kq_scale != 1.0f": ("call", "scaled"),
    # a value no valid GGUF or graph holds (a bad soft-cap, max_bias or sinks tensor): no row's cause
    "hp.attn_soft_cap && !(std::isfinite(hp.f_attn_logit_softcapping) && hp.f_attn_logit_softcapping > 0.0f)":
        ("model", "bad_value"),
    "hp.f_max_alibi_bias < 0.0f || !std::isfinite(hp.f_max_alibi_bias)": ("model", "bad_value"),
    "!(std::isfinite(hp.f_attn_logit_softcapping) && hp.f_attn_logit_softcapping > 0.0f)": ("model", "bad_value"),
    "!(std::isfinite(hp.f_attn_out_scale) && hp.f_attn_out_scale > 0.0f)": ("model", "bad_value"),
    "call->sinks && (call->sinks->type != GGML_TYPE_F32 || !ggml_is_contiguous(call->sinks) || "
    "(call->n_head > 0 && ggml_nelements(call->sinks) != call->n_head))": ("call", "bad_value"),
    "call->kq_b && (call->kq_b->type != GGML_TYPE_F32 || call->kq_b->nb[0] != sizeof(float) || call->kq_b->ne[3] != 1 || "
    "(call->n_kv > 0 && (call->kq_b->ne[0] != call->n_kv || call->kq_b->ne[1] != call->n_tokens)) || "
    "(call->n_head > 0 && call->kq_b->ne[2] != call->n_head))": ("call", "bad_value"),
}
# model features some GGUFs have: the note beside a cause
GGUF_NOTES = {"alibi": "where the GGUF sets `max_alibi_bias`"}
ARCH_CONDITION = re.compile(r"^arch == (LLM_ARCH_\w+)$")
# a condition of one architecture only: `arch == X && <a CONDITIONS key>`
ARCH_AND = re.compile(r"^arch == (LLM_ARCH_\w+) && (.+)$")

# How each feature is named in the table's attention column
FEATURE_LABELS = {
    "soft_cap": "soft-cap", "alibi": "ALiBi", "mla": "MLA", "kq_b": "KQ bias", "sinks": "sinks",
    "v_mla": "v_mla", "dk_ne_dv": "K/V sizes differ", "k_row": "K rows", "swa": "SWA layers",
    "swa_gguf": "SWA layers (some GGUFs)", "alibi_gguf": "ALiBi (some GGUFs)",
    "out_scale_cap": "soft-cap after out_scale",
}


@dataclass
class Rule:
    """One refusal of sparq_attn_variant: its condition, its phrase and the feature it reads."""
    condition: str
    phrase: str
    scope: str          # "model" or "call"
    feature: str        # a CONDITIONS key, or the LLM_ARCH_* the condition names
    is_arch: bool = False
    arch: str = ""      # the LLM_ARCH_* a condition is restricted to (`arch == X && ...`), "" for any

    def applies(self, enum: str) -> bool:
        return not self.arch or self.arch == enum


def refusal_rules(root: Path = ROOT) -> list[Rule]:
    """sparq_attn_variant's refusals, in the order it checks them."""
    src = root / "ggml-sparq" / "llama" / "llama-sparq-buffers.cpp"
    body = body_of(read(src), r"const char \* sparq_attn_variant\s*\(", str(src))
    rules, scope, pos = [], "model", 0
    while True:
        m = re.compile(r"\s*if\s*\(").match(body, pos)
        if not m:
            rest = norm(body[pos:])
            if rest != "return nullptr;":
                raise SourceError(f"{src}: sparq_attn_variant: statements this script cannot read (it reads "
                                  "`if (condition) { return \"phrase\"; }` blocks, then `return nullptr;`): "
                                  f"{rest[:120]!r}")
            break
        i = m.end() - 1
        j = matching(body, i)
        cond = norm(body[i + 1:j - 1])
        b = re.compile(r"\s*\{").match(body, j)
        end = matching(body, b.end() - 1) if b else body.index(";", j) + 1
        stmt = norm(body[b.end():end - 1] if b else body[j:end])
        pos = end
        if cond == "!call" and stmt == "return nullptr;":
            scope = "call"
            continue
        ret = re.fullmatch(r'return "([^"]+)";', stmt)
        if not ret:
            raise SourceError(f"{src}: sparq_attn_variant: `if ({cond})` does not return a phrase: {stmt!r}")
        arch = ARCH_CONDITION.match(cond)
        if arch:
            rules.append(Rule(cond, ret.group(1), "model", arch.group(1), is_arch=True))
            continue
        only = ARCH_AND.match(cond)
        key = only.group(2) if only else cond
        if key not in CONDITIONS:
            raise SourceError(f"{src}: sparq_attn_variant refuses on `{key}`, a condition "
                              f"scripts/coverage_table.py does not know: add it to CONDITIONS")
        rules.append(Rule(cond, ret.group(1), *CONDITIONS[key], arch=only.group(1) if only else ""))
    if not rules:
        raise SourceError(f"{src}: sparq_attn_variant has no refusals this script can read")
    return rules


def found_memories(root: Path, up: Path) -> set[str]:
    """The memory classes SparQ finds a KV cache in (sparq_find_cache's casts), with their subclasses."""
    src = root / "ggml-sparq" / "llama" / "llama-sparq-buffers.cpp"
    body = body_of(read(src), r"llama_kv_cache \* sparq_find_cache\s*\(", str(src))
    found = set(re.findall(r"dynamic_cast<\s*(\w+)\s*\*\s*>", body))
    if not found:
        raise SourceError(f"{src}: sparq_find_cache casts to no memory class")
    parents = memory_parents(up)
    grew = True
    while grew:
        grew = False
        for cls, par in parents.items():
            if par in found and cls not in found:
                found.add(cls)
                grew = True
    return found


def memory_parents(up: Path) -> dict[str, str]:
    out = {}
    for h in sorted((up / "src").glob("llama-*.h")):
        for m in re.finditer(r"class (llama_\w+)\s*:\s*public (llama_\w+)", read(h)):
            out[m.group(1)] = m.group(2)
    return out


def hooked_inputs(up: Path) -> set[str]:
    """The attention inputs whose build_attn runs SparQ's hook (the patched llama-graph.cpp)."""
    src = up / "src" / "llama-graph.cpp"
    text = read(src)
    hooked = set()
    for m in re.finditer(r"ggml_tensor \* llm_graph_context::build_attn\s*\(\s*(llm_graph_input_\w+)\s*\*", text):
        k = text.index("{", m.end())
        if "llama_sparq_build_attn" in text[k:matching(text, k)]:
            hooked.add(m.group(1))
    if not hooked:
        raise SourceError(f"{src}: no build_attn calls llama_sparq_build_attn: is the tree patched "
                          "(make upstream)?")
    return hooked


def cache_types(root: Path = ROOT) -> list[str]:
    """The cache types the op reads: the GGML_TYPE_* of ggml_sparq_cache_type_ok and the file's static
    helpers it calls."""
    src = root / "ggml-sparq" / "op" / "ggml-sparq.c"
    text = read(src)
    body = body_of(text, r"bool ggml_sparq_cache_type_ok\s*\(", str(src))
    seen, todo, types = set(), [body], []
    while todo:
        b = todo.pop()
        types += re.findall(r"GGML_TYPE_(\w+)", b)
        for helper in re.findall(r"(sparq_\w+)\s*\(", b):
            if helper not in seen:
                seen.add(helper)
                todo.append(body_of(text, r"static bool " + helper + r"\s*\(", str(src)))
    order = {"F32": 0, "F16": 1, "BF16": 2}
    return sorted(set(types), key=lambda t: (order.get(t, 9), t))


# --------------------------------------------------------------------------------------------------
# the upstream side
# --------------------------------------------------------------------------------------------------

@dataclass
class Call:
    """One build_attn call of a graph: its attention inputs (types) and the features it passes."""
    inputs: set[str]
    features: set[str]
    optional: dict[str, str] = field(default_factory=dict)  # feature -> the tensor only some GGUFs have


@dataclass
class Arch:
    enum: str
    name: str
    cls: str = ""
    files: list[str] = field(default_factory=list)
    memory: str = ""                 # "none", "recurrent" or the memory classes, " or "-joined
    memory_classes: set[str] = field(default_factory=set)
    features: set[str] = field(default_factory=set)   # model-level: soft_cap, alibi, mla, swa, dk_ne_dv
    calls: list[Call] = field(default_factory=list)
    direct_mha: bool = False         # the graph calls build_attn_mha itself (past build_attn and its hook)
    outcome: str = ""                # "sparq" or "dense"
    cause: str = ""
    note: str = ""                   # where the cause holds for some GGUFs only
    proof: str = ""


def arch_names(up: Path) -> dict[str, str]:
    src = up / "src" / "llama-arch.cpp"
    body = body_of(read(src), r"LLM_ARCH_NAMES\s*=", str(src))
    names = dict(re.findall(r"\{\s*(LLM_ARCH_\w+)\s*,\s*\"([^\"]+)\"\s*\}", body))
    if not names:
        raise SourceError(f"{src}: no LLM_ARCH_NAMES entries")
    return names


def arch_classes(up: Path) -> dict[str, str]:
    src = up / "src" / "llama-model.cpp"
    body = body_of(read(src), r"llama_model \* llama_model_mapping\s*\(", str(src))
    out = {}
    for m in re.finditer(r"((?:case LLM_ARCH_\w+:\s*)+)return new (llama_model_\w+)\(", body):
        for e in re.findall(r"LLM_ARCH_\w+", m.group(1)):
            out[e] = m.group(2)
    return out


def switch_cases(body: str) -> dict[str, str]:
    """{label: its group's text} of a switch body's top-level case groups ("default" too)."""
    groups, labels, start, i, depth = {}, [], None, 0, 0
    label_re = re.compile(r"(case (LLM_ARCH_\w+)\s*:|default\s*:)")
    pending = []
    while i < len(body):
        c = body[i]
        if c in "({[":
            if depth == 0 and labels and start is None:
                start = i
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif depth == 0:
            m = label_re.match(body, i)
            if m:
                if start is not None:
                    pending.append((labels, body[start:i]))
                    labels, start = [], None
                labels.append(m.group(2) or "default")
                i = m.end()
                continue
        i += 1
    if labels:
        pending.append((labels, body[start:] if start is not None else ""))
    for labs, text in pending:
        for lab in labs:
            groups[lab] = text
    return groups


def drop_mtp_branches(text: str) -> str:
    """The text without the if-branches taken only by a multi-token-prediction draft context."""
    out, pos = [], 0
    for m in re.finditer(r"if\s*\(", text):
        if m.start() < pos:
            continue
        j = matching(text, m.end() - 1)
        cond = text[m.end():j]
        if "LLAMA_CONTEXT_TYPE_MTP" in cond and "!=" not in cond:  # (`!= MTP`: the main context's branch)
            k = text.find("{", j)
            if k >= 0 and not text[j:k].strip():
                out.append(text[pos:m.start()])
                pos = matching(text, k)
    out.append(text[pos:])
    return "".join(out)


def arch_list_of(up: Path, func: str) -> set[str]:
    src = up / "src" / "llama-arch.cpp"
    body = body_of(read(src), r"bool " + func + r"\s*\(", str(src))
    return set(re.findall(r"case (LLM_ARCH_\w+):", body.split("return true")[0]))


def memories(up: Path, archs: dict[str, Arch]) -> None:
    """Each architecture's memory, from create_memory: none, recurrent, or the classes it may make."""
    src = up / "src" / "llama-model.cpp"
    body = body_of(read(src), r"llama_memory_i \* llama_model::create_memory\s*\(", str(src))
    sw = re.search(r"switch\s*\(\s*arch\s*\)\s*\{", body)
    if not sw:
        raise SourceError(f"{src}: create_memory has no switch (arch)")
    k = sw.end() - 1
    groups = switch_cases(body[k + 1:matching(body, k) - 1])
    recurrent = arch_list_of(up, "llm_arch_is_recurrent")
    hybrid = arch_list_of(up, "llm_arch_is_hybrid")
    default = groups.get("default")
    if default is None:
        raise SourceError(f"{src}: create_memory's switch has no default")
    for a in archs.values():
        text = groups.get(a.enum)
        own = None if text is None else text.split("[[fallthrough]]")[0]
        if own is not None and re.search(r"res\s*=\s*nullptr", own):
            a.memory = "none"
            continue
        a.memory_classes = set() if own is None else set(re.findall(r"new (llama_\w+)\s*\(", drop_mtp_branches(own)))
        if text is None or "[[fallthrough]]" in text:  # create_memory's default branch
            if a.enum in recurrent:
                a.memory = "recurrent"
                continue
            a.memory_classes |= default_hybrid_memory(default, a) if a.enum in hybrid else default_memory(a)
        if not a.memory_classes:
            raise SourceError(f"{src}: create_memory makes no memory class for {a.enum}")
        a.memory = " or ".join(sorted(a.memory_classes))


def default_memory(a: Arch) -> set[str]:
    """create_memory's default branch for an attention-only model: the iSWA cache with sliding windows."""
    return ({"llama_kv_cache_iswa"} if a.features & {"swa", "swa_gguf"} else set()) | \
        ({"llama_kv_cache"} if "swa" not in a.features else set())


def default_hybrid_memory(default: str, a: Arch) -> set[str]:
    """create_memory's default branch for a hybrid: hybrid-iswa with sliding windows, the indexed
    hybrid for the architectures that need it, else the plain hybrid."""
    out = {"llama_memory_hybrid_iswa"} if a.features & {"swa", "swa_gguf"} else set()
    if "swa" not in a.features:
        idx = re.search(r"needs_mem_idx\s*=\s*\(([^;]*)\)\s*;", default)
        out.add("llama_memory_hybrid_idx" if idx and a.enum in re.findall(r"LLM_ARCH_\w+", idx.group(1))
                else "llama_memory_hybrid")
    return out


def graph_api(up: Path) -> tuple[dict[str, str], dict[tuple[str, str], str], dict[int, dict[str, int]]]:
    """From llama-graph.h: {builder: input type}, {(input type, getter): input type} and, by the
    number of arguments of build_attn, the position of each named argument."""
    text = read(up / "src" / "llama-graph.h")
    builders = {b: t for t, b in re.findall(r"(llm_graph_input_\w+)\s*\*\s*(build_\w+)\s*\([^)]*\)\s*const\s*;",
                                            text)}
    getters = {}
    for m in re.finditer(r"class (llm_graph_input_\w+)\s*:\s*public llm_graph_input_i\s*\{", text):
        k = m.end() - 1
        body = text[k:matching(text, k)]
        for t, g in re.findall(r"(llm_graph_input_\w+)\s*\*\s*(get_\w+)\s*\(\s*\)\s*const", body):
            getters[(m.group(1), g)] = t
    positions: dict[int, dict[str, int]] = {}
    for off, args in calls(text, "build_attn"):
        names = [re.findall(r"\w+", a)[-1] for a in args]
        positions[len(names)] = {n: i for i, n in enumerate(names)}
    for n, pos in positions.items():
        for key in ("kq_b", "sinks", "v_mla", "kq_scale"):
            if key not in pos:
                raise SourceError(f"llama-graph.h: build_attn with {n} parameters has no {key!r}")
    return builders, getters, positions


QUAL = re.compile(r"(?<![\w:])((?:llama_model|llm_build)_\w+)((?:<[^<>]*>)?(?:::[~\w]+(?:<[^<>]*>)?)*)")


def definitions(text: str) -> list[tuple[str, str, str]]:
    """(owner class, qualified name after it, text) of each top-level block of a source file; a block
    of no class (a static helper, a file-level alias) has owner ""."""
    out, i, last = [], 0, 0
    while True:
        k = text.find("{", i)
        if k < 0:
            break
        # a brace at the file's top level (nothing but whole blocks and statements since `last`)
        sig = text[last:k]
        stop = max(sig.rfind(";"), sig.rfind("}"))
        sig = sig[stop + 1:] if stop >= 0 else sig
        end = matching(text, k)
        m = QUAL.search(sig)
        out.append((m.group(1) if m else "", m.group(2) if m else "", sig + text[k:end]))
        i = last = end
    tail = text[last:]
    if tail.strip():
        out.append(("", "", tail))
    return out


def model_sources(up: Path) -> tuple[dict[str, list[tuple[str, str, str]]], dict[str, list[tuple[str, str]]]]:
    """{class: [(file, qualified name, text) of its definitions]} under src/models/ (a file's blocks of
    no class go to every class the file defines), and {class: [(class it builds on, prefix)]} from
    models.h: its parent model and the graph bases its graphs derive from (prefix "" for all of that
    class's definitions; ``graph<X>`` where it uses one instance of a templated graph)."""
    defs: dict[str, list[tuple[str, str, str]]] = {}
    for f in sorted((up / "src" / "models").glob("*.cpp")):
        blocks = definitions(read(f))
        owners = {o for o, _, _ in blocks if o}
        for o, q, t in blocks:
            for c in ([o] if o else sorted(owners)):
                defs.setdefault(c, []).append((f.name, q, t))
    hdr = read(up / "src" / "models" / "models.h")
    bases: dict[str, list[tuple[str, str]]] = {}
    for m in re.finditer(r"struct ((?:llama_model|llm_build)_\w+)\s*:\s*public (\w+)\s*\{", hdr):
        k = m.end() - 1
        body = hdr[k:matching(hdr, k)]
        deps = [] if m.group(2) in ("llama_model_base", "llm_graph_context") else [(m.group(2), "")]
        deps += [(d, "") for d in re.findall(r":\s*public ((?:llama_model|llm_build)_\w+?)(?:::\w+)?\s*\{", body)]
        deps += re.findall(r"using \w+\s*=\s*((?:llama_model|llm_build)_\w+?)::(\w+(?:<[^<>]*>)?)\s*;", body)
        deps = [(c, "" if "<" not in q else "::" + q.replace(" ", "")) for c, q in deps]
        bases[m.group(1)] = [d for d in dict.fromkeys(deps) if d[0] != m.group(1)]
    return defs, bases


def arch_text(cls: str, defs, bases) -> tuple[list[str], list[str]]:
    """The files and the text of a model class's definitions and of those it builds on."""
    seen, todo, parts = set(), [(cls, "")], []
    while todo:
        c, prefix = todo.pop(0)
        if (c, prefix) in seen:
            continue
        seen.add((c, prefix))
        parts += [(f, t) for f, q, t in defs.get(c, []) if not prefix or q.replace(" ", "").startswith(prefix)
                  or not q]
        todo += bases.get(c, [])
    files = list(dict.fromkeys(f for f, _ in parts))
    return files, [t for _, t in parts]


def model_features(defs: list[str]) -> set[str]:
    """The hparams features a model's loader sets (model level), from its definitions' texts."""
    text = "\n".join(defs)
    f = set()
    if re.search(r"attn_soft_cap\s*=\s*true", text):
        f.add("soft_cap")
    if re.search(r"f_max_alibi_bias\s*=\s*(?!0\.0f?\s*;)[^;=]", text):
        f.add("alibi")
    elif re.search(r"LLM_KV_ATTENTION_MAX_ALIBI_BIAS[^;]*,\s*false\s*\)", text):
        f.add("alibi_gguf")  # read from the GGUF, 0 (none) when absent
    elif "LLM_KV_ATTENTION_MAX_ALIBI_BIAS" in text:
        f.add("alibi")
    if re.search(r"\bf_attn_out_scale\s*=", text):
        f.add("out_scale_cap")  # the multiplier upstream's graph applies before Grok's cap
    if re.search(r"LLM_KV_ATTENTION_KEY_LENGTH_MLA|n_embd_head_k_mla_impl\s*=", text):
        f.add("mla")
    # sliding-window layers: "swa" when the loader always sets them, "swa_gguf" when only some GGUFs do
    # (every setting inside a branch of its function)
    depths = []
    for d in defs:
        for m in re.finditer(r"swa_type\s*=\s*LLAMA_SWA_TYPE_(?!NONE)|load_swa_pattern|set_swa_pattern", d):
            depths.append(d[:m.start()].count("{") - d[:m.start()].count("}"))
    if depths:
        f.add("swa" if min(depths) <= 1 else "swa_gguf")
    # K built of a no-position part and a shared RoPE part: head sizes unlike V's (MLA-style)
    if "mla" in f or "n_embd_head_qk_rope" in text:
        f.add("dk_ne_dv")
    return f


def graph_calls(text: str, builders, getters, positions) -> list[Call]:
    """The build_attn calls of a model's graph, each with its inputs and the tensors it passes."""
    var_inputs: dict[str, set[str]] = {}
    aliases = {a: set(re.findall(r"llm_graph_input_\w+", rhs)) for a, rhs in re.findall(r"using (\w+)\s*=([^;]+);", text)}
    for t, v in re.findall(r"(\w+)\s*\*\s*(\w+)\s*[,)=;]", text):
        types = {t} if t.startswith("llm_graph_input_") else aliases.get(t, set())
        if types:
            var_inputs.setdefault(v, set()).update(types)

    def got(var: str, getter: str) -> set[str]:
        return {getters[(t, getter)] for t in var_inputs.get(var, ()) if (t, getter) in getters}

    for stmt in re.split(r"[;{}]", text):
        m = re.search(r"(\w+)\s*=(?!=)", stmt)
        if not m:
            continue
        rhs = stmt[m.end():]
        made = {builders[b] for b in re.findall(r"\b(build_\w+)\s*\(", rhs) if b in builders}
        for v, g in re.findall(r"(\w+)\s*->\s*(get_\w+)\s*\(\s*\)", rhs):
            made |= got(v, g)
        if made:
            var_inputs.setdefault(m.group(1), set()).update(made)
    every = set().union(*var_inputs.values()) if var_inputs else set()
    out = []
    for _, args in calls(text, "build_attn"):
        pos = positions.get(len(args))
        if pos is None:
            raise SourceError(f"a build_attn call with {len(args)} arguments, which llama-graph.h does not "
                              f"declare: {args[:2]}")
        first = norm(args[0])
        g = re.fullmatch(r"(\w+)\s*->\s*(get_\w+)\s*\(\s*\)", first)
        inputs = got(g.group(1), g.group(2)) if g else set(var_inputs.get(re.sub(r"\W", "", first), ()))
        if not inputs:
            raise SourceError(f"a build_attn call whose attention input `{first}` this script cannot trace "
                              "to a build_attn_inp_* / build_inp_mem_* call or a declared type")
        feats = {k for k in ("kq_b", "sinks", "v_mla") if norm(args[pos[k]]) not in NULLS}
        if norm(args[pos["kq_scale"]]) not in ("1.0f", "1.0", "1"):
            feats.add("scaled")  # a logit scale other than 1
        optional = {k: t for k in feats & {"kq_b", "sinks", "v_mla"} if (t := optional_tensor(text, norm(args[pos[k]])))}
        out.append(Call(inputs, feats, optional))
    return out


def optional_tensor(text: str, expr: str) -> str:
    """The layer tensor an argument passes (``layer.attn_sinks``, or a local set from one) when the
    loader creates it TENSOR_NOT_REQUIRED (only some GGUFs have it); else ""."""
    m = re.fullmatch(r"[\w.\[\]>-]*\.(\w+)", expr)
    if not m and re.fullmatch(r"\w+", expr):
        a = re.search(r"\b" + expr + r"\s*=\s*[\w.\[\]>-]*\.(\w+)\s*;", text)
        m = a
    if not m:
        return ""
    made = re.search(r"\." + m.group(1) + r"\s*=\s*create_tensor\(([^;]*)\)\s*;", text)
    return m.group(1) if made and "TENSOR_NOT_REQUIRED" in made.group(1) else ""


def short_input(t: str) -> str:
    return t.replace("llm_graph_input_attn_", "").replace("llm_graph_input_", "").replace("_", "-")


# --------------------------------------------------------------------------------------------------
# the decision
# --------------------------------------------------------------------------------------------------

CACHE_INPUTS_EXCLUDED = ("llm_graph_input_attn_no_cache", "llm_graph_input_attn_cross")


def decide(a: Arch, rules: list[Rule], found: set[str], hooked: set[str]) -> None:
    """SparQ or the first cause that keeps the full-attention layers dense, in the order the fork
    checks: the memory (sparq_find_cache), the model's variants, each call's variants, the hook."""
    a.outcome, a.cause = "dense", ""
    if not (a.memory_classes & found):
        a.cause = "a memory SparQ finds no KV cache in (" + " or ".join(
            short_memory(m) for m in sorted(a.memory_classes)) + ")"
        return
    for r in rules:
        if r.scope != "model" or not r.applies(a.enum):
            continue
        if a.enum == r.feature if r.is_arch else r.feature in a.features:
            a.cause = r.phrase
            return
        if not r.is_arch and r.feature + "_gguf" in a.features:
            a.cause, a.note = r.phrase, GGUF_NOTES[r.feature]
            return
    cache_calls = [c for c in a.calls if c.inputs - set(CACHE_INPUTS_EXCLUDED)]
    if not cache_calls and a.direct_mha:
        # a memory SparQ finds, attended by the graph's own build_attn_mha call (glm5-next's indexed MLA)
        a.cause = "attention built past build_attn (build_attn_mha called directly: no SparQ hook)"
        return
    if not cache_calls:
        a.outcome = ""  # its graph attends over no KV cache: not a row
        return
    causes = []
    for c in cache_calls:
        feats = c.features | a.features
        if {"soft_cap", "scaled"} <= feats:
            feats = feats | {"soft_cap_scaled"}
        hit = next((r for r in rules if r.scope == "call" and r.applies(a.enum) and r.feature in feats), None)
        if hit:
            causes.append((hit.phrase, f"where the GGUF has `{c.optional[hit.feature]}`"
                           if hit.feature in c.optional else ""))
        elif not (c.inputs & hooked):
            causes.append(("attention through " + ", ".join(sorted(short_input(t) for t in c.inputs)) +
                           " (no SparQ hook)", ""))
        else:
            a.outcome = "sparq"
    if a.outcome == "dense":
        a.cause, a.note = causes[0]
    elif a.memory_classes - found:
        a.cause = "dense with " + ", ".join(short_memory(m) for m in sorted(a.memory_classes - found))


def short_memory(m: str) -> str:
    return m.replace("llama_kv_cache", "kv").replace("llama_memory_", "").replace("_", "-")


def analyse(root: Path = ROOT, up: Path | None = None) -> dict:
    up = up or upstream_tree(root)
    rules = refusal_rules(root)
    found = found_memories(root, up)
    hooked = hooked_inputs(up)
    builders, getters, positions = graph_api(up)
    defs, bases = model_sources(up)
    classes = arch_classes(up)
    archs = {}
    for enum, name in arch_names(up).items():
        if enum not in classes:
            continue  # a name with no model (llama-quantize's dummy)
        a = Arch(enum, name, classes[enum])
        a.files, texts = arch_text(a.cls, defs, bases)
        if not a.files:
            raise SourceError(f"{a.enum}: no source file under src/models/ defines {a.cls}'s members")
        a.features = model_features(texts)
        a.calls = graph_calls("\n".join(texts), builders, getters, positions)
        a.direct_mha = any(re.search(r"\bbuild_attn_mha\s*\(", t) for t in texts)
        archs[enum] = a
    memories(up, archs)
    proofs = proof_registry(root)
    for a in archs.values():
        if a.memory in ("none", "recurrent"):
            continue
        decide(a, rules, found, hooked)
        a.proof = proofs.get(a.name, "")
    unknown = set(proofs) - {a.name for a in archs.values() if a.outcome}
    if unknown:
        raise SourceError(f"dev/sparq_lab/arch_models.py PROOFS names {sorted(unknown)}, not architectures "
                          "of the pin with a KV cache")
    return dict(archs=archs, rules=rules, found=found, hooked=hooked, types=cache_types(root),
                commit=pin_commit(root))


# --------------------------------------------------------------------------------------------------
# inputs: the tree, the pin, the proofs
# --------------------------------------------------------------------------------------------------

def _load_script(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def upstream_tree(root: Path = ROOT) -> Path:
    up = _load_script("sparq_upstream", root / "scripts" / "upstream.py").tree_path(root)
    if not (up / "src" / "llama-model.cpp").is_file():
        raise SourceError(f"{up}: no prepared upstream tree: run `make upstream` (or `make install`) first")
    return up


def pin_commit(root: Path = ROOT) -> str:
    return _load_script("sparq_upstream", root / "scripts" / "upstream.py").read_pin(root / "upstream.pin")[
        "llama_cpp_commit"]


def proof_registry(root: Path = ROOT) -> dict[str, str]:
    """{architecture name: generator} of dev/sparq_lab/arch_models.py's PROOFS, read as text (no import:
    the generators need the package, the table does not)."""
    src = root / "dev" / "sparq_lab" / "arch_models.py"
    text = read(src)
    m = re.search(r"^PROOFS\s*=\s*\{", text, re.M)
    if not m:
        raise SourceError(f"{src}: no PROOFS = {{...}}")
    k = m.end() - 1
    return dict(re.findall(r"\"([\w.-]+)\"\s*:\s*(\w+)", text[k:matching(text, k)]))


# --------------------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------------------

def render(res: dict) -> str:
    archs = sorted(res["archs"].values(), key=lambda a: a.name)
    rows = [a for a in archs if a.outcome]
    sparq = [a for a in rows if a.outcome == "sparq"]
    dense = [a for a in rows if a.outcome == "dense"]
    by_cause: dict[str, list[str]] = {}
    for a in dense:
        by_cause.setdefault(a.cause, []).append(a.name)
    none = [a.name for a in archs if a.memory == "none"]
    recurrent = [a.name for a in archs if a.memory == "recurrent"]
    no_attn = [a.name for a in archs if a.memory not in ("none", "recurrent") and not a.outcome]
    L = [
        "# Coverage: SparQ on the pinned llama.cpp's architectures",
        "",
        f"Generated by `scripts/coverage_table.py` from llama.cpp `{res['commit'][:12]}` (the pin) and this "
        "fork's source: for each architecture whose layers attend over a KV cache, whether decode runs "
        "SparQ on its full-attention layers, if not why, and the tiny GGUF that proves it. Do not edit "
        "(`tests/test_coverage_table.py` fails when it is stale).",
        "",
        "- [Summary](#summary)",
        "- [Architectures](#architectures)",
        "",
        "How a row is decided, in the order the fork checks:",
        "",
        "1. the architecture's memory (`create_memory`) must hold a KV cache SparQ finds (`sparq_find_cache`: "
        + ", ".join(f"`{c}`" for c in sorted(res["found"])) + ");",
        "2. the refusals of `sparq_attn_variant` (`ggml-sparq/llama/llama-sparq-buffers.cpp`), in order, against "
        "the hparams the architecture's loader sets and the tensors its graph passes to `build_attn`:",
    ]
    for r in res["rules"]:
        what = f"architecture `{r.feature}`" if r.is_arch else f"`{r.condition}`"
        L.append(f"   - {what}: {r.phrase}")
    L += [
        "3. the call's attention input must be one whose `build_attn` has SparQ's hook (" +
        ", ".join(f"`{short_input(t)}`" for t in sorted(res["hooked"])) + ").",
        "",
        "\"decode\" is the full-attention layers' (sliding-window layers run dense by design). K/V head sizes "
        "come from the GGUF; the table counts them unlike only where the graph builds K from a no-position "
        "part and a shared RoPE part (MLA-style). Cache types the op reads (`ggml_sparq_cache_type_ok`): "
        + ", ".join(t.lower() for t in res["types"]) + "; other types run dense with the `cache_type` reason "
        "on every architecture.",
        "",
        "## Summary",
        "",
        f"{len(rows)} architectures attend over a KV cache: **{len(sparq)} run SparQ** on their full-attention "
        f"layers, **{len(dense)} run dense**.",
        "",
        "| decode | count | architectures |",
        "| --- | --- | --- |",
        f"| SparQ | {len(sparq)} | (the table below) |",
    ]
    for cause, names in sorted(by_cause.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        L.append(f"| dense: {cause} | {len(names)} | {', '.join(names)} |")
    L += [
        "",
        f"Not in the table: no KV cache ({len(none)}: encoders, diffusion models): {', '.join(none)}. "
        f"Recurrent only ({len(recurrent)}): {', '.join(recurrent)}. "
        f"No attention over a KV cache in the graph ({len(no_attn)}): {', '.join(no_attn)}.",
        "",
        "## Architectures",
        "",
        "Proof: the tiny random GGUF (`dev/sparq_lab/arch_models.py`, `PROOFS`) that "
        "`tests/test_coverage_table.py` decodes with SparQ on, checking the counters against the row.",
        "",
        "| architecture | graph | memory | attention | decode | proof |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for a in rows:
        inputs = sorted({short_input(t) for c in a.calls for t in c.inputs})
        feats = sorted({FEATURE_LABELS[f] for f in a.features | {f for c in a.calls for f in c.features}
                    if f != "scaled"})  # (a logit scale other than 1 matters only beside a soft-cap)
        attn = ", ".join(inputs) + ("; " + ", ".join(feats) if feats else "")
        decode = (("SparQ" + (f" ({a.cause})" if a.cause else "")) if a.outcome == "sparq" else
                  "dense: " + a.cause + (f" ({a.note})" if a.note else ""))
        graph = ", ".join(f.removesuffix(".cpp") for f in a.files)
        memory = " or ".join(short_memory(m) for m in sorted(a.memory_classes))
        L.append(f"| {a.name} | {graph} | {memory} | {attn} | {decode} | {f'`{a.proof}`' if a.proof else ''} |")
    return "\n".join(L) + "\n"


def rows_json(res: dict) -> list[dict]:
    return [dict(name=a.name, enum=a.enum, memory=a.memory, outcome=a.outcome, cause=a.cause, proof=a.proof,
                 features=sorted(a.features), calls=[dict(inputs=sorted(c.inputs), features=sorted(c.features))
                                                     for c in a.calls])
            for a in sorted(res["archs"].values(), key=lambda a: a.name)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed table differs from a fresh one")
    ap.add_argument("--json", action="store_true", help="print every architecture's analysis as JSON")
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    try:
        res = analyse()
    except SourceError as e:
        print(f"coverage_table: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows_json(res), indent=1))
        return 0
    text = render(res)
    if args.check:
        old = args.out.read_text() if args.out.exists() else ""
        if old != text:
            print(f"{args.out}: stale; regenerate with `python scripts/coverage_table.py`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
