"""``Llama``: llama-cpp-python's class on the fork's library."""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import os
import threading

import numpy as np

from ._lib import setup_llama_cpp
from .bindings import settings as _table

setup_llama_cpp()

import llama_cpp  # noqa: E402  (after LLAMA_CPP_LIB_PATH is set)

_COMPLETION_SIGNATURE = inspect.signature(llama_cpp.Llama._create_completion)

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


def sparq_keyword(field: str) -> str:
    """The Llama keyword of a field of struct llama_sparq_params: enabled -> sparq, r -> sparq_r, ..."""
    return _table.keyword(field)


def sparq_field(keyword: str) -> str | None:
    """The struct field of a Llama keyword (sparq -> enabled, sparq_r -> r); None for another name."""
    return _table.field_of(keyword)


def sparq_settings(**keywords) -> dict:
    """Llama's SparQ keywords (``sparq``, ``sparq_r``, ...; None: not given) as struct fields, with
    ``enabled`` set when any other is given (any SparQ keyword switches SparQ on). ``ValueError``
    for a keyword that is not one."""
    out = {}
    for key, v in keywords.items():
        f = sparq_field(key)
        if f is None:
            raise ValueError(f"unknown SparQ setting {key!r}")
        if v is not None:
            out[f] = v
    if "enabled" not in out and out:
        out["enabled"] = True
    return out


def check_sparq_settings(**keywords) -> None:
    """Check Llama's SparQ keywords without loading a model (the library's messages, as
    ``ValueError``): for a configuration that names its model but loads it later."""
    from . import _sparq

    given = sparq_settings(**keywords)
    if given:
        _sparq.check_params(_sparq.make_params(given, sparq_keyword))


_params_lock = threading.Lock()


@contextlib.contextmanager
def _model_devices(devices):
    """llama-cpp-python's Llama builds its llama_model_params inside __init__ and has no keyword
    for the device list: while it runs, the default params it starts from carry ``devices``
    (a NULL-terminated ctypes array, kept alive by the caller); None leaves the defaults."""
    if devices is None:
        yield
        return
    import llama_cpp.llama_cpp as capi

    with _params_lock:
        orig = capi.llama_model_default_params

        def with_devices():
            p = orig()
            p.devices = ctypes.cast(devices, ctypes.c_void_p)
            return p

        capi.llama_model_default_params = with_devices
        try:
            yield
        finally:
            capi.llama_model_default_params = orig


class TokenIdError(ValueError):
    """A token id outside the model's vocabulary, given to a call that would pass it to llama.cpp."""


class GrammarError(ValueError):
    """A grammar (GBNF) that llama.cpp does not parse."""


class EmbeddingError(RuntimeError):
    """Embeddings asked of a model made without ``embedding=True`` (llama_cpp's RuntimeError)."""


class Llama(llama_cpp.Llama):
    """llama-cpp-python's ``Llama`` (same methods and arguments) on the fork's libllama.

    SparQ keyword arguments (applied after the context exists; any of them switches SparQ on),
    one per row of the settings' table (``llama-sparq-settings.def``), with the library's defaults:

{sparq_keywords}

    The keywords are the fields of the C API's ``struct llama_sparq_params`` (``sparq`` for
    ``enabled``, ``sparq_<field>`` for the others); the library checks their values
    (``llama_sparq_set_params``) and a bad one raises ``ValueError`` with its message, which
    names the parameter and what is allowed. ``set_sparq()`` takes the same keywords at run
    time and ``sparq_params()`` returns them.

    SparQ contexts always use the flash-attention KV layout (V not transposed), whatever
    ``flash_attn`` says. llama-cpp-python's ``type_k`` / ``type_v`` (ggml type ids) choose the
    K/V cache's types: SparQ runs on f16 (the default), f32, q8_0 (``llama_cpp.GGML_TYPE_Q8_0``, 8;
    half the bytes of f16) and the 4- and 5-bit q4_0, q4_1, q5_0, q5_1 and iq4_nl, and refuses other
    types (bf16) with a message naming them.
    ``sparq_stats()`` returns the fork's counters.

    ``rpc_servers`` (``"host:port,host:port"`` or a list): ggml RPC servers (``llama-sparq-rpc-server``)
    whose devices this model's offloaded layers (``n_gpu_layers``) and their KV cache go to, as the
    tools' ``--rpc`` (for this model only: later models do not use them unless given them too);
    checked first (an unreachable server raises ``ValueError``). SparQ's op then runs on the host
    that holds the layer's cache; a fixed ``sparq_k`` is needed there (the calibrated k runs in
    this process's CPU op).
    """

    def __init__(self, model_path: str, *args, rpc_servers=None, **kwargs):
        # the SparQ keywords (the table's: the signature below lists them), the rest for llama_cpp.Llama
        given = sparq_settings(**{k: kwargs.pop(k) for k in list(kwargs) if k == "sparq" or k.startswith("sparq_")})
        path = check_model_file(model_path)
        from . import _sparq

        # parsing (types, names) and the ranges the model does not set, before the model loads;
        # the library checks again against the context (r against the head size)
        params = _sparq.make_params(given, sparq_keyword) if given else None
        if params is not None:
            _sparq.check_params(params)
        if given.get("enabled"):
            kwargs["flash_attn"] = True  # SparQ needs V rows: the flash-attention cache layout
        devices = None
        if rpc_servers is not None:
            addrs = _sparq.rpc_model_devices(rpc_servers)
            devices = (ctypes.c_void_p * (len(addrs) + 1))(*addrs, None)  # NULL-terminated
        try:
            with _model_devices(devices):
                super().__init__(path, *args, **kwargs)
        except ValueError as e:
            # llama.cpp could not parse the file (truncated or corrupt)
            if path not in str(e):
                raise ValueError(f"{path}: {e}") from e
            raise
        if self.input_ids.shape[0] < self._n_ctx:
            # llama.cpp rounds the context up (n_ctx 128 is 256 cells), and completions run to it,
            # but llama_cpp sized its token and logits arrays by the n_ctx asked for: past that, a
            # token went unrecorded and logits_all's row failed to broadcast (a ValueError)
            import numpy as np

            self.input_ids = np.ndarray((self._n_ctx,), dtype=np.intc)
            if self._logits_all:
                self.scores = np.ndarray((self._n_ctx, self._n_vocab), dtype=np.single)
        if params is not None:
            try:
                _sparq.set_params(self._ctx.ctx, params)  # ValueError with llama_sparq_set_params's message
            except Exception:
                self.close()
                raise

    def sparq_params(self) -> dict:
        """The context's SparQ settings under the constructor's keywords (sparq, sparq_r, ...):
        ``Llama(path, **llm.sparq_params())`` and ``llm.set_sparq(**llm.sparq_params())`` take them back."""
        from . import _sparq

        return {sparq_keyword(f): v for f, v in _sparq.get_params(self._ctx.ctx).items()}

    def set_sparq(self, **settings) -> None:
        """Change SparQ settings on the live context, with the constructor's keywords
        (``sparq=False``, ``sparq_r=16``, ``sparq_basis="pca"``, ...); the others keep their
        current values. The library checks the values (``ValueError`` with its message)."""
        from . import _sparq

        fields = _sparq.fields()
        allowed = ", ".join(sparq_keyword(f) for f in fields)
        for key in settings:
            f = sparq_field(key)
            if f not in fields:
                hint = f" (the keyword is {sparq_keyword(key)!r}, as in the constructor)" if key in fields else ""
                raise ValueError(f"unknown SparQ setting {key!r}{hint}: allowed {allowed}")
        cur = _sparq.get_params(self._ctx.ctx)
        cur.update({sparq_field(k): v for k, v in settings.items()})
        if cur["enabled"] and self.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED:
            raise ValueError("SparQ needs the flash-attention KV layout: make the Llama with flash_attn=True or sparq=True")
        _sparq.set_params(self._ctx.ctx, _sparq.make_params(cur, sparq_keyword))

    def last_logits(self):
        """The logits of the last token evaluated, as a NumPy view of the context's buffer (valid
        until the next eval): what sampling reads, also without ``logits_all``."""
        return np.ctypeslib.as_array(self._ctx.get_logits_ith(-1), shape=(self.n_vocab(),))

    def sparq_stats(self) -> dict:
        """Counters: attention calls run with SparQ, dense calls by reason, mean compression, ..."""
        from . import _sparq

        return _sparq.get_stats(self._ctx.ctx)

    def sparq_layer_stats(self) -> list:
        """Per layer with SparQ data: what the op reported of its choice (cells attended, their estimated
        share of the attention mass, the cells reaching the coverage target, compression)."""
        from . import _sparq

        return _sparq.get_layer_stats(self._ctx.ctx)

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

    def detokenize(self, tokens, prev_tokens=None, special: bool = False) -> bytes:
        """llama_cpp's ``detokenize``, with the ids checked first: llama.cpp throws a C++ exception
        for an id outside the vocabulary, and through ctypes that aborts the process."""
        if len(tokens):
            n_vocab = self.n_vocab()
            lo, hi = min(tokens), max(tokens)  # called for every generated token: no Python loop
            if lo < 0 or hi >= n_vocab:
                raise TokenIdError(f"token id {lo if lo < 0 else hi} is out of range: allowed 0..{n_vocab - 1} "
                                   "(the model's vocabulary)")
        return super().detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def embed(self, *args, **kwargs):
        if self.context_params.embeddings is False:
            raise EmbeddingError("Llama model must be created with embedding=True to call this method")
        return super().embed(*args, **kwargs)

    def _create_completion(self, *args, **kwargs):
        """llama_cpp's, stopped at max_tokens and where the KV cache is full. It skips its max_tokens
        check while the text ends inside a UTF-8 character, so a completion went on past max_tokens,
        and one that reached the context there went on to a llama_decode with no free cell
        (RuntimeError "llama_decode returned 1"). Such stops are reported as ``finish_reason``
        "length", as llama_cpp's own are. An empty prompt is not echoed when logprobs are asked for."""
        # the arguments by llama_cpp's own signature and defaults, however they were passed
        call = _COMPLETION_SIGNATURE.bind(self, *args, **kwargs)
        call.apply_defaults()
        p = dict(call.arguments)
        del p["self"]
        if p["echo"] and p["logprobs"] is not None and p["prompt"] is not None and len(p["prompt"]) == 0:
            # nothing to echo, and llama_cpp's echo of logprobs indexed the empty prompt's (an IndexError)
            p["echo"] = False
        max_tokens = p["max_tokens"]
        full, n_prompt = [], None

        def at_a_limit(input_ids, logits) -> bool:
            nonlocal n_prompt
            # called after each sample with the tokens decoded so far: the first time, the prompt's
            n_prompt = len(input_ids) if n_prompt is None else n_prompt
            if self.n_tokens >= self._n_ctx or (max_tokens is not None and 0 < max_tokens <= len(input_ids) - n_prompt):
                # the token just sampled has no cell to be decoded in, or would be one too many
                full.append(True)
                return True
            return False

        p["stopping_criteria"] = llama_cpp.StoppingCriteriaList([at_a_limit, *(p["stopping_criteria"] or [])])
        for chunk in super()._create_completion(**p):
            if full:
                for choice in chunk.get("choices", ()):
                    if choice.get("finish_reason") == "stop":
                        choice["finish_reason"] = "length"
            yield chunk

    def _init_sampler(self, *args, grammar=None, **kwargs):
        # llama_cpp adds the grammar's sampler to the chain unchecked, and llama.cpp returns NULL for
        # a grammar it does not parse: the first sample then crashes the process
        if grammar is not None:
            smpl = llama_cpp.llama_sampler_init_grammar(self._model.vocab, grammar._grammar.encode("utf-8"),
                                                        grammar._root.encode("utf-8"))
            if not smpl:
                raise GrammarError(f"grammar: llama.cpp does not parse it (its log says where): {grammar._grammar[:200]!r}")
            llama_cpp.llama_sampler_free(smpl)
        return super()._init_sampler(*args, grammar=grammar, **kwargs)

    def __getstate__(self):
        state = super().__getstate__()
        state.update(self.sparq_params())
        return state

    def close(self) -> None:
        # also called from __del__ when __init__ failed before llama_cpp set anything up
        if hasattr(self, "_stack"):
            super().close()


def _default_text(row, value) -> str:
    if row.kind == "bool":
        return "on" if value else "off"
    return repr(value) if row.kind == "enum" else str(value)


def _document_keywords() -> None:
    """Llama's signature and docstring get the table's keywords: ``sparq``, ``sparq_r``, ... (None: not given)."""
    import inspect
    import textwrap

    from . import _sparq

    defaults = _sparq.default_params()
    lines = []
    for row in _table.table():
        if "python" in row.shown:
            text = f"``{row.keyword}``: {row.help} (default: {_default_text(row, defaults[row.name])})"
            lines.append(textwrap.fill(text, 100, initial_indent="    - ", subsequent_indent="      "))
    Llama.__doc__ = Llama.__doc__.replace("{sparq_keywords}", "\n".join(lines))
    sig = inspect.signature(Llama.__init__)
    params = [p for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
    params += [inspect.Parameter(row.keyword, inspect.Parameter.KEYWORD_ONLY, default=None)
               for row in _table.table() if "python" in row.shown]
    params += [p for p in sig.parameters.values() if p.kind == p.VAR_KEYWORD]
    Llama.__init__.__signature__ = sig.replace(parameters=params)


_document_keywords()
