// llama-sparq, a general llama.cpp addition (not SparQ): ggml RPC servers as devices of one
// model (the Python package's rpc_servers; the tools' --rpc registers them for the whole process
// instead). The servers' devices are not added to ggml's backend registry, so a model loaded
// later without them does not try to use them. Declared in llama-sparq.h, the fork's C API.

#include "llama-sparq.h"

#include "ggml-backend.h"

#include <cstdio>
#include <string>
#include <vector>

// the message into the caller's buffer; false, for the caller to return
static bool rpc_refuse(char * err, size_t err_size, const std::string & why) {
    if (err && err_size) {
        snprintf(err, err_size, "rpc_servers: %s", why.c_str());
    }
    return false;
}

// the devices of the RPC server at endpoint (ggml's RPC backend keeps one registry entry per
// endpoint; it is not registered here)
static bool rpc_server_devices(const std::string & endpoint, std::vector<ggml_backend_dev_t> & out, char * err,
                               size_t err_size) {
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (!rpc) {
        return rpc_refuse(err, err_size, "this build of llama-sparq has no RPC backend (GGML_RPC)");
    }
    typedef ggml_backend_reg_t (*add_server_t)(const char * endpoint);
    const auto add_server = (add_server_t) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server");
    if (!add_server) {
        return rpc_refuse(err, err_size, "the RPC backend has no ggml_backend_rpc_add_server");
    }
    ggml_backend_reg_t reg = add_server(endpoint.c_str());
    const size_t n = reg ? ggml_backend_reg_dev_count(reg) : 0;
    if (n == 0) {
        return rpc_refuse(err, err_size, endpoint + " reports no device");
    }
    for (size_t i = 0; i < n; ++i) {
        out.push_back(ggml_backend_reg_dev_get(reg, i));
    }
    return true;
}

int32_t llama_rpc_model_devices(const char * const * endpoints, int32_t n_endpoints, void ** out, int32_t max_out,
                                char * err, size_t err_size) {
    std::vector<ggml_backend_dev_t> rpc, gpus, igpus;
    for (int32_t i = 0; i < n_endpoints; ++i) {
        if (!endpoints[i] || !*endpoints[i]) {
            rpc_refuse(err, err_size, "an empty endpoint (give host:port)");
            return -1;
        }
        if (!rpc_server_devices(endpoints[i], rpc, err, err_size)) {
            return -1;
        }
    }
    // what llama.cpp's default selection takes from the registry: RPC devices registered there,
    // the GPUs, the integrated GPUs when there is no GPU
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(dev);
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU) {
            ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
            (reg && std::string(ggml_backend_reg_name(reg)) == "RPC" ? rpc : gpus).push_back(dev);
        } else if (type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            if (igpus.empty() || ggml_backend_dev_backend_reg(dev) == ggml_backend_dev_backend_reg(igpus.back())) {
                igpus.push_back(dev);
            }
        }
    }
    std::vector<ggml_backend_dev_t> all = rpc; // the RPC servers first, as llama.cpp orders them
    all.insert(all.end(), gpus.begin(), gpus.end());
    if (gpus.empty()) {
        all.insert(all.end(), igpus.begin(), igpus.end());
    }
    if ((int32_t) all.size() + 1 > max_out) {
        rpc_refuse(err, err_size,
                   std::to_string(all.size()) + " devices do not fit the list of " + std::to_string(max_out));
        return -1;
    }
    for (size_t i = 0; i < all.size(); ++i) {
        out[i] = all[i];
    }
    out[all.size()] = nullptr;
    return (int32_t) all.size();
}
