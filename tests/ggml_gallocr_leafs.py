"""ggml's graph allocator given a graph whose nodes match the graph it last allocated (count,
sizes, their sources' allocation) but whose leafs differ: an input leaf of the second graph
where the first had a leaf allocated in advance (a weight). Upstream compared only the nodes,
reused the old assignment and gave the input leaf the weight's "no buffer" (a segfault); the
series' fix compares the leafs too, so the graph is allocated anew and computes right.

    python tests/ggml_gallocr_leafs.py <folder of libggml-base.so and libggml-cpu.so>

Prints "ok"; run as a subprocess by tests/test_faults.py, since the fault is a crash. The
server under load hit it (1 run in 12 of its load test) as new requests started beside slots
still decoding: SparQ's decode graphs differ in their inputs from step to step."""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

libdir = sys.argv[1]
base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"))
P = ctypes.c_void_p


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", P), ("no_alloc", ctypes.c_bool)]


def fn(lib, name, res, *args):
    f = getattr(lib, name)
    f.restype, f.argtypes = res, list(args)
    return f


ggml_init = fn(base, "ggml_init", P, InitParams)
new_1d = fn(base, "ggml_new_tensor_1d", P, P, ctypes.c_int, ctypes.c_int64)
add = fn(base, "ggml_add", P, P, P, P)
new_graph = fn(base, "ggml_new_graph", P, P)
expand = fn(base, "ggml_build_forward_expand", None, P, P)
cpu_buft = fn(base, "ggml_backend_cpu_buffer_type", P)
alloc_ctx = fn(base, "ggml_backend_alloc_ctx_tensors_from_buft", P, P, P)
gallocr_new = fn(base, "ggml_gallocr_new", P, P)
alloc_graph = fn(base, "ggml_gallocr_alloc_graph", ctypes.c_bool, P, P)
tensor_set = fn(base, "ggml_backend_tensor_set", None, P, P, ctypes.c_size_t, ctypes.c_size_t)
tensor_get = fn(base, "ggml_backend_tensor_get", None, P, P, ctypes.c_size_t, ctypes.c_size_t)
graph_compute = fn(base, "ggml_backend_graph_compute", ctypes.c_int, P, P)
cpu_init = fn(cpu, "ggml_backend_cpu_init", P)

N, F32 = 8, 0


def ctx():
    return ggml_init(InitParams(1 << 20, None, True))


def put(t, a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    tensor_set(t, a.ctypes.data, 0, a.nbytes)


def get(t):
    a = np.empty(N, np.float32)
    tensor_get(t, a.ctypes.data, 0, a.nbytes)
    return a


cw = ctx()
w = [new_1d(cw, F32, N) for _ in range(4)]
assert alloc_ctx(cw, cpu_buft())
vals = [np.arange(N, dtype=np.float32) * (i + 1) for i in range(4)]
for t, v in zip(w, vals):
    put(t, v)
backend = cpu_init()
galloc = gallocr_new(cpu_buft())

# first graph: leafs [a (input), w0, w1]; nodes n0 = a + w0, n1 = n0 + w1
c1 = ctx()
a = new_1d(c1, F32, N)
n1 = add(c1, add(c1, a, w[0]), w[1])
g1 = new_graph(c1)
expand(g1, n1)
assert alloc_graph(galloc, g1)
put(a, np.ones(N))
assert graph_compute(backend, g1) == 0
assert np.array_equal(get(n1), 1 + vals[0] + vals[1])

# second graph: leafs [w2, w3, x (input)]; nodes m0 = w2 + w3, m1 = x + w3
c2 = ctx()
x = new_1d(c2, F32, N)
m0 = add(c2, w[2], w[3])
m1 = add(c2, x, w[3])
g2 = new_graph(c2)
expand(g2, m0)
expand(g2, m1)
assert alloc_graph(galloc, g2)
put(x, np.full(N, 5.0))
assert graph_compute(backend, g2) == 0
assert np.array_equal(get(m0), vals[2] + vals[3]), get(m0)
assert np.array_equal(get(m1), 5 + vals[3]), get(m1)
print("ok")
