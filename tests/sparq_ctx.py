"""The tests' shared helpers: the thread count, a ``Llama`` with the tests' defaults, random
prompts, teacher-forced logits; and a thin wrapper over llama.cpp's C API (through
llama-cpp-python's ctypes bindings) for tests that drive the KV cache directly: several
sequences, memory operations, state save/load, and the fork's SparQ settings, counters and
checks."""

from __future__ import annotations

import ctypes

import numpy as np

N_THREADS = 2  # the threads of every test context: the 2-core machines the figures come from


def make_llm(model, n_ctx=2048, **kw):
    """A ``Llama`` on ``model`` with the tests' defaults (N_THREADS threads, batch 512, seed 0,
    quiet); ``kw`` adds settings or overrides a default."""
    from llama_sparq import Llama

    return Llama(str(model), **{"n_ctx": n_ctx, "n_threads": N_THREADS, "n_batch": 512, "verbose": False,
                                "seed": 0, **kw})


def llama_cpp():
    from llama_sparq._llama import llama_cpp as lc  # after pointing llama_cpp at the fork

    return lc


class Model:
    """Owns a loaded model (through the package's Llama, which also sets up the backend)."""

    def __init__(self, path):
        from llama_sparq import Llama

        self.llm = Llama(str(path), n_ctx=64, n_threads=N_THREADS, verbose=False)
        self.model = self.llm._model.model
        self.n_vocab = self.llm.n_vocab()
        lc = llama_cpp()
        self.head = lc.llama_model_n_embd(self.model) // lc.llama_model_n_head(self.model)


class Ctx:
    def __init__(self, model: Model, n_ctx=1024, n_seq=1, unified=False, n_ubatch=512, n_threads=N_THREADS,
                 flash_attn=True, type_k=None, type_v=None):
        lc = llama_cpp()
        p = lc.llama_context_default_params()
        if type_k is not None:  # the K/V cache's types (ggml type ids; default f16)
            p.type_k = type_k
        if type_v is not None:
            p.type_v = type_v
        p.n_ctx = n_ctx
        p.n_batch = max(512, n_ubatch)
        p.n_ubatch = n_ubatch
        p.n_seq_max = n_seq
        p.kv_unified = unified
        p.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.n_threads = n_threads
        p.n_threads_batch = n_threads
        self.m = model
        self.nv = model.n_vocab
        self.ctx = lc.llama_init_from_model(model.model, p)
        assert self.ctx
        self.mem = lc.llama_get_memory(self.ctx)
        self.n_seq = n_seq

    def free(self):
        if self.ctx:
            llama_cpp().llama_free(self.ctx)
            self.ctx = None

    # -- decoding ------------------------------------------------------------
    def decode(self, items, logits=None):
        """items: (token, pos, seq) triples; returns the rc and the logits of the rows asked
        for (all rows when logits is None)."""
        lc = llama_cpp()
        b = lc.llama_batch_init(len(items), 0, 1)
        try:
            b.n_tokens = len(items)
            want = [True] * len(items) if logits is None else logits
            for i, (tok, pos, seq) in enumerate(items):
                b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
                b.seq_id[i][0] = seq
                b.logits[i] = bool(want[i])
            rc = lc.llama_decode(self.ctx, b)
            out = []
            if rc == 0:
                for i in range(len(items)):
                    if want[i]:
                        ptr = lc.llama_get_logits_ith(self.ctx, i)
                        out.append(np.ctypeslib.as_array(ptr, shape=(self.nv,)).astype(np.float64).copy())
            return rc, out
        finally:
            lc.llama_batch_free(b)

    def encode(self, tokens, seq=0):
        """An encoder-decoder model's encoder over tokens (llama_encode, positions from 0): the
        decoder's cross-attention reads its output. Returns the rc."""
        lc = llama_cpp()
        b = lc.llama_batch_init(len(tokens), 0, 1)
        try:
            b.n_tokens = len(tokens)
            for i, tok in enumerate(tokens):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, i, 1, True
                b.seq_id[i][0] = seq
            return lc.llama_encode(self.ctx, b)
        finally:
            lc.llama_batch_free(b)

    def pos_max(self, seq):
        return llama_cpp().llama_memory_seq_pos_max(self.mem, seq)

    def pos_min(self, seq):
        return llama_cpp().llama_memory_seq_pos_min(self.mem, seq)

    # -- memory ----------------------------------------------------------------
    def seq_rm(self, seq, p0, p1):
        return llama_cpp().llama_memory_seq_rm(self.mem, seq, p0, p1)

    def seq_cp(self, src, dst, p0=-1, p1=-1):
        llama_cpp().llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_keep(self, seq):
        llama_cpp().llama_memory_seq_keep(self.mem, seq)

    def seq_add(self, seq, p0, p1, delta):
        llama_cpp().llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    def seq_div(self, seq, p0, p1, d):
        llama_cpp().llama_memory_seq_div(self.mem, seq, p0, p1, d)

    def clear(self, data=True):
        llama_cpp().llama_memory_clear(self.mem, data)

    # -- state -----------------------------------------------------------------
    def state_get(self) -> bytes:
        lc = llama_cpp()
        n = lc.llama_state_get_size(self.ctx)
        buf = (ctypes.c_uint8 * n)()
        got = lc.llama_state_get_data(self.ctx, buf, n)
        assert got > 0
        return bytes(buf[:got])

    def state_set(self, blob: bytes):
        lc = llama_cpp()
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        assert lc.llama_state_set_data(self.ctx, buf, len(blob)) == len(blob)

    def seq_state_get(self, seq) -> bytes:
        lc = llama_cpp()
        n = lc.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * n)()
        got = lc.llama_state_seq_get_data(self.ctx, buf, n, seq)
        assert got > 0
        return bytes(buf[:got])

    def seq_state_set(self, blob: bytes, seq) -> int:
        lc = llama_cpp()
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        return lc.llama_state_seq_set_data(self.ctx, buf, len(blob), seq)

    # -- SparQ -----------------------------------------------------------------
    def sparq(self, **kw):
        from llama_sparq import _sparq

        cur = _sparq.get_params(self.ctx)
        cur.update(kw)
        _sparq.set_params(self.ctx, **cur)

    def sparq_params(self):
        from llama_sparq import _sparq

        return _sparq.get_params(self.ctx)

    def stats(self):
        from llama_sparq import _sparq

        return _sparq.get_stats(self.ctx)

    def check(self, sync=False) -> float:
        from llama_sparq import _sparq

        return _sparq.debug_check(self.ctx, sync_first=sync)

    def graph_io(self):
        from llama_sparq import _sparq

        return _sparq.debug_graph_io(self.ctx)

    def debug_graph_rebuild(self, on=True):
        """The rebuilds of this (host-memory) cache as the graph a device's cache takes."""
        from llama_sparq import _sparq

        _sparq.debug_graph_rebuild(self.ctx, on)

    def sync(self):
        from llama_sparq import _sparq

        _sparq.sync(self.ctx)


def rand_tokens(rng, n, n_vocab):
    """n random token ids from rng, above the special ones (0-2)."""
    return rng.integers(3, n_vocab, size=n).tolist()


def rand_prompt(n, seed, n_vocab):
    """A prompt of n tokens: BOS (1), then random ids from a generator seeded with seed."""
    return [1] + rand_tokens(np.random.default_rng(seed), n - 1, n_vocab)


def prefill(c: Ctx, seq, tokens, pos0=0):
    rc, _ = c.decode([(t, pos0 + i, seq) for i, t in enumerate(tokens)], logits=[False] * len(tokens))
    assert rc == 0, rc


def step(c: Ctx, seq, tok):
    """One decode step of one sequence at the next position; its logits."""
    rc, out = c.decode([(tok, c.pos_max(seq) + 1, seq)])
    assert rc == 0, rc
    return out[0]


def teacher_forced(llm, prompt, cont):
    """Logits of each decode step of a ``Llama`` (made with ``logits_all=True``) fed the given
    continuation: the steps see the same tokens whatever the model would pick (no divergence)."""
    llm.reset()
    llm.eval(prompt[:-1])
    out = []
    for t in [prompt[-1]] + cont[:-1]:
        llm.eval([t])
        out.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64))
    return np.array(out)


def exact_against_dense(model, r, n_prompt, n_steps, n_ctx=1024):
    """SparQ in exact mode (``r``, k beyond the context, on every step) against dense on the same
    teacher-forced tokens: (the SparQ ``Llama``, the largest logit difference from dense with flash
    attention, upstream's own spread between its two dense paths, the largest dense logit)."""
    def forced(**kw):
        llm = make_llm(model, n_ctx, logits_all=True, **kw)
        return llm, teacher_forced(llm, prompt, cont)

    dense = make_llm(model, n_ctx, logits_all=True, flash_attn=True)
    prompt = rand_prompt(n_prompt, 3, dense.n_vocab())
    cont = [int(t) for t in np.random.default_rng(4).integers(3, dense.n_vocab(), size=n_steps)]
    want = teacher_forced(dense, prompt, cont)
    _, nofa = forced(flash_attn=False)
    sp, got = forced(flash_attn=True, sparq_r=r, sparq_k=4096, sparq_min_kv=0)
    return sp, np.abs(got - want).max(), np.abs(nofa - want).max(), np.abs(want).max()
