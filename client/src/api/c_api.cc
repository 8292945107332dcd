// C ABI over gradd::Client (include/gradd/gradd.h): status codes as ints,
// the message of the last failure kept per thread.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gradd/client.h"
#include "gradd/gradd.h"

struct gradd_client {
  std::unique_ptr<gradd::Client> impl;
};

namespace {

// Per thread, so that concurrent gradd_mark_ready callers each see their
// own failure.
thread_local std::string last_error;
// Whether last_error is an aborted iteration (gradd::IsIterationAborted).
thread_local bool last_error_aborted_iteration = false;

int Report(const absl::Status& status) {
  if (status.ok()) return GRADD_OK;
  last_error = std::string(status.message());
  last_error_aborted_iteration = gradd::IsIterationAborted(status);
  return static_cast<int>(status.code());
}

int NullClient(const char* fn) {
  last_error_aborted_iteration = false;
  last_error = absl::StrCat(fn, ": client is NULL");
  return GRADD_INVALID_ARGUMENT;
}

// Reads a field of the caller's options only if the caller's struct is
// large enough to hold it (older callers pass a shorter struct).
#define GRADD_HAS_FIELD(opts, field) \
  ((opts)->struct_size >=            \
   offsetof(gradd_options, field) + sizeof((opts)->field))

}  // namespace

extern "C" {

void gradd_options_init(gradd_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  const gradd::ClientOptions defaults;
  options->struct_size = sizeof(*options);
  options->local_rank = -1;
  options->local_world_size = 0;
  options->node_rank = -1;
  options->rank = -1;
  options->connect_timeout_ms = defaults.connect_timeout.count();
  options->attach_timeout_ms = defaults.attach_timeout.count();
  options->wait_timeout_ms = defaults.wait_timeout.count();
  options->powersgd_use_error_feedback = -1;
  options->powersgd_warm_start = -1;
  options->cuda_device = -1;
  options->rank_restart_grace_ms = -1;
  options->min_nodes = -1;
}

int gradd_attach(const gradd_options* options, const gradd_param* params,
                 size_t num_params, gradd_client** out) {
  last_error_aborted_iteration = false;
  if (out == nullptr || options == nullptr ||
      (params == nullptr && num_params > 0)) {
    last_error = "gradd_attach: options, params and out must not be NULL";
    return GRADD_INVALID_ARGUMENT;
  }
  *out = nullptr;
  if (options->struct_size < offsetof(gradd_options, wait_timeout_ms)) {
    last_error =
        "gradd_attach: options not initialised (call gradd_options_init)";
    return GRADD_INVALID_ARGUMENT;
  }
  gradd::ClientOptions o;
  if (options->socket_path != nullptr) o.socket_path = options->socket_path;
  if (options->job_id != nullptr) o.job_id = options->job_id;
  o.local_rank = options->local_rank;
  o.local_world_size = options->local_world_size;
  o.bucket_cap_mb = options->bucket_cap_mb;
  o.first_bucket_cap_mb = options->first_bucket_cap_mb;
  o.broadcast_bytes = options->broadcast_bytes;
  o.connect_timeout = std::chrono::milliseconds(options->connect_timeout_ms);
  o.attach_timeout = std::chrono::milliseconds(options->attach_timeout_ms);
  if (GRADD_HAS_FIELD(options, wait_timeout_ms)) {
    o.wait_timeout = std::chrono::milliseconds(options->wait_timeout_ms);
  }
  if (GRADD_HAS_FIELD(options, find_unused_parameters)) {
    o.find_unused_parameters = options->find_unused_parameters != 0;
  }
  if (GRADD_HAS_FIELD(options, powersgd_random_seed)) {
    gradd::CommHookOptions& h = o.comm_hook;
    if (options->comm_hook != nullptr) h.name = options->comm_hook;
    h.matrix_approximation_rank = options->powersgd_matrix_approximation_rank;
    if (options->powersgd_start_iter != 0) {
      h.start_powersgd_iter =
          std::max<int64_t>(0, options->powersgd_start_iter);
    }
    h.min_compression_rate = options->powersgd_min_compression_rate;
    if (options->powersgd_use_error_feedback >= 0) {
      h.use_error_feedback = options->powersgd_use_error_feedback != 0;
    }
    if (options->powersgd_warm_start >= 0) {
      h.warm_start = options->powersgd_warm_start != 0;
    }
    h.orthogonalization_epsilon = options->powersgd_orthogonalization_epsilon;
    h.random_seed = options->powersgd_random_seed;
  }
  if (GRADD_HAS_FIELD(options, rank)) {
    if (options->num_nodes > 0) o.num_nodes = options->num_nodes;
    if (options->node_rank >= 0) o.node_rank = options->node_rank;
    if (options->node_id != nullptr) o.node_id = options->node_id;
    if (options->coordinator != nullptr) {
      o.coordinator = options->coordinator;
    }
    if (options->world_size > 0) o.world_size = options->world_size;
    if (options->rank >= 0) o.rank = options->rank;
  }

  std::vector<gradd::ClientParam> list(num_params);
  for (size_t i = 0; i < num_params; ++i) {
    const gradd_param& p = params[i];
    if (p.name == nullptr || (p.shape == nullptr && p.ndim > 0)) {
      last_error = absl::StrCat("gradd_attach: parameter ", i,
                                " has a NULL name or shape");
      return GRADD_INVALID_ARGUMENT;
    }
    list[i].name = p.name;
    list[i].shape.assign(p.shape, p.shape + p.ndim);
    list[i].dtype = p.dtype;
    if (GRADD_HAS_FIELD(options, cuda_device) &&
        options->param_devices != nullptr) {
      list[i].device = options->param_devices[i];
    }
  }
  if (GRADD_HAS_FIELD(options, cuda_device)) {
    o.cuda_device = options->cuda_device;
  }
  if (GRADD_HAS_FIELD(options, collective_bytes)) {
    o.collective_bytes = options->collective_bytes;
  }
  if (GRADD_HAS_FIELD(options, rank_restart_grace_ms) &&
      options->rank_restart_grace_ms >= 0) {
    if (options->rank_restart_grace_ms > UINT32_MAX) {
      last_error_aborted_iteration = false;
      last_error = absl::StrCat("gradd_attach: rank_restart_grace_ms ",
                                options->rank_restart_grace_ms,
                                " is out of range (0 to 4294967295)");
      return GRADD_INVALID_ARGUMENT;
    }
    o.rank_restart_grace_ms =
        static_cast<uint32_t>(options->rank_restart_grace_ms);
  }
  if (GRADD_HAS_FIELD(options, min_nodes) && options->min_nodes >= 0) {
    if (options->min_nodes > UINT32_MAX) {
      last_error_aborted_iteration = false;
      last_error = absl::StrCat("gradd_attach: min_nodes ", options->min_nodes,
                                " is out of range (0 to 4294967295)");
      return GRADD_INVALID_ARGUMENT;
    }
    o.min_nodes = static_cast<uint32_t>(options->min_nodes);
  }
  if (GRADD_HAS_FIELD(options, divide_by_initial_world_size)) {
    o.divide_by_initial_world_size = options->divide_by_initial_world_size != 0;
  }
  auto client = gradd::Client::Attach(o, list);
  if (!client.ok()) return Report(client.status());
  *out = new gradd_client{std::move(client).value()};
  return GRADD_OK;
}

const char* gradd_last_error(void) { return last_error.c_str(); }

void* gradd_gradient(const gradd_client* client, int param) {
  return client == nullptr ? nullptr : client->impl->gradient(param);
}

size_t gradd_gradient_bytes(const gradd_client* client, int param) {
  return client == nullptr ? 0 : client->impl->gradient_bytes(param);
}

int gradd_num_params(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->num_params();
}

int gradd_num_buckets(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->num_buckets();
}

int gradd_mark_ready(gradd_client* client, int param) {
  if (client == nullptr) return NullClient("gradd_mark_ready");
  return Report(client->impl->MarkReady(param));
}

int gradd_wait_all(gradd_client* client) {
  if (client == nullptr) return NullClient("gradd_wait_all");
  return Report(client->impl->WaitAll());
}

int gradd_mark_ready_on_stream(gradd_client* client, int param,
                               void* cuda_stream) {
  if (client == nullptr) return NullClient("gradd_mark_ready_on_stream");
  return Report(client->impl->MarkReadyOn(param, cuda_stream));
}

int gradd_wait_all_on_stream(gradd_client* client, void* cuda_stream) {
  if (client == nullptr) return NullClient("gradd_wait_all_on_stream");
  return Report(client->impl->WaitAllOn(cuda_stream));
}

int gradd_wait_bucket(gradd_client* client, int bucket) {
  if (client == nullptr) return NullClient("gradd_wait_bucket");
  return Report(client->impl->WaitBucket(bucket));
}

int gradd_wait_bucket_on_stream(gradd_client* client, int bucket,
                                void* cuda_stream) {
  if (client == nullptr) return NullClient("gradd_wait_bucket_on_stream");
  return Report(client->impl->WaitBucketOn(bucket, cuda_stream));
}

int gradd_gradient_device(const gradd_client* client, int param) {
  return client == nullptr ? GRADD_DEVICE_CPU
                           : client->impl->gradient_device(param);
}

int gradd_mark_unused(gradd_client* client, int param, int keep_gradient) {
  if (client == nullptr) return NullClient("gradd_mark_unused");
  return Report(client->impl->MarkUnused(
      param, keep_gradient ? gradd::UnusedGradient::kKeep
                           : gradd::UnusedGradient::kZero));
}

int gradd_globally_used(const gradd_client* client, int param) {
  return client != nullptr && client->impl->GloballyUsed(param) ? 1 : 0;
}

int gradd_skip_used_map(gradd_client* client) {
  if (client == nullptr) return NullClient("gradd_skip_used_map");
  return Report(client->impl->SkipUsedMap());
}

int gradd_broadcast(gradd_client* client, void* data, size_t bytes, int root) {
  if (client == nullptr) return NullClient("gradd_broadcast");
  return Report(client->impl->Broadcast(data, bytes, root));
}

int gradd_allreduce(gradd_client* client, void* data, size_t count,
                    int32_t dtype, int32_t op) {
  if (client == nullptr) return NullClient("gradd_allreduce");
  return Report(client->impl->Allreduce(data, count, dtype,
                                        static_cast<gradd::ReduceOp>(op)));
}

int gradd_allgather(gradd_client* client, const void* input, size_t bytes,
                    void* output) {
  if (client == nullptr) return NullClient("gradd_allgather");
  return Report(client->impl->Allgather(input, bytes, output));
}

int gradd_reduce_scatter(gradd_client* client, const void* input, void* output,
                         size_t count, int32_t dtype, int32_t op) {
  if (client == nullptr) return NullClient("gradd_reduce_scatter");
  return Report(client->impl->ReduceScatter(input, output, count, dtype,
                                            static_cast<gradd::ReduceOp>(op)));
}

int gradd_barrier(gradd_client* client) {
  if (client == nullptr) return NullClient("gradd_barrier");
  return Report(client->impl->Barrier());
}

int gradd_join_enter(gradd_client* client, int divide_by_initial_world_size,
                     int throw_on_early_termination) {
  if (client == nullptr) return NullClient("gradd_join_enter");
  gradd::JoinOptions options;
  options.divide_by_initial_world_size = divide_by_initial_world_size != 0;
  options.throw_on_early_termination = throw_on_early_termination != 0;
  return Report(client->impl->JoinEnter(options));
}

int gradd_join_active(gradd_client* client, void* sync_data,
                      size_t sync_bytes) {
  if (client == nullptr) return NullClient("gradd_join_active");
  return Report(client->impl->JoinActive(sync_data, sync_bytes));
}

int gradd_join(gradd_client* client, int* authoritative_rank) {
  if (client == nullptr) return NullClient("gradd_join");
  absl::StatusOr<gradd::JoinResult> r = client->impl->Join();
  if (r.ok() && authoritative_rank != nullptr) {
    *authoritative_rank = r->authoritative_rank;
  }
  return Report(r.status());
}

int gradd_in_join(const gradd_client* client) {
  return client != nullptr && client->impl->in_join() ? 1 : 0;
}

uint64_t gradd_iteration(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->iteration();
}

int gradd_rank(const gradd_client* client) {
  return client == nullptr ? -1 : client->impl->global_rank();
}

int gradd_world_size(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->world_size();
}

int gradd_local_rank(const gradd_client* client) {
  return client == nullptr ? -1 : client->impl->local_rank();
}

int gradd_local_world_size(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->local_world_size();
}

int gradd_rebuild_buckets(gradd_client* client, int* rebuilt) {
  if (client == nullptr) return NullClient("gradd_rebuild_buckets");
  absl::StatusOr<bool> r = client->impl->RebuildBuckets();
  if (r.ok() && rebuilt != nullptr) *rebuilt = *r ? 1 : 0;
  return Report(r.status());
}

int gradd_buckets_rebuilt(const gradd_client* client) {
  return client != nullptr && client->impl->buckets_rebuilt() ? 1 : 0;
}

int gradd_last_error_is_iteration_aborted(void) {
  return last_error_aborted_iteration ? 1 : 0;
}

int gradd_restarted(const gradd_client* client) {
  return client != nullptr && client->impl->restarted() ? 1 : 0;
}

int gradd_rejoined(const gradd_client* client) {
  return gradd_restarted(client);
}

int gradd_state_sync_pending(const gradd_client* client) {
  return client != nullptr && client->impl->StateSyncPending() ? 1 : 0;
}

int gradd_begin_state_sync(gradd_client* client, int* root) {
  if (client == nullptr) return NullClient("gradd_begin_state_sync");
  absl::StatusOr<int> r = client->impl->BeginStateSync();
  if (r.ok() && root != nullptr) *root = *r;
  return Report(r.status());
}

uint32_t gradd_rank_restart_grace_ms(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->rank_restart_grace_ms();
}

uint64_t gradd_iterations_aborted(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->iterations_aborted();
}

uint64_t gradd_restarts(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->restarts();
}

uint32_t gradd_min_nodes(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->min_nodes();
}

int gradd_live_world_size(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->live_world_size();
}

uint64_t gradd_epoch(const gradd_client* client) {
  return client == nullptr ? 0 : client->impl->epoch();
}

int gradd_detach(gradd_client* client) {
  if (client == nullptr) return NullClient("gradd_detach");
  return Report(client->impl->Detach());
}

void gradd_free(gradd_client* client) { delete client; }

}  // extern "C"
