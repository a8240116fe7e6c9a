// llama-sparq: ggml RPC servers as devices of one model (the Python package's rpc_servers; the
// tools' --rpc registers them for the whole process instead). The servers' devices are not added
// to ggml's backend registry, so a model loaded later without them does not try to use them.

#include "llama-sparq.h"
#include "llama-sparq-impl.h"

#include "ggml-backend.h"

#include <string>
#include <vector>

// the devices of the RPC server at endpoint (ggml's RPC backend keeps one registry entry per
// endpoint; it is not registered here)
static bool sparq_rpc_server_devices(const std::string & endpoint, std::vector<ggml_backend_dev_t> & out, char * err,
                                     size_t err_size) {
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (!rpc) {
        sparq_err(err, err_size, "rpc_servers: this build of llama-sparq has no RPC backend (GGML_RPC)");
        return false;
    }
    typedef ggml_backend_reg_t (*add_server_t)(const char * endpoint);
    const auto add_server = (add_server_t) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server");
    if (!add_server) {
        sparq_err(err, err_size, "rpc_servers: the RPC backend has no ggml_backend_rpc_add_server");
        return false;
    }
    ggml_backend_reg_t reg = add_server(endpoint.c_str());
    const size_t n = reg ? ggml_backend_reg_dev_count(reg) : 0;
    if (n == 0) {
        sparq_err(err, err_size, "rpc_servers: %s reports no device", endpoint.c_str());
        return false;
    }
    for (size_t i = 0; i < n; ++i) {
        out.push_back(ggml_backend_reg_dev_get(reg, i));
    }
    return true;
}

int32_t llama_sparq_model_devices(const char * const * endpoints, int32_t n_endpoints, void ** out, int32_t max_out,
                                  char * err, size_t err_size) {
    std::vector<ggml_backend_dev_t> rpc, gpus, igpus;
    for (int32_t i = 0; i < n_endpoints; ++i) {
        if (!endpoints[i] || !*endpoints[i]) {
            sparq_err(err, err_size, "rpc_servers: an empty endpoint (give host:port)");
            return -1;
        }
        if (!sparq_rpc_server_devices(endpoints[i], rpc, err, err_size)) {
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
        sparq_err(err, err_size, "rpc_servers: %zu devices do not fit the list of %d", all.size(), (int) max_out);
        return -1;
    }
    for (size_t i = 0; i < all.size(); ++i) {
        out[i] = all[i];
    }
    out[all.size()] = nullptr;
    return (int32_t) all.size();
}
