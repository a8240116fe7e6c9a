// llama-sparq: SparQ in llama-server (patch 0008). Included by tools/server/server.cpp,
// server-context.cpp and server-task.cpp; compiled into the server-context target.
//
// - one KV stream per slot when SparQ is on: the server's default (`-np` auto) is 4 slots in
//   one unified KV stream, where decode steps with several sequences run dense (reason
//   shared_stream), so with --sparq the slots get their own streams (n_ctx / n_slots cells
//   each) and an explicit --kv-unified with several slots is refused;
// - the SparQ settings (one gauge / field per row of the settings' table) and counters in /metrics
//   (Prometheus) and /props ("sparq").
//
// The counters are written while a batch is decoded, and the server answers /metrics and
// /props on other threads while it decodes, so the decoding thread copies them into a
// snapshot after each batch (server_sparq_update) and the endpoints read the snapshot.
#pragma once

#include "common.h"
#include "json.h"
#include "llama-sparq.h"

#include <string>

// before the model is loaded, kv_unified_requested being params.kv_unified as parsed (upstream's
// default is false; --kv-unified or LLAMA_ARG_KV_UNIFIED set it): with SparQ on, one KV stream
// per slot. False (after logging why) when refused.
bool server_sparq_prepare_params(common_params & params, bool kv_unified_requested);

// on the thread that decodes, after the context is made and after each batch: copies ctx's
// SparQ settings and counters into the snapshot the endpoints read
void server_sparq_update(llama_context * ctx);

// the snapshot as Prometheus lines (llamacpp:sparq_*), appended to /metrics
std::string server_sparq_prometheus();

// the snapshot as the "sparq" object of /props
common_json server_sparq_props();
