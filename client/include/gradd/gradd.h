/* gradd client library, C ABI (C99-compatible header; C++ callers may use
 * gradd/client.h instead).
 *
 * Every function that can fail returns an int status code with the numeric
 * values of absl::StatusCode / gRPC codes (GRADD_OK = 0); the message of the
 * last failure on the calling thread is gradd_last_error(). The library
 * never aborts the process.
 *
 *   gradd_options opts;
 *   gradd_options_init(&opts);
 *   opts.job_id = "job"; opts.local_rank = r; opts.local_world_size = n;
 *   gradd_client* c;
 *   if (gradd_attach(&opts, params, num_params, &c) != GRADD_OK) {
 *     fprintf(stderr, "%s\n", gradd_last_error());
 *   }
 *   for (...) {
 *     write gradients into gradd_gradient(c, i); gradd_mark_ready(c, i);
 *     gradd_wait_all(c);      averaged gradients are now in place
 *   }
 *   gradd_free(c);            detaches too
 *
 * Thread safety: as gradd::Client (gradd_mark_ready from several threads at
 * once; everything else from one thread at a time).
 */
#ifndef GRADD_CLIENT_INCLUDE_GRADD_GRADD_H_
#define GRADD_CLIENT_INCLUDE_GRADD_GRADD_H_

#include <stddef.h>
#include <stdint.h>

/* Marks a function kept for one release under an old name: compilers that
 * know the attribute warn where it is called. */
#if defined(__GNUC__) || defined(__clang__)
#define GRADD_DEPRECATED(why) __attribute__((deprecated(why)))
#else
#define GRADD_DEPRECATED(why)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes (absl::StatusCode values). */
enum {
  GRADD_OK = 0,
  GRADD_CANCELLED = 1,
  GRADD_UNKNOWN = 2,
  GRADD_INVALID_ARGUMENT = 3,
  GRADD_DEADLINE_EXCEEDED = 4,
  GRADD_NOT_FOUND = 5,
  GRADD_ALREADY_EXISTS = 6,
  GRADD_PERMISSION_DENIED = 7,
  GRADD_RESOURCE_EXHAUSTED = 8,
  GRADD_FAILED_PRECONDITION = 9,
  GRADD_ABORTED = 10,
  GRADD_OUT_OF_RANGE = 11,
  GRADD_UNIMPLEMENTED = 12,
  GRADD_INTERNAL = 13,
  GRADD_UNAVAILABLE = 14,
  GRADD_DATA_LOSS = 15,
  GRADD_UNAUTHENTICATED = 16
};

/* Element types (gradd.v1.DType values). */
enum {
  GRADD_FLOAT32 = 1,
  GRADD_FLOAT64 = 2,
  GRADD_FLOAT16 = 3,
  GRADD_BFLOAT16 = 4,
  /* Collectives only (gradd_allreduce ...), not gradient parameters. */
  GRADD_INT32 = 5,
  GRADD_INT64 = 6,
  GRADD_UINT8 = 7,
  GRADD_INT8 = 8
};

/* Reductions of gradd_allreduce / gradd_reduce_scatter (gradd::ReduceOp).
 * GRADD_AVG divides the sum by the world size; integers refuse it. */
enum { GRADD_SUM = 0, GRADD_AVG = 1, GRADD_MIN = 2, GRADD_MAX = 3 };

typedef struct gradd_client gradd_client;

/* Fill with gradd_options_init() first, then set what you need: fields added
 * in later versions go at the end and struct_size tells the library which
 * ones the caller knows about. Strings are copied by gradd_attach. */
typedef struct gradd_options {
  size_t struct_size;
  const char* socket_path;    /* NULL or "": $GRADD_SOCKET, else the default */
  const char* job_id;         /* NULL: "default" */
  int32_t local_rank;         /* -1 (init): $LOCAL_RANK, else 0 */
  int32_t local_world_size;   /* 0 (init): $LOCAL_WORLD_SIZE, else 1 */
  double bucket_cap_mb;       /* 0: the daemon's default (25) */
  double first_bucket_cap_mb; /* 0: the daemon's default (1) */
  size_t broadcast_bytes;     /* 0: no gradd_broadcast */
  int64_t connect_timeout_ms; /* defaults 10000 / 120000 / 600000 */
  int64_t attach_timeout_ms;
  int64_t wait_timeout_ms;
  /* Nonzero: track which parameters each rank used (torch DDP's
   * find_unused_parameters); enables gradd_mark_unused and
   * gradd_globally_used. Every rank of a job must agree. */
  int32_t find_unused_parameters;
  /* The job's communication hook, run by the daemon between the local
   * reduce and the network: NULL or "" = the daemon's default_comm_hook;
   * "allreduce", "fp16_compress", "bf16_compress", "powerSGD",
   * "batched_powerSGD". Every rank must choose the same. */
  const char* comm_hook;
  /* PowerSGD only (torch's PowerSGDState); 0 = torch's default
   * (start_iter: 1000; -1 = 0, compress from the first iteration), and for
   * the two flags -1 = default (on), 0 = off, 1 = on. */
  int32_t powersgd_matrix_approximation_rank;
  int64_t powersgd_start_iter;
  double powersgd_min_compression_rate;
  int32_t powersgd_use_error_feedback;
  int32_t powersgd_warm_start;
  double powersgd_orthogonalization_epsilon;
  uint64_t powersgd_random_seed;
  /* Multi-node jobs. Unset (the init values) = from the launcher's
   * environment like the C++ and Python clients: torchrun's
   * GROUP_WORLD_SIZE (else WORLD_SIZE / LOCAL_WORLD_SIZE), GROUP_RANK,
   * MASTER_ADDR, WORLD_SIZE, RANK; gradd's GRADD_NUM_NODES,
   * GRADD_NODE_RANK, GRADD_NODE_ID, GRADD_COORDINATOR. */
  int32_t num_nodes;       /* 0: environment, else 1 */
  int32_t node_rank;       /* -1: environment, else in node id order */
  const char* node_id;     /* NULL / "": $GRADD_NODE_ID, else the daemon's */
  const char* coordinator; /* NULL / "": coordinator host from the env */
  /* The world the launcher started; -1 / 0: $RANK / $WORLD_SIZE, else not
   * checked. gradd_attach fails with GRADD_FAILED_PRECONDITION naming both
   * numbers when the daemons formed another world. */
  int32_t world_size;
  int32_t rank;
  /* GPU path. param_devices: NULL (every parameter in host memory) or one
   * entry per parameter, GRADD_DEVICE_CPU or GRADD_DEVICE_CUDA; CUDA
   * gradients live on GPU cuda_device (this process's ordinal) in device
   * memory the daemon allocates; use the _on_stream calls for them. */
  const int32_t* param_devices;
  int32_t cuda_device;
  /* Bytes of this rank's shared collective area (gradd_allreduce ...); 0:
   * 4 MiB for a job with no parameters, else no collectives. Every local
   * rank must choose the same. */
  size_t collective_bytes;
  /* Rank restart (see gradd_begin_state_sync): how long the daemon keeps
   * the job waiting for a local rank whose process died before failing it.
   * -1 (init): $GRADD_RANK_RESTART_GRACE_MS if set, else the daemon's
   * rank_restart_grace_ms; 0: the job fails at once (GRADD_ABORTED); > 0
   * also gives the job the default collective area when neither
   * broadcast_bytes nor collective_bytes asks for one. Every local rank must
   * choose the same; a restarted process names its job_id explicitly. */
  int64_t rank_restart_grace_ms;
  /* Node loss and arrival (see gradd_live_world_size): the smallest number
   * of nodes the job goes on with when a node dies. -1 (init):
   * $GRADD_MIN_NODES if set, else the daemon's min_nodes; 0: the job needs
   * all its nodes. Every rank on every node must choose the same. */
  int64_t min_nodes;
  /* Nonzero: after a node is lost or added, average over the job's initial
   * world size instead of the live one. */
  int32_t divide_by_initial_world_size;
} gradd_options;

enum { GRADD_DEVICE_CPU = 0, GRADD_DEVICE_CUDA = 1 };

typedef struct gradd_param {
  const char* name;
  const int64_t* shape;
  size_t ndim;
  int32_t dtype; /* GRADD_FLOAT32, ... */
} gradd_param;

void gradd_options_init(gradd_options* options);

/* Attaches as one local rank and registers `num_params` parameters; blocks
 * until every local rank of the job attached. On success *out owns the
 * client (release with gradd_free). */
int gradd_attach(const gradd_options* options, const gradd_param* params,
                 size_t num_params, gradd_client** out);

/* Message of the last failed call on this thread ("" if none). Valid until
 * the next gradd call on this thread. */
const char* gradd_last_error(void);

/* Parameter `param`'s gradient in shared bucket memory; NULL / 0 for an
 * unknown index. Stable until gradd_free, except across
 * gradd_rebuild_buckets. */
void* gradd_gradient(const gradd_client* client, int param);
size_t gradd_gradient_bytes(const gradd_client* client, int param);
int gradd_num_params(const gradd_client* client);
int gradd_num_buckets(const gradd_client* client);

int gradd_mark_ready(gradd_client* client, int param);
int gradd_wait_all(gradd_client* client);
/* CUDA parameters: as gradd_mark_ready / gradd_wait_all, ordered on
 * `cuda_stream` (a cudaStream_t / CUstream; NULL: the legacy default
 * stream) without host syncs: the stream records the bucket's ready event,
 * and later waits for the daemon's reduction (gradd::Client::MarkReadyOn /
 * WaitAllOn). */
int gradd_mark_ready_on_stream(gradd_client* client, int param,
                               void* cuda_stream);
int gradd_wait_all_on_stream(gradd_client* client, void* cuda_stream);
/* Blocks until bucket `bucket` (0 .. gradd_num_buckets - 1) of the
 * current iteration is averaged, without ending the iteration (that is
 * gradd_wait_all, cheap once every bucket was waited for): a trainer may
 * use the first buckets' gradients while later ones are still reduced.
 * Every parameter of the bucket must have been marked this iteration
 * (else GRADD_FAILED_PRECONDITION); GRADD_OUT_OF_RANGE for an unknown
 * bucket; otherwise gradd_wait_all's errors (gradd::Client::WaitBucket).
 * The _on_stream form also makes `cuda_stream` wait for a CUDA bucket's
 * reduction. */
int gradd_wait_bucket(gradd_client* client, int bucket);
int gradd_wait_bucket_on_stream(gradd_client* client, int bucket,
                                void* cuda_stream);
/* GRADD_DEVICE_CUDA when gradd_gradient(param) is device memory. */
int gradd_gradient_device(const gradd_client* client, int param);

/* find_unused_parameters only: marks `param` ready without counting it as
 * used by this rank; keep_gradient = 0 zeroes its gradient first (contributes
 * nothing), nonzero contributes what the memory holds. */
int gradd_mark_unused(gradd_client* client, int param, int keep_gradient);
/* After gradd_wait_all: 1 if some rank marked `param` with gradd_mark_ready
 * in the iteration just waited for, else 0 (always 1 without
 * find_unused_parameters; 0 for an unknown index). */
int gradd_globally_used(const gradd_client* client, int param);
/* find_unused_parameters only: this iteration needs no used map; hands its
 * slot over now (every parameter counts as used). */
int gradd_skip_used_map(gradd_client* client);
int gradd_broadcast(gradd_client* client, void* data, size_t bytes, int root);

/* Collectives of arbitrary data between the job's ranks (see
 * gradd/collectives.h): blocking, every rank must issue the same sequence
 * with the same sizes, dtype and op (else the job fails with
 * GRADD_INVALID_ARGUMENT naming the ranks). Data of any size is chunked
 * through the collective area (gradd_options.collective_bytes).
 *   gradd_allreduce: in place over `count` elements of `dtype`, `op`
 *     GRADD_SUM / AVG / MIN / MAX.
 *   gradd_allgather: output (world_size * bytes) = every rank's input, in
 *     rank order.
 *   gradd_reduce_scatter: input world_size * count elements; output this
 *     rank's block of the reduction (count elements). */
int gradd_allreduce(gradd_client* client, void* data, size_t count,
                    int32_t dtype, int32_t op);
int gradd_allgather(gradd_client* client, const void* input, size_t bytes,
                    void* output);
int gradd_reduce_scatter(gradd_client* client, const void* input, void* output,
                         size_t count, int32_t dtype, int32_t op);
int gradd_barrier(gradd_client* client);

/* Uneven inputs (DDP's join), as gradd::Client::JoinEnter / JoinActive /
 * Join: enter join mode before the same iteration on every rank; a rank out
 * of inputs calls gradd_join, which blocks until every rank joined and
 * stores the authoritative rank (whose model to copy) in
 * *authoritative_rank (may be NULL). */
int gradd_join_enter(gradd_client* client, int divide_by_initial_world_size,
                     int throw_on_early_termination);
int gradd_join_active(gradd_client* client, void* sync_data, size_t sync_bytes);
int gradd_join(gradd_client* client, int* authoritative_rank);
/* 1 while in join mode, else 0. */
int gradd_in_join(const gradd_client* client);

/* Current (not yet waited) iteration, from 1. */
uint64_t gradd_iteration(const gradd_client* client);
int gradd_rank(const gradd_client* client);
int gradd_world_size(const gradd_client* client);
int gradd_local_rank(const gradd_client* client);
int gradd_local_world_size(const gradd_client* client);

/* Bucket rebuild (see gradd::Client::RebuildBuckets): call between
 * gradd_wait_all and the next gradd_mark_ready, on every rank. *rebuilt
 * (may be NULL) says whether the buckets were re-planned; gradient pointers
 * change then. */
int gradd_rebuild_buckets(gradd_client* client, int* rebuilt);
/* 1 once the buckets were rebuilt, else 0. */
int gradd_buckets_rebuilt(const gradd_client* client);

/* Rank restart (gradd::Client::restarted ... BeginStateSync; the job's
 * rank_restart_grace_ms > 0). When a rank of the job dies and its new
 * process attaches again within the grace, the iteration (or collective) in
 * progress is aborted on every rank: gradd_wait_all (or the collective)
 * returns GRADD_ABORTED and gradd_last_error_is_iteration_aborted() returns
 * 1; the averages were not computed, the next iteration has begun. Skip the
 * optimizer step, then retry the batch after the state sync:
 *
 *   rc = gradd_wait_all(c);
 *   if (rc == GRADD_ABORTED && gradd_last_error_is_iteration_aborted()) {
 *     retry the same batch (no optimizer step)
 *   } else if (rc != GRADD_OK) { the job failed }
 *   ...before each iteration:
 *   if (gradd_state_sync_pending(c)) {
 *     int root;
 *     if (gradd_begin_state_sync(c, &root) == GRADD_OK)
 *       gradd_broadcast(c, model_state, bytes, root);
 *   }
 *
 * Why a separate query and not a new return code: the codes stay the
 * canonical absl::StatusCode values (as in C++ and Python), and a caller
 * that treats every non-OK code as the job's failure stays correct without
 * knowing about restarts (it merely gives up where it could go on).
 *
 * 1 if the last failed gradd call on this thread was an aborted iteration or
 * collective round (the job goes on), 0 otherwise (any other failure is the
 * job's). */
int gradd_last_error_is_iteration_aborted(void);
/* 1 when this attach re-attached a restarted rank to its running job (its
 * first iteration is then gradd_iteration(), past 1), else 0. */
int gradd_restarted(const gradd_client* client);
/* The name gradd_restarted had until this release ("join" is only uneven
 * inputs now); removed in the next one. */
int gradd_rejoined(const gradd_client* client) GRADD_DEPRECATED(
    "use gradd_restarted; gradd_rejoined goes in the next "
    "release");
/* 1 when a state sync is due before the next iteration, else 0: a rank of
 * the job restarted since this rank last synced, or this rank restarted and
 * has not synced yet. Every rank sees the same at the same point. */
int gradd_state_sync_pending(const gradd_client* client);
/* The state sync's first step (a collective: every rank calls it): stores
 * in *root the lowest global rank holding the job's state; then broadcast
 * the state (parameters, step counter, ...) from *root with gradd_broadcast.
 * GRADD_FAILED_PRECONDITION when no rank holds it; GRADD_ABORTED (iteration
 * aborted) when another restart interrupted it: call it again. */
int gradd_begin_state_sync(gradd_client* client, int* root);
/* The grace the job runs with (0: none); iterations this rank saw aborted
 * by restarts; restarted ranks re-attached to the job so far. */
uint32_t gradd_rank_restart_grace_ms(const gradd_client* client);
uint64_t gradd_iterations_aborted(const gradd_client* client);
uint64_t gradd_restarts(const gradd_client* client);

/* Node loss and arrival (gradd_options.min_nodes > 0). When a node of the
 * job dies, comes back or one of its ranks restarts, the daemons re-form
 * their network at an iteration boundary: the iteration in progress is
 * aborted on every rank as for a rank restart (GRADD_ABORTED with
 * gradd_last_error_is_iteration_aborted(), then the state sync); global
 * ranks never change. The job's min_nodes (0: not elastic); the global
 * ranks taking part now; re-formations so far. */
uint32_t gradd_min_nodes(const gradd_client* client);
int gradd_live_world_size(const gradd_client* client);
uint64_t gradd_epoch(const gradd_client* client);

/* Clean goodbye; the client stays valid until gradd_free (further calls
 * fail with GRADD_FAILED_PRECONDITION). */
int gradd_detach(gradd_client* client);
/* Detaches (if needed) and releases the client; NULL is allowed. */
void gradd_free(gradd_client* client);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GRADD_CLIENT_INCLUDE_GRADD_GRADD_H_ */
