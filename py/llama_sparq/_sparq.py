"""ctypes bindings of the fork's SparQ C API (ggml-sparq/include/llama-sparq.h)."""

from __future__ import annotations

import ctypes

from ._lib import lib_path

DENSE_REASONS = ("prefill", "short", "swa", "cache_type", "v_trans", "shared_stream", "attn_variant", "no_cache")
SELECTORS = ("sparq", "oracle")        # enum llama_sparq_selector
GQA_MODES = ("shared", "per_head")     # enum llama_sparq_gqa
BASES = ("model", "scaled", "pca")     # enum llama_sparq_basis


class llama_sparq_params(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("enabled", ctypes.c_bool),
        ("r", ctypes.c_int32),
        ("k", ctypes.c_int32),
        ("l", ctypes.c_int32),
        ("min_kv", ctypes.c_int32),
        ("all_rows", ctypes.c_bool),
        ("selector", ctypes.c_int32),
        ("gqa", ctypes.c_int32),
        ("mean_v", ctypes.c_bool),
        ("basis", ctypes.c_int32),
    ]


class llama_sparq_stats(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("n_sparq", ctypes.c_uint64),
        ("n_dense", ctypes.c_uint64 * len(DENSE_REASONS)),
        ("compression", ctypes.c_double),
        ("n_rebuilds", ctypes.c_uint64),
        ("extra_bytes", ctypes.c_uint64),
        ("kv_bytes", ctypes.c_uint64),
        ("n_layers", ctypes.c_int32),
        ("n_sparq_device", ctypes.c_uint64),
    ]


_lib = None


def lib():
    global _lib
    if _lib is None:
        L = ctypes.CDLL(str(lib_path()))
        L.llama_sparq_default_params.restype = llama_sparq_params
        L.llama_sparq_default_params.argtypes = []
        L.llama_sparq_set_params.restype = ctypes.c_int32
        L.llama_sparq_set_params.argtypes = [ctypes.c_void_p, ctypes.POINTER(llama_sparq_params),
                                             ctypes.c_char_p, ctypes.c_size_t]
        L.llama_sparq_get_params.restype = ctypes.c_int32
        L.llama_sparq_get_params.argtypes = [ctypes.c_void_p, ctypes.POINTER(llama_sparq_params)]
        L.llama_sparq_get_stats.restype = ctypes.c_int32
        L.llama_sparq_get_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(llama_sparq_stats)]
        L.llama_sparq_reset_stats.restype = None
        L.llama_sparq_reset_stats.argtypes = [ctypes.c_void_p]
        _lib = L
    return _lib


def _to_dict(p) -> dict:
    return {"enabled": bool(p.enabled), "r": p.r, "k": p.k, "l": p.l, "min_kv": p.min_kv, "all_rows": bool(p.all_rows),
            "selector": SELECTORS[p.selector] if 0 <= p.selector < len(SELECTORS) else p.selector,
            "gqa": GQA_MODES[p.gqa] if 0 <= p.gqa < len(GQA_MODES) else p.gqa, "mean_v": bool(p.mean_v),
            "basis": BASES[p.basis] if 0 <= p.basis < len(BASES) else p.basis}


def _enum(name, value, names):
    if isinstance(value, str):
        if value not in names:
            raise ValueError(f"{name} = {value!r} is unknown: allowed {', '.join(repr(n) for n in names)}")
        return names.index(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be one of {', '.join(repr(n) for n in names)}, got {value!r}")
    return value  # the library checks the range


def default_params() -> dict:
    return _to_dict(lib().llama_sparq_default_params())


def set_params(ctx, *, enabled: bool, r: int, k: int, l: int, min_kv: int, all_rows: bool,
               selector="sparq", gqa="shared", mean_v: bool = True, basis="model") -> None:
    """Apply settings to a llama_context pointer; ValueError naming the parameter on bad values."""
    p = lib().llama_sparq_default_params()
    p.enabled, p.r, p.k, p.l, p.min_kv, p.all_rows = enabled, r, k, l, min_kv, all_rows
    p.selector = _enum("selector", selector, SELECTORS)
    p.gqa = _enum("gqa", gqa, GQA_MODES)
    p.basis = _enum("basis", basis, BASES)
    if not isinstance(mean_v, bool):
        raise ValueError(f"mean_v must be True or False, got {mean_v!r}")
    p.mean_v = mean_v
    err = ctypes.create_string_buffer(512)
    rc = lib().llama_sparq_set_params(ctx, ctypes.byref(p), err, len(err))
    if rc == -1:
        raise ValueError(err.value.decode())
    if rc != 0:
        raise RuntimeError(err.value.decode() or f"llama_sparq_set_params failed ({rc})")


def get_params(ctx) -> dict:
    p = llama_sparq_params()
    p.size = ctypes.sizeof(p)
    if lib().llama_sparq_get_params(ctx, ctypes.byref(p)) != 0:
        raise RuntimeError("llama_sparq_get_params: struct size mismatch between Python and the library")
    return _to_dict(p)


def get_stats(ctx) -> dict:
    s = llama_sparq_stats()
    s.size = ctypes.sizeof(s)
    if lib().llama_sparq_get_stats(ctx, ctypes.byref(s)) != 0:
        raise RuntimeError("llama_sparq_get_stats: struct size mismatch between Python and the library")
    return {
        "n_sparq": s.n_sparq,
        "n_dense": {name: s.n_dense[i] for i, name in enumerate(DENSE_REASONS)},
        "compression": s.compression,
        "n_rebuilds": s.n_rebuilds,
        "extra_bytes": s.extra_bytes,
        "kv_bytes": s.kv_bytes,
        "n_layers": s.n_layers,
        "n_sparq_device": s.n_sparq_device,
    }


def reset_stats(ctx) -> None:
    lib().llama_sparq_reset_stats(ctx)


def sync(ctx) -> None:
    """Bring K^T and the V sums up to date now (llama_sparq_sync): pending cache updates
    (the deferred K-shift, stream copies) first, then a rebuild of every changed stream."""
    L = lib()
    L.llama_sparq_sync.restype = None
    L.llama_sparq_sync.argtypes = [ctypes.c_void_p]
    L.llama_sparq_sync(ctx)


def debug_check(ctx, sync_first: bool = False) -> float:
    """Largest difference between SparQ's K^T / V sums and a recomputation over the current
    streams (llama_sparq_debug_check); -1.0 when SparQ has no data."""
    if sync_first:
        sync(ctx)
    L = lib()
    L.llama_sparq_debug_check.restype = ctypes.c_double
    L.llama_sparq_debug_check.argtypes = [ctypes.c_void_p]
    return float(L.llama_sparq_debug_check(ctx))


def bench_fill(ctx, n_tokens: int, seed: int = 1) -> None:
    """For benchmarks: fill sequence 0 of an empty KV cache with n_tokens cells of random K
    and V (llama_sparq_bench_fill); raises ValueError with the library's reason."""
    L = lib()
    L.llama_sparq_bench_fill.restype = ctypes.c_int32
    L.llama_sparq_bench_fill.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32, ctypes.c_char_p,
                                         ctypes.c_size_t]
    err = ctypes.create_string_buffer(512)
    if L.llama_sparq_bench_fill(ctx, int(n_tokens), int(seed), err, len(err)) != 0:
        raise ValueError(err.value.decode("utf-8", "replace"))
