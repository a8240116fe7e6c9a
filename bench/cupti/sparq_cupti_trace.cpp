// A CUPTI activity tracer loaded into any CUDA program through CUDA_INJECTION64_PATH: for the GPU
// machines this project borrows, which have Nsight Compute but no working Nsight Systems.
//
//   CUDA_INJECTION64_PATH=libsparq_cupti_trace.so SPARQ_TRACE_PREFIX=out/run llama-bench ...
//
// At exit it writes the same three summaries as `nsys stats -r cuda_gpu_kern_sum,cuda_api_sum,
// cuda_gpu_mem_time_sum -f csv` (so bench/gpu.py timeline reduces either), one row per name with
// total time and count, plus <prefix>_busy.csv: the GPU's busy time (the union of the kernels'
// intervals; not the copies, which a synthetic fill makes differ between runs) and the span from
// the first to the last, so that a step's launch gaps
// (wall time the GPU sat idle) can be told from its kernels' time. Kernels replayed from a CUDA
// graph are recorded one by one (CUPTI reports graph nodes as kernels), the runtime API calls by
// name: cudaGraphLaunch against cudaLaunchKernel says whether the graphs captured the step.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

struct total {
    uint64_t ns = 0;
    uint64_t n  = 0;
};

std::mutex                                   g_mutex;
std::map<std::string, total>                 g_kernels, g_api, g_mem;
std::vector<std::pair<uint64_t, uint64_t>>   g_intervals;  // kernels [start, end)
bool                                         g_ok = false;

constexpr size_t BUF_SIZE = 8u << 20;

void check(CUptiResult r, const char * what) {
    if (r != CUPTI_SUCCESS) {
        const char * s = nullptr;
        cuptiGetResultString(r, &s);
        fprintf(stderr, "sparq_cupti_trace: %s failed: %s\n", what, s ? s : "?");
    }
}

std::string demangle(const char * name) {
    if (!name) {
        return "?";
    }
    int    status = 0;
    char * d      = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string out = (status == 0 && d) ? d : name;
    free(d);
    return out;
}

const char * memcpy_kind(uint8_t k) {
    switch (k) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[CUDA memcpy Host-to-Device]";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[CUDA memcpy Device-to-Host]";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[CUDA memcpy Device-to-Device]";
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "[CUDA memcpy Host-to-Host]";
        case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[CUDA memcpy Peer-to-Peer]";
        default: return "[CUDA memcpy other]";
    }
}

void add(std::map<std::string, total> & m, const std::string & name, uint64_t start, uint64_t end) {
    total & t = m[name];
    t.ns += end > start ? end - start : 0;
    t.n  += 1;
}

void CUPTIAPI buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    *buffer      = static_cast<uint8_t *>(aligned_alloc(8, BUF_SIZE));
    *size        = *buffer ? BUF_SIZE : 0;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t * buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity *            rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        switch (rec->kind) {
            case CUPTI_ACTIVITY_KIND_KERNEL:
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
                const auto * k = reinterpret_cast<const CUpti_ActivityKernel10 *>(rec);
                add(g_kernels, demangle(k->name), k->start, k->end);
                g_intervals.emplace_back(k->start, k->end);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY: {
                const auto * m = reinterpret_cast<const CUpti_ActivityMemcpy6 *>(rec);
                add(g_mem, memcpy_kind(m->copyKind), m->start, m->end);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMSET: {
                const auto * m = reinterpret_cast<const CUpti_ActivityMemset4 *>(rec);
                add(g_mem, "[CUDA memset]", m->start, m->end);
                break;
            }
            case CUPTI_ACTIVITY_KIND_RUNTIME: {
                const auto * a    = reinterpret_cast<const CUpti_ActivityAPI *>(rec);
                const char * name = nullptr;
                if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || !name) {
                    name = "cudaUnknown";
                }
                add(g_api, name, a->start, a->end);
                break;
            }
            default:
                break;
        }
    }
    free(buffer);
}

// CSV with the header names nsys stats uses; names quoted (demangled names hold commas)
void write_sum(const std::string & path, const std::map<std::string, total> & m, const char * count_col,
               const char * name_col) {
    FILE * f = fopen(path.c_str(), "w");
    if (!f) {
        fprintf(stderr, "sparq_cupti_trace: cannot write %s\n", path.c_str());
        return;
    }
    std::vector<std::pair<std::string, total>> rows(m.begin(), m.end());
    std::sort(rows.begin(), rows.end(), [](const auto & a, const auto & b) { return a.second.ns > b.second.ns; });
    uint64_t all = 0;
    for (const auto & r : rows) {
        all += r.second.ns;
    }
    fprintf(f, "Time (%%),Total Time (ns),%s,Avg (ns),%s\n", count_col, name_col);
    for (const auto & r : rows) {
        std::string q;
        for (char c : r.first) {
            q += c;
            if (c == '"') {
                q += '"';
            }
        }
        fprintf(f, "%.1f,%llu,%llu,%.1f,\"%s\"\n", all ? 100.0 * r.second.ns / all : 0.0,
                (unsigned long long) r.second.ns, (unsigned long long) r.second.n,
                r.second.n ? double(r.second.ns) / r.second.n : 0.0, q.c_str());
    }
    fclose(f);
}

void write_busy(const std::string & path) {
    auto & v = g_intervals;
    std::sort(v.begin(), v.end());
    uint64_t busy = 0, cur_s = 0, cur_e = 0;
    for (const auto & iv : v) {
        if (iv.first > cur_e) {
            busy += cur_e - cur_s;
            cur_s = iv.first;
            cur_e = iv.second;
        } else {
            cur_e = std::max(cur_e, iv.second);
        }
    }
    busy += cur_e - cur_s;
    FILE * f = fopen(path.c_str(), "w");
    if (!f) {
        return;
    }
    uint64_t span = v.empty() ? 0 : cur_e - v.front().first;
    fprintf(f, "busy_ns,span_ns,intervals\n%llu,%llu,%zu\n", (unsigned long long) busy, (unsigned long long) span, v.size());
    fclose(f);
}

void at_exit() {
    if (!g_ok) {
        return;
    }
    check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
    const char *  p      = getenv("SPARQ_TRACE_PREFIX");
    std::string   prefix = p && *p ? p : "sparq_trace";
    std::lock_guard<std::mutex> lock(g_mutex);
    write_sum(prefix + "_cuda_gpu_kern_sum.csv", g_kernels, "Instances", "Name");
    write_sum(prefix + "_cuda_api_sum.csv", g_api, "Num Calls", "Name");
    write_sum(prefix + "_cuda_gpu_mem_time_sum.csv", g_mem, "Count", "Operation");
    write_busy(prefix + "_busy.csv");
    fprintf(stderr, "sparq_cupti_trace: %zu kernel names, %zu API names, %zu intervals -> %s_*.csv\n", g_kernels.size(),
            g_api.size(), g_intervals.size(), prefix.c_str());
}

}  // namespace

// called by the CUDA driver when CUDA_INJECTION64_PATH names this library
extern "C" int InitializeInjection(void) {
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    check(r, "cuptiActivityRegisterCallbacks");
    if (r != CUPTI_SUCCESS) {
        return 0;
    }
    const CUpti_ActivityKind kinds[] = { CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_RUNTIME,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET };
    for (CUpti_ActivityKind k : kinds) {
        CUptiResult e = cuptiActivityEnable(k);
        check(e, "cuptiActivityEnable");
        // without kernel records there is nothing to summarise: no files, so no table of zeros
        g_ok = g_ok || (k == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && e == CUPTI_SUCCESS);
    }
    atexit(at_exit);
    return 1;
}
