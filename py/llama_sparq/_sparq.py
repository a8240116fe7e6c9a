"""The fork's SparQ C API (``ggml-sparq/include/llama-sparq.h``) for the package.

Everything goes through the cffi bindings (``llama_sparq.bindings``, bound from the header):
the params and stats structs, their fields and types, the names of the enums' values
(``DENSE_REASONS``, ``SELECTORS``, ``GQA_MODES``, ``BASES`` are read from the library's
``llama_sparq_*_name`` functions) and the validation of the settings, which
``llama_sparq_set_params`` does once for every front end: its message is raised here as a
``ValueError``. Python only parses (a setting's type; a name among the C API's names).

Settings are keyed by the struct's field names (``enabled``, ``r``, ``k``, ...); the
``Llama`` class adds its ``sparq`` / ``sparq_<field>`` keyword names on top.
"""

from __future__ import annotations

import operator

from ._lib import library

_ENUMS = {"DENSE_REASONS": "dense_reason", "SELECTORS": "selector", "GQA_MODES": "gqa", "BASES": "basis"}
_names: dict = {}
_fields: dict = {}


def _b():
    from . import bindings

    return bindings


def names(enum: str) -> tuple:
    """The C API's names of an enum's values: "selector", "gqa", "basis" or "dense_reason"."""
    if enum not in _names:
        _names[enum] = _b().enum_names(library(), enum)
    return _names[enum]


def __getattr__(name):
    if name in _ENUMS:
        return names(_ENUMS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fields() -> dict:
    """The settings of struct llama_sparq_params (header order): field -> "bool" | "int" | "float" | "enum"."""
    if not _fields:
        _fields.update(_b().params_fields(library()))
    return dict(_fields)


def _to_dict(p) -> dict:
    out = {}
    for f, kind in fields().items():
        v = getattr(p, f)
        if kind == "bool":
            v = bool(v)
        elif kind == "float":
            v = round(float(v), 6)  # the C float's value as the decimal it was set from
        elif kind == "enum":
            n = names(f)
            v = n[v] if 0 <= v < len(n) else int(v)
        out[f] = v
    return out


def make_params(settings: dict, label=lambda f: f):
    """A ``struct llama_sparq_params *`` holding the defaults updated with ``settings``.

    Parsing only (``ValueError`` naming ``label(field)``): bools must be bools, numbers integers
    that fit the field (a float field: any real number), enum values one of the C API's names (or an integer, which the library
    checks). The ranges are checked by ``llama_sparq_set_params``."""
    b, lib = _b(), library()
    kinds = fields()
    unknown = [f for f in settings if f not in kinds]
    if unknown:
        raise ValueError(f"unknown SparQ setting(s) {', '.join(label(f) for f in unknown)}: allowed "
                         f"{', '.join(label(f) for f in kinds)}")
    p = b.ffi.new("struct llama_sparq_params *")
    p[0] = lib.llama_sparq_default_params()
    for f, v in settings.items():
        kind, name = kinds[f], label(f)
        if kind == "bool":
            if not isinstance(v, bool):
                raise ValueError(f"{name} must be True or False, got {v!r}")
        elif kind == "float":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{name} must be a number, got {v!r}")
            v = float(v)
        elif kind == "enum" and isinstance(v, str):
            allowed = names(f)
            if v not in allowed:
                raise ValueError(f"{name} = {v!r} is unknown: allowed {', '.join(repr(n) for n in allowed)}")
            v = allowed.index(v)
        else:
            try:
                if isinstance(v, bool):
                    raise TypeError
                v = operator.index(v)
            except TypeError:
                what = f"one of {', '.join(repr(n) for n in names(f))}" if kind == "enum" else "an integer"
                raise ValueError(f"{name} must be {what}, got {v!r}") from None
        try:
            setattr(p, f, v)
        except OverflowError:
            raise ValueError(f"{name} = {v} does not fit the C field (int32_t)") from None
    return p


def default_params() -> dict:
    return _to_dict(library().llama_sparq_default_params())


# The K/V cache types SparQ runs on, by ggml's type id (llama-cpp-python's ``type_k`` / ``type_v``)
CACHE_TYPE_IDS = {"f16": 1, "f32": 0, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "iq4_nl": 20}


def cache_type_id(name) -> int:
    """ggml's type id of a K/V cache type SparQ runs on (llama-cpp-python's ``type_k`` / ``type_v``)."""
    if name not in CACHE_TYPE_IDS:
        raise ValueError(f"cache type must be one of {', '.join(CACHE_TYPE_IDS)}, got {name!r}")
    return CACHE_TYPE_IDS[name]


def default_r(d, kt_bits) -> int:
    """r when it is not given (sparq_r = 0), as the fork resolves it (``sparq_default_r``) for K^T
    of ``kt_bits`` (the fork's default 4): 3 d / 8 (rounded) with a 4-bit K^T, which kept e5m2's recall at
    5 d / 16 for 3/4 of its bytes, 5 d / 16 (rounded) with an 8-bit one, which kept the approximate
    top-k's recall of f16 at d / 4 for 5/8 of its bytes, d / 4 with a 16-bit one."""
    if isinstance(d, bool) or not hasattr(d, "__index__") or operator.index(d) < 1:
        raise ValueError(f"d must be an integer >= 1, got {d!r}")
    if kt_bits not in (4, 8, 16) or isinstance(kt_bits, bool):
        raise ValueError(f"kt_bits must be 4, 8 (e5m2) or 16, got {kt_bits!r}")
    d = operator.index(d)
    return max(1, (5 * d + 8) // 16 if kt_bits == 8 else (3 * d + 4) // 8 if kt_bits == 4 else d // 4)


def check_params(settings, head_size: int = 0, label=lambda f: f) -> None:
    """Check settings (a dict by field, or a ``make_params`` result) without a context, as
    ``llama_sparq_set_params`` will (``llama_sparq_check_params``: the same messages, raised as
    ``ValueError``); ``head_size`` > 0 bounds r, else r waits for the context."""
    b, lib = _b(), library()
    p = make_params(settings, label) if isinstance(settings, dict) else settings
    err = b.ffi.new("char[]", 512)
    if lib.llama_sparq_check_params(p, int(head_size), err, len(err)) != 0:
        raise ValueError(b.ffi.string(err).decode("utf-8", "replace"))


def set_params(ctx, settings=None, label=lambda f: f, **kw) -> None:
    """Apply settings (a dict or keywords, by field; the others keep their defaults, or a
    ``make_params`` result) to a llama_context pointer. The library validates: ``ValueError``
    with its message (naming the parameter and what is allowed) on a bad value,
    ``RuntimeError`` when the context cannot run SparQ."""
    b, lib = _b(), library()
    if settings is None or isinstance(settings, dict):
        p = make_params({**(settings or {}), **kw}, label)
    else:
        p = settings
    err = b.ffi.new("char[]", 512)
    rc = lib.llama_sparq_set_params(b.ctx_ptr(ctx), p, err, len(err))
    msg = b.ffi.string(err).decode("utf-8", "replace")
    if rc == -1:
        raise ValueError(msg)
    if rc != 0:
        raise RuntimeError(msg or f"llama_sparq_set_params failed ({rc})")


def get_params(ctx) -> dict:
    b = _b()
    p = b.ffi.new("struct llama_sparq_params *")
    p.size = b.ffi.sizeof("struct llama_sparq_params")
    if library().llama_sparq_get_params(b.ctx_ptr(ctx), p) != 0:
        raise RuntimeError("llama_sparq_get_params refused the struct (size mismatch between header and library)")
    return _to_dict(p)


def get_stats(ctx) -> dict:
    """The counters, one entry per field of struct llama_sparq_stats; n_dense by reason name."""
    b = _b()
    s = b.ffi.new("struct llama_sparq_stats *")
    s.size = b.ffi.sizeof("struct llama_sparq_stats")
    if library().llama_sparq_get_stats(b.ctx_ptr(ctx), s) != 0:
        raise RuntimeError("llama_sparq_get_stats refused the struct (size mismatch between header and library)")
    out = {}
    for f, _ in b.ffi.typeof("struct llama_sparq_stats").fields:
        if f == "size":
            continue
        v = getattr(s, f)
        if f == "n_dense":
            reasons = names("dense_reason")
            if len(v) != len(reasons):
                raise RuntimeError(f"llama_sparq_stats.n_dense has {len(v)} entries, the library names {len(reasons)}")
            v = {r: int(v[i]) for i, r in enumerate(reasons)}
        out[f] = v
    return out


def get_layer_stats(ctx) -> list:
    """llama_sparq_get_layer_stats for every layer with SparQ data: one dict per layer."""
    b, lib = _b(), library()
    out = []
    n = get_stats(ctx)["n_layers"]
    for i in range(n):
        s = b.ffi.new("struct llama_sparq_layer_stats *")
        s.size = b.ffi.sizeof("struct llama_sparq_layer_stats")
        if lib.llama_sparq_get_layer_stats(b.ctx_ptr(ctx), i, s) != 0:
            raise RuntimeError(f"llama_sparq_get_layer_stats refused layer {i} (size mismatch or out of range)")
        out.append({f: getattr(s, f) for f, _ in b.ffi.typeof("struct llama_sparq_layer_stats").fields if f != "size"})
    return out


def reset_stats(ctx) -> None:
    library().llama_sparq_reset_stats(_b().ctx_ptr(ctx))


def sync(ctx) -> None:
    """Bring K^T and the V sums up to date now (llama_sparq_sync): pending cache updates
    (the deferred K-shift, stream copies) first, then a rebuild of every changed stream."""
    library().llama_sparq_sync(_b().ctx_ptr(ctx))


def debug_check(ctx, sync_first: bool = False) -> float:
    """Largest difference between SparQ's K^T / V sums and a recomputation over the current
    streams (llama_sparq_debug_check); -1.0 when SparQ has no data."""
    if sync_first:
        sync(ctx)
    return float(library().llama_sparq_debug_check(_b().ctx_ptr(ctx)))


def debug_graph_rebuild(ctx, on: bool = True) -> None:
    """For tests without a GPU: a cache in host memory rebuilt by the ggml graph that rebuilds a
    device's cache, on the CPU backend (llama_sparq_debug_graph_rebuild); SparQ must have been on."""
    if library().llama_sparq_debug_graph_rebuild(_b().ctx_ptr(ctx), bool(on)) != 0:
        raise RuntimeError("llama_sparq_debug_graph_rebuild: SparQ was never enabled on this context")


def debug_graph_io(ctx) -> dict:
    """What one computation of the context's last graph moves between the host and a device
    (llama_sparq_debug_graph_io): its inputs, nodes and SparQ's own transfers so far."""
    b = _b()
    s = b.ffi.new("struct llama_sparq_graph_io *")
    s.size = b.ffi.sizeof("struct llama_sparq_graph_io")
    rc = library().llama_sparq_debug_graph_io(b.ctx_ptr(ctx), s)
    if rc != 0:
        raise RuntimeError(f"llama_sparq_debug_graph_io returned {rc} (-1: size mismatch, -2: no graph computed yet)")
    return {f: int(getattr(s, f)) for f, _ in b.ffi.typeof("struct llama_sparq_graph_io").fields if f != "size"}


def debug_op_params(ctx, il: int, n_kv: int, measure: bool = False) -> list[int]:
    """The op's parameters (op_params' int32 slots) the settings' check builds for model layer il at a
    decode step over n_kv cells (llama_sparq_debug_op_params): the graph's road to its nodes."""
    b = _b()
    out = b.ffi.new("int32_t[16]")
    rc = library().llama_sparq_debug_op_params(b.ctx_ptr(ctx), int(il), int(n_kv), bool(measure), out)
    if rc != 0:
        raise RuntimeError(f"llama_sparq_debug_op_params returned {rc} (-1: SparQ off or no SparQ data in layer {il}, "
                           "-2: no valid node)")
    return list(out)


def bench_fill(ctx, n_tokens: int, seed: int = 1) -> None:
    """For benchmarks: fill sequence 0 of an empty KV cache with n_tokens cells of random K
    and V (llama_sparq_bench_fill); raises ValueError with the library's reason."""
    b = _b()
    err = b.ffi.new("char[]", 512)
    if library().llama_sparq_bench_fill(b.ctx_ptr(ctx), int(n_tokens), int(seed), err, len(err)) != 0:
        raise ValueError(b.ffi.string(err).decode("utf-8", "replace"))


def set_eval_callback(ctx, callback_address: int | None, user_data=None) -> None:
    """llama_sparq_debug_set_eval_callback with a C function pointer given by its address
    (a ctypes CFUNCTYPE cast to an int, say); None removes the callback."""
    b = _b()
    cb = b.ffi.cast("ggml_backend_sched_eval_callback", callback_address or 0)
    library().llama_sparq_debug_set_eval_callback(b.ctx_ptr(ctx), cb, b.ffi.NULL if user_data is None else user_data)


def rpc_model_devices(servers):
    """The devices (their addresses, for llama_model_params.devices) of a model that offloads to
    ggml RPC servers, ``"host:port,host:port"`` or a list of them, besides the
    devices llama.cpp takes by default (llama_rpc_model_devices). Each endpoint is parsed and
    connected to first, since ggml's RPC backend aborts the process on a bad endpoint or an
    unreachable server; raises ValueError naming the endpoint."""
    import socket

    if isinstance(servers, str):
        items = [x.strip() for x in servers.split(",")]
    elif isinstance(servers, (list, tuple)) and all(isinstance(x, str) for x in servers):
        items = [x.strip() for x in servers]
    else:
        raise ValueError(f"rpc_servers: expected 'host:port[,host:port...]' or a list of them, got {servers!r}")
    if not items or any(not x for x in items):
        raise ValueError(f"rpc_servers: an empty endpoint in {servers!r} (give host:port[,host:port...])")
    for ep in items:
        host, sep, port = ep.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"rpc_servers: {ep!r} is not host:port (a port 1..65535)")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except OSError as e:
            raise ValueError(f"rpc_servers: cannot connect to {ep}: {e} (is ggml-rpc-server "
                             f"(llama-sparq-rpc-server) running there?)") from None
    b = _b()
    names = [b.ffi.new("char[]", ep.encode()) for ep in items]  # alive through the call
    cap = 256
    out = b.ffi.new("void *[]", cap)
    err = b.ffi.new("char[]", 512)
    n = library().llama_rpc_model_devices(b.ffi.new("const char *[]", names), len(names), out, cap, err, len(err))
    if n < 0:
        raise ValueError(b.ffi.string(err).decode("utf-8", "replace"))
    return [int(b.ffi.cast("uintptr_t", out[i])) for i in range(n)]
