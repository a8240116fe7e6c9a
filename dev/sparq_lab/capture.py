"""Capture the tensors of SparQ attention calls from a running model (for diagnosis).

``Capture(llm)`` installs an eval callback on the context (``llama_sparq_debug_set_eval_callback``)
that copies, for every ``sparq_attn-<layer>`` node the graph computes, the op's inputs
(q, K, K^T, V, the V sums, the valid-cell count, the mask, the local-window cells, the
rotated query and the component weights when present, or the H2O scores) and its output into NumPy
arrays:

    with Capture(llm) as cap:
        llm.eval([tok])
    for call in cap.calls:      # one dict per SparQ node, in graph order
        call["layer"], call["q"], call["K"], call["out"], ...

With the h2o selector the op's ``q_sel`` slot holds its scores, written by the op: ``h2o``
is that tensor after the call and ``h2o_before`` a copy taken before the op ran (from the
``sparq_h2o-<layer>`` node that zeroes the new cells' scores). With the index selector the q_sel
and comp_w slots hold its centroids (``ivf_cent``) and the cells' list ids (``ivf_lists``, after
the call: the op assigns new cells), and ``ivf_before`` the ids before it (from ``sparq_ivf-<layer>``).

Shapes follow the op's ggml layout reversed into NumPy order (see ``_OP_SRC``), with every
stream of the ubatch; ``stream_view(call, s)`` gives the reference's view of one stream
(``stream0`` of the first). The tensors live in host memory
only on the CPU backend: a callback on a GPU-resident node is refused with an error.
"""

from __future__ import annotations

import ctypes  # upstream's ggml_tensor, read in the callback (ggml.h, not the fork's API)
import re

import numpy as np

from llama_sparq import _sparq

from ._reference_blocks import BLOCK_BYTES, dequantize_blocks

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 16  # the fork's ggml.h (patch 0002)
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_I8, GGML_TYPE_I32 = 0, 1, 24, 26


class ggml_tensor(ctypes.Structure):
    pass


ggml_tensor._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
    ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(ggml_tensor) * GGML_MAX_SRC),
    ("view_src", ctypes.POINTER(ggml_tensor)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * GGML_MAX_NAME),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]



class ggml_sparq_attn_params(ctypes.Structure):
    """ggml-sparq-params.h's struct ggml_sparq_attn_params."""
    _fields_ = [("r", ctypes.c_int32), ("k", ctypes.c_int32), ("l", ctypes.c_int32), ("scale", ctypes.c_float),
                ("selector", ctypes.c_int32), ("flags", ctypes.c_int32), ("n_probe", ctypes.c_int32),
                ("topk_buckets", ctypes.c_int32), ("index_reads", ctypes.c_bool), ("cov_p", ctypes.c_float), ("k_min", ctypes.c_int32),
                ("k_scan", ctypes.c_int32), ("cov_apply", ctypes.c_bool), ("k_frac", ctypes.c_float),
                ("softcap", ctypes.c_float), ("max_bias", ctypes.c_float)]


class ggml_sparq_params(ctypes.Structure):
    """ggml-sparq-params.h's struct ggml_sparq_params (the sum's append part is not read here)."""
    _fields_ = [("mode", ctypes.c_int), ("features", ctypes.c_uint32), ("attn", ggml_sparq_attn_params),
                ("sum_type", ctypes.c_int32), ("sum_squares", ctypes.c_bool)]


_DECODE = None


def _decode_params(t: ggml_tensor) -> dict:
    """The op's parameters of node t, decoded by the library's own decoder (the one the backends
    use), as a dict of the attention fields plus mode and features."""
    global _DECODE
    if _DECODE is None:
        from llama_sparq._lib import lib_dir
        _DECODE = ctypes.CDLL(str(lib_dir() / "libggml-base.so")).ggml_sparq_params_decode
        _DECODE.argtypes = [ctypes.POINTER(ggml_tensor), ctypes.POINTER(ggml_sparq_params)]
        _DECODE.restype = ctypes.c_bool
    p = ggml_sparq_params()
    if not _DECODE(ctypes.byref(t), ctypes.byref(p)):
        raise ValueError(f"capture: {t.name.decode()} holds op parameters of another layout version")
    out = {name: getattr(p.attn, name) for name, _ in ggml_sparq_attn_params._fields_}
    out.update(mode=int(p.mode), features=int(p.features))
    return out


def decode_op_params(slots, op: int) -> dict:
    """The op's parameters of op_params' int32 slots (as llama_sparq_debug_op_params gives them),
    decoded as a node of op ``op`` (a captured call's "op") would be: the same dict as a call's "params"."""
    t = ggml_tensor()
    t.op = op
    for i, v in enumerate(slots):
        t.op_params[i] = v
    return _decode_params(t)


EVAL_CB = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.POINTER(ggml_tensor), ctypes.c_bool, ctypes.c_void_p)

# the op's sources (ggml_sparq_attn): name, index
_OP_SRC = ("q", "K", "KT", "V", "v_sum", "v_count", "mask", "win", "q_sel", "comp_w", "report", "sinks")
_APPEND_CELLS = 12  # src[12..14]: the step's append (cells, v_comp, k_sq), when the op appends
_KQ_B = 15  # src[15]: a bias added to the scores, [n_kv, n_rows, n_head, 1|ns]
_NODE = re.compile(r"sparq_attn-(\d+)")
_BEFORE = re.compile(r"sparq_(h2o|ivf)-(\d+)")  # H2O's scores / the index's lists before the op of that layer
_DTYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16, GGML_TYPE_I32: np.int32}
# a quantized K/V cache's block types by ggml type id (blocks of 32 values: _reference_blocks)
_BLOCK_TYPES = {8: "q8_0", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 20: "iq4_nl"}


def tensor_to_numpy(t: ggml_tensor) -> np.ndarray:
    """A copy of a host tensor as a NumPy array of shape ne[::-1] (f32, f16 or i32; a quantized
    cache's (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) values dequantized to f32, as ggml does; an i8 one, which among the op's sources is
    only an 8-bit K^T, read as e5m2: each byte the upper byte of an f16)."""
    block = _BLOCK_TYPES.get(t.type)
    dt = np.dtype(f"V{BLOCK_BYTES[block]}") if block else np.uint8 if t.type == GGML_TYPE_I8 else _DTYPES.get(t.type)
    if dt is None:
        raise ValueError(f"capture: tensor {t.name.decode()} has ggml type {t.type}; f32, f16, a quantized cache "
                         f"type ({', '.join(_BLOCK_TYPES.values())}), i8 (e5m2) or i32 expected")
    if not t.data:
        raise ValueError(f"capture: tensor {t.name.decode()} has no host data")
    ne = [int(t.ne[i]) for i in range(GGML_MAX_DIMS)]
    nb = [int(t.nb[i]) for i in range(GGML_MAX_DIMS)]
    if dt is np.uint8:
        b = _host_copy(t.data, np.uint8, ne[::-1], nb[::-1])
        return (b.astype(np.uint16) << 8).view(np.float16)
    if block:
        # rows of blocks: ne[0] / 32 blocks of nb[0] bytes each
        shape = [ne[3], ne[2], ne[1], ne[0] // 32]
        blocks = _host_copy(t.data, dt, shape, nb[::-1]).view(np.uint8).reshape(*shape, dt.itemsize)
        return dequantize_blocks(blocks, block).reshape(ne[::-1])
    return _host_copy(t.data, dt, ne[::-1], nb[::-1])


def _host_copy(addr: int, dt, shape, strides) -> np.ndarray:
    """A copy of the strided host array at ``addr`` (shape and byte strides outermost first)."""
    extent = sum((n - 1) * s for n, s in zip(shape, strides)) + np.dtype(dt).itemsize
    buf = (ctypes.c_uint8 * extent).from_address(addr)
    return np.array(np.ndarray(shape, dtype=dt, buffer=buf, strides=strides), copy=True)


def _index_reads(c: ggml_tensor) -> np.ndarray:
    """The row after the centroids' last, element 0 per (stream, KV head): the key rows the op read."""
    return _host_copy(c.data + int(c.ne[1]) * int(c.nb[1]), np.float32, (int(c.ne[3]), int(c.ne[2])),
                      (int(c.nb[3]), int(c.nb[2])))


class Capture:
    """Context manager: while active, every SparQ node's inputs and output are copied."""

    def __init__(self, llm, layers=None):
        """``llm``: a ``llama_sparq.Llama``, or a raw ``llama_context`` pointer (low-level API)."""
        self.llm = llm
        self._ctx = llm._ctx.ctx if hasattr(llm, "_ctx") else llm
        self.layers = None if layers is None else set(layers)
        self.calls: list[dict] = []
        self._cb = EVAL_CB(self._callback)
        self._error: Exception | None = None
        self._before: dict[tuple, np.ndarray] = {}  # (kind, layer) -> the tensor before the op

    def _wanted(self, name: str) -> bool:
        m = _NODE.fullmatch(name)  # the op itself, not views of it ("sparq_attn-5 (reshaped)")
        if not m:
            return False
        return self.layers is None or int(m.group(1)) in self.layers

    def _callback(self, tp, ask, _ud):
        try:
            t = tp.contents
            name = t.name.decode(errors="replace")
            m = _BEFORE.fullmatch(name)
            wanted_before = m is not None and (self.layers is None or int(m.group(2)) in self.layers)
            if ask:
                return self._wanted(name) or wanted_before
            if wanted_before:
                # the scores of every cell of the layer's cache, as the op will read them
                self._before[(m.group(1), int(m.group(2)))] = tensor_to_numpy(t)
                return True
            if not self._wanted(name):
                return True
            call = {"layer": int(_NODE.fullmatch(name).group(1)), "params": _decode_params(t), "op": int(t.op)}
            for i, key in enumerate(_OP_SRC):
                s = t.src[i]
                call[key] = tensor_to_numpy(s.contents) if s else None
            call["kq_b"] = tensor_to_numpy(t.src[_KQ_B].contents) if t.src[_KQ_B] else None
            if t.src[_APPEND_CELLS]:
                # the op appended the step's cell itself: its comp_w, when it is k_sq, holds the sums of
                # k^2 (the weights are their roots), and the kept window it pushed has every entry (the
                # op reads the first l)
                cw, ksq = t.src[_OP_SRC.index("comp_w")], t.src[_APPEND_CELLS + 2]
                if cw and ctypes.addressof(cw.contents) == ctypes.addressof(ksq.contents):
                    call["comp_w"] = np.sqrt(call["comp_w"])
                if call["win"] is not None:
                    call["win"] = call["win"][..., :call["params"]["l"]]
            # K^T's width (sparq_kt_bits): an i8 K^T holds e5m2, a q4_1 one the 4-bit blocks ("KT" holds
            # their values, decoded)
            kt = t.src[_OP_SRC.index("KT")]
            kt_type = kt.contents.type if kt else None
            call["kt_bits"] = 8 if kt_type == GGML_TYPE_I8 else 4 if _BLOCK_TYPES.get(kt_type) == "q4_1" else 16
            selector = call["params"]["selector"]
            if selector == 3:  # GGML_SPARQ_SEL_H2O: the q_sel slot holds the scores
                call["h2o"], call["q_sel"] = call["q_sel"], None
                call["h2o_before"] = self._before.pop(("h2o", call["layer"]), None)
            elif selector == 4:  # GGML_SPARQ_SEL_INDEX: centroids and list ids
                call["ivf_cent"], call["ivf_lists"], call["q_sel"], call["comp_w"] = call["q_sel"], call["comp_w"], None, None
                call["ivf_before"] = self._before.pop(("ivf", call["layer"]), None)
                # what the op reported it read (ggml_sparq_attn_set_index_reads): [n_stream, n_head_kv]
                call["ivf_reads"] = _index_reads(t.src[8].contents) if call["params"]["index_reads"] else None
            call["out"] = tensor_to_numpy(t)
            self.calls.append(call)
        except Exception as e:  # never raise through C
            self._error = e
        return True

    def __enter__(self):
        _sparq.set_eval_callback(self._ctx, ctypes.cast(self._cb, ctypes.c_void_p).value)
        return self

    def __exit__(self, *exc):
        _sparq.set_eval_callback(self._ctx, None)
        if self._error is not None and exc[0] is None:
            raise RuntimeError(f"capture failed: {self._error}") from self._error
        return False


def op_params(call) -> dict:
    """The SparQ op's settings of a captured call: r, k, l, scale, selector, flags, and the rest of
    ggml-sparq-params.h's attention fields with mode and features."""
    return dict(call["params"])


def stream0(call, row=0):
    """The reference's view of stream 0, query row ``row`` of a captured call (see ``stream_view``)."""
    return stream_view(call, 0, row)


def reference_kt(call, stream=0) -> dict:
    """The reference's K^T arguments (sparq_attention's kt_bits, K_sel) for one stream of a captured
    call: its width, and with a 4-bit K^T the op's blocks as they are. A block's scale follows every
    value put into it (removed cells' until a rebuild, a cell's earlier value), so rounding the
    captured keys anew can group other values; llama_sparq_debug_check holds the blocks to the cache."""
    if call["kt_bits"] != 4:
        return {"kt_bits": call["kt_bits"]}
    return {"K_sel": call["KT"][stream].transpose(2, 0, 1).astype(np.float64), "kt_bits": 16}  # (S, hkv, d)


def stream_view(call, stream=0, row=0):
    """The reference's view of one stream (index within the ubatch's streams), query row ``row``
    of a captured call: q (1, n_head, d), K (S, n_head_kv, d), V (S, n_head_kv, dv), mask (1, S),
    vbar (n_head_kv, dv), window cells (list), the op's output (1, n_head, dv), the rotated
    query when present (1, n_head, d), all float64, and the component weights (n_head_kv, d) or None."""
    s = stream
    q = call["q"][s, :, row, :].astype(np.float64)[None]          # ggml [d, n_rows, n_head, ns]
    K = call["K"][s].transpose(1, 0, 2).astype(np.float64)        # ggml [d, n_kv, hkv, ns] -> (S, hkv, d)
    V = call["V"][s].transpose(1, 0, 2).astype(np.float64)
    S = K.shape[0]
    mask = None
    if call["mask"] is not None:
        m = call["mask"]                                          # ggml [n_kv, rows, 1, 1|ns]
        mask = m[s if m.shape[0] > 1 else 0, 0, row, :S].astype(np.float64)[None]
    vsum = call["v_sum"][0, s].astype(np.float64)                 # [dv, hkv, ns, 1] -> (hkv, dv)
    cnt = float(call["v_count"].ravel()[s])
    vbar = vsum / cnt if cnt > 0 else np.zeros_like(vsum)
    win, win_raw = [], None
    if call["win"] is not None:
        win_raw = [int(c) for c in call["win"][0, s, row]]       # [w, n_rows, ns, 1], -1 padded
        win = [c for c in win_raw if c >= 0]
    out = call["out"][s, row].astype(np.float64)[None]           # [dv, n_head, rows, ns]
    q_sel = None if call["q_sel"] is None else call["q_sel"][s, :, row, :].astype(np.float64)[None]
    comp_w = None if call["comp_w"] is None else call["comp_w"][0, s].astype(np.float64)  # [d, hkv, ns] -> (hkv, d)
    h2o = h2o_before = None
    if call.get("h2o") is not None:
        h2o = call["h2o"][0, s].astype(np.float64)                # [n_kv, hkv, ns, 1] -> (hkv, S)
        if call.get("h2o_before") is not None:
            # the layer's whole score tensor [kv_size, hkv, n_stream], flat; h2o contexts have one stream
            hb = call["h2o_before"].reshape(-1)
            h2o_before = hb.reshape(h2o.shape[0], -1)[:, : h2o.shape[1]].astype(np.float64)
    ivf = None
    if call.get("ivf_cent") is not None:
        after = call["ivf_lists"][0, s].astype(np.float64)          # [n_kv, hkv, ns, 1] -> (hkv, S)
        before = None
        if call.get("ivf_before") is not None:
            # the layer's whole list tensor [kv_size, hkv, n_stream], flat: the cache's stream 0
            before = call["ivf_before"].reshape(-1).reshape(after.shape[0], -1)[:, : after.shape[1]].astype(np.float64)
        ivf = {"cent": call["ivf_cent"][s].astype(np.float64),      # [d, n_list, hkv, ns] -> (hkv, n_list, d)
               "lists": after, "lists_before": before, "n_probe": int(call["params"]["n_probe"]),
               "reads": None if call.get("ivf_reads") is None else call["ivf_reads"][s].astype(np.float64)}  # (hkv,)
    kq_b = None
    if call.get("kq_b") is not None:
        b = call["kq_b"]                                          # ggml [n_kv, rows, n_head, 1|ns]
        kq_b = b[s if b.shape[0] > 1 else 0, :, row, :S].astype(np.float64)[None]  # (1, n_head, S)
    return {"q": q, "K": K, "V": V, "mask": mask, "vbar": vbar, "kq_b": kq_b, "vsum": vsum, "count": cnt, "win": win,
            "win_raw": win_raw, "out": out, "q_sel": q_sel, "comp_w": comp_w, "h2o": h2o, "h2o_before": h2o_before,
            "ivf": ivf}
