"""``Llama``: llama-cpp-python's class on the fork's library."""

from __future__ import annotations

import os

from ._lib import setup_llama_cpp

setup_llama_cpp()

import llama_cpp  # noqa: E402  (after LLAMA_CPP_LIB_PATH is set)

GGUF_MAGIC = b"GGUF"


def check_model_file(model_path) -> str:
    """Raise a clear error naming the path unless it is a readable GGUF file."""
    path = os.fspath(model_path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    if not os.path.isfile(path):
        raise ValueError(f"model path is not a file: {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ValueError(f"cannot read model file {path}: {e}") from e
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF model file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    return path


def _check_int(name, value, lo, hi=None, extra=""):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} = {value} is out of range: allowed {rng}{extra}")


class Llama(llama_cpp.Llama):
    """llama-cpp-python's ``Llama`` (same methods and arguments) on the fork's libllama.

    SparQ keyword arguments (applied after the context exists; any of them switches SparQ on):

    - ``sparq``: True for SparQ with the defaults (r = head size / 4, k = 128, l = k / 4, the scaled basis)
    - ``sparq_r``: query components kept, 1..head size (0: head size / 4)
    - ``sparq_k``: positions attended, >= 1
    - ``sparq_l``: local window, 0..k (-1: k / 4)
    - ``sparq_min_kv``: decoding stays dense while the sequence holds fewer KV cells, >= 0 (default 1024)
    - ``sparq_all_rows``: apply SparQ to every query row (teacher-forced evaluation)
    - ``sparq_selector``: ``"sparq"`` (default) or ``"oracle"`` (exact top-k, an accuracy baseline)
    - ``sparq_gqa``: ``"shared"`` (one choice per KV head, the paper) or ``"per_head"`` (each
      query head chooses k - l cells, the group attends over their union)
    - ``sparq_mean_v``: mean-value reallocation on (default) or off
    - ``sparq_basis``: how step 1 ranks components: ``"model"`` (|q| over the keys' own
      components, the paper), ``"scaled"`` (|q| times the keys' RMS per component; the
      default) or ``"pca"``
      (the keys' principal axes per layer and KV head, ranked likewise); both calibrated on
      the cache's keys at the first SparQ step

    SparQ contexts always use the flash-attention KV layout (V not transposed), whatever
    ``flash_attn`` says. ``sparq_stats()`` returns the fork's counters.
    """

    _SPARQ_KEYS = ("sparq", "sparq_r", "sparq_k", "sparq_l", "sparq_min_kv", "sparq_all_rows", "sparq_selector",
                   "sparq_gqa", "sparq_mean_v", "sparq_basis")

    def __init__(self, model_path: str, *args, sparq=None, sparq_r=None, sparq_k=None, sparq_l=None,
                 sparq_min_kv=None, sparq_all_rows=None, sparq_selector=None, sparq_gqa=None, sparq_mean_v=None,
                 sparq_basis=None, **kwargs):
        path = check_model_file(model_path)
        from . import _sparq

        d = _sparq.default_params()
        given = {"sparq_r": sparq_r, "sparq_k": sparq_k, "sparq_l": sparq_l, "sparq_min_kv": sparq_min_kv,
                 "sparq_all_rows": sparq_all_rows, "sparq_selector": sparq_selector, "sparq_gqa": sparq_gqa,
                 "sparq_mean_v": sparq_mean_v, "sparq_basis": sparq_basis}
        if sparq is not None and not isinstance(sparq, bool):
            raise ValueError(f"sparq must be True or False, got {sparq!r}")
        enabled = bool(sparq) if sparq is not None else any(v is not None for v in given.values())
        settings = {
            "enabled": enabled,
            "r": d["r"] if sparq_r is None else sparq_r,
            "k": d["k"] if sparq_k is None else sparq_k,
            "l": d["l"] if sparq_l is None else sparq_l,
            "min_kv": d["min_kv"] if sparq_min_kv is None else sparq_min_kv,
            "all_rows": d["all_rows"] if sparq_all_rows is None else sparq_all_rows,
            "selector": d["selector"] if sparq_selector is None else sparq_selector,
            "gqa": d["gqa"] if sparq_gqa is None else sparq_gqa,
            "mean_v": d["mean_v"] if sparq_mean_v is None else sparq_mean_v,
            "basis": d["basis"] if sparq_basis is None else sparq_basis,
        }
        # checks that need no model (the head-size bound of r is checked by the library)
        _check_int("sparq_r", settings["r"], 0, None, " (0: head size / 4; at most the head size)")
        _check_int("sparq_k", settings["k"], 1)
        _check_int("sparq_l", settings["l"], -1, settings["k"], " (-1: k / 4)")
        _check_int("sparq_min_kv", settings["min_kv"], 0)
        if not isinstance(settings["all_rows"], bool):
            raise ValueError(f"sparq_all_rows must be True or False, got {settings['all_rows']!r}")
        if not isinstance(settings["mean_v"], bool):
            raise ValueError(f"sparq_mean_v must be True or False, got {settings['mean_v']!r}")
        for key, names in (("selector", _sparq.SELECTORS), ("gqa", _sparq.GQA_MODES), ("basis", _sparq.BASES)):
            if settings[key] not in names:
                raise ValueError(f"sparq_{key} = {settings[key]!r} is unknown: allowed "
                                 f"{', '.join(repr(n) for n in names)}")
        if enabled:
            kwargs["flash_attn"] = True  # SparQ needs V rows: the flash-attention cache layout
        self._sparq_settings = settings
        try:
            super().__init__(path, *args, **kwargs)
        except ValueError as e:
            # llama.cpp could not parse the file (truncated or corrupt)
            if path not in str(e):
                raise ValueError(f"{path}: {e}") from e
            raise
        if enabled:
            try:
                _sparq.set_params(self._ctx.ctx, **settings)
            except Exception:
                self.close()
                raise

    def sparq_params(self) -> dict:
        from . import _sparq

        return _sparq.get_params(self._ctx.ctx)

    def set_sparq(self, **settings) -> None:
        """Change SparQ settings on the live context (keys as in sparq_params())."""
        from . import _sparq

        cur = _sparq.get_params(self._ctx.ctx)
        unknown = set(settings) - set(cur)
        if unknown:
            raise ValueError(f"unknown SparQ setting(s) {sorted(unknown)}; allowed: {sorted(cur)}")
        cur.update(settings)
        if cur["enabled"] and self.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED:
            raise ValueError("SparQ needs the flash-attention KV layout: make the Llama with flash_attn=True or sparq=True")
        _sparq.set_params(self._ctx.ctx, **cur)
        self._sparq_settings = cur

    def sparq_stats(self) -> dict:
        """Counters: attention calls run with SparQ, dense calls by reason, mean compression, ..."""
        from . import _sparq

        return _sparq.get_stats(self._ctx.ctx)

    def reset_sparq_stats(self) -> None:
        from . import _sparq

        _sparq.reset_stats(self._ctx.ctx)

    def sparq_sync(self) -> None:
        """Bring SparQ's K^T and V sums up to date now instead of at the next decode step
        (after a state load, say); applies pending KV-cache updates (the K-shift) first."""
        from . import _sparq

        _sparq.sync(self._ctx.ctx)

    def sparq_debug_check(self, sync: bool = False) -> float:
        """For diagnosis: the largest absolute difference between SparQ's K^T / V sums and a
        recomputation from the KV cache, over the streams whose data is current (with
        ``sync=True`` everything is brought up to date first, so every stream is compared).
        About 1e-3 or less is rounding; -1.0 when SparQ was never enabled on this context."""
        from . import _sparq

        return _sparq.debug_check(self._ctx.ctx, sync_first=sync)

    def __getstate__(self):
        state = super().__getstate__()
        s = self._sparq_settings
        state.update(sparq=s["enabled"], sparq_r=s["r"], sparq_k=s["k"], sparq_l=s["l"],
                     sparq_min_kv=s["min_kv"], sparq_all_rows=s["all_rows"], sparq_selector=s["selector"],
                     sparq_gqa=s["gqa"], sparq_mean_v=s["mean_v"], sparq_basis=s["basis"])
        return state

    def close(self) -> None:
        # also called from __del__ when __init__ failed before llama_cpp set anything up
        if hasattr(self, "_stack"):
            super().close()
