/* Proves the C ABI (gradd/gradd.h) is usable from C: compiled as C11.
 *
 *   gradd_c_trainer nodaemon SOCKET      attach must fail with
 *                                        GRADD_UNAVAILABLE naming SOCKET
 *   gradd_c_trainer train SOCKET JOB RANK WORLD ITERATIONS [COMM_HOOK]
 *                                        float32 + float64 params, every
 *                                        average checked exactly (the
 *                                        values are exact in 16 bits too)
 *   gradd_c_trainer torchrun JOB ITERATIONS [COMM_HOOK]
 *                                        train, with everything else from
 *                                        torchrun's environment (and
 *                                        GRADD_SOCKET): local rank, local
 *                                        world, nodes, node rank, world
 *   gradd_c_trainer unused SOCKET JOB RANK WORLD
 *                                        find_unused_parameters: "w" used
 *                                        by rank 0 only, "b" by nobody
 *   gradd_c_trainer badhook SOCKET       attach with an unknown comm hook
 *                                        must fail naming the known ones
 *   gradd_c_trainer fakecuda SOCKET JOB RANK WORLD ITERATIONS
 *                                        CUDA parameters on the daemon's
 *                                        fake GPU (GRADD_FAKE_GPU_UUID):
 *                                        device memory written through the
 *                                        host mapping, the _on_stream calls
 * Prints PASS and exits 0, or prints why and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradd/gradd.h"

static int NoDaemon(const char* socket) {
  gradd_options opts;
  gradd_options_init(&opts);
  opts.socket_path = socket;
  opts.connect_timeout_ms = 300;
  gradd_client* client = (gradd_client*)1;
  int rc = gradd_attach(&opts, NULL, 0, &client);
  if (rc != GRADD_UNAVAILABLE || client != NULL) {
    printf("FAIL: attach returned %d (%s)\n", rc, gradd_last_error());
    return 1;
  }
  if (strstr(gradd_last_error(), socket) == NULL) {
    printf("FAIL: error does not name %s: %s\n", socket, gradd_last_error());
    return 1;
  }
  printf("PASS %s\n", gradd_last_error());
  return 0;
}

/* Options for local rank `rank` of `world` in `job`, with 20 s attach and
 * wait timeouts (bounded, and ample on a loaded machine). rank < 0 leaves
 * the socket, rank and world to the environment. */
static void JobOptions(gradd_options* opts, const char* socket, const char* job,
                       int rank, int world) {
  gradd_options_init(opts);
  opts->job_id = job;
  if (rank >= 0) {
    opts->socket_path = socket;
    opts->local_rank = rank;
    opts->local_world_size = world;
  }
  opts->attach_timeout_ms = 20000;
  opts->wait_timeout_ms = 20000;
}

/* g = c + (2r - (L-1)) / 2 with c a small multiple of 1/2: the average is
 * exactly c (see test_trainer.cc). */
static double Expected(unsigned long long t, int p, size_t j) {
  return (double)((long long)((j + 5 * t + 11 * (unsigned)p) % 41) - 20) * 0.5;
}

static int BadHook(const char* socket) {
  static const int64_t shape[] = {4};
  gradd_param param = {"w", shape, 1, GRADD_FLOAT32};
  gradd_options opts;
  gradd_options_init(&opts);
  opts.socket_path = socket;
  opts.job_id = "badhook";
  opts.comm_hook = "fp8_compress";
  gradd_client* client = NULL;
  int rc = gradd_attach(&opts, &param, 1, &client);
  if (rc != GRADD_INVALID_ARGUMENT ||
      strstr(gradd_last_error(), "fp8_compress") == NULL ||
      strstr(gradd_last_error(), "fp16_compress") == NULL) {
    printf("FAIL: attach returned %d (%s)\n", rc, gradd_last_error());
    return 1;
  }
  printf("PASS %s\n", gradd_last_error());
  return 0;
}

static int Train(const char* socket, const char* job, int rank, int world,
                 int iterations, const char* comm_hook) {
  static const int64_t shape0[] = {3, 5};
  static const int64_t shape1[] = {1000};
  static const int64_t shape2[] = {7};
  gradd_param params[3] = {{"w", shape0, 2, GRADD_FLOAT32},
                           {"big", shape1, 1, GRADD_FLOAT64},
                           {"b", shape2, 1, GRADD_FLOAT32}};
  gradd_options opts;
  JobOptions(&opts, socket, job, rank, world);
  opts.comm_hook = comm_hook;
  gradd_client* c = NULL;
  if (gradd_attach(&opts, params, 3, &c) != GRADD_OK) {
    printf("FAIL attach: %s\n", gradd_last_error());
    return 1;
  }
  if (rank < 0) {
    /* From the environment: the job must be the one torchrun started. */
    world = gradd_world_size(c);
    if (world != atoi(getenv("WORLD_SIZE")) ||
        gradd_rank(c) != atoi(getenv("RANK")) ||
        gradd_local_rank(c) != atoi(getenv("LOCAL_RANK")) ||
        gradd_local_world_size(c) != atoi(getenv("LOCAL_WORLD_SIZE"))) {
      printf("FAIL: rank %d of %d (local %d of %d) is not torchrun's\n",
             gradd_rank(c), world, gradd_local_rank(c),
             gradd_local_world_size(c));
      return 1;
    }
    rank = gradd_local_rank(c);
  } else if (gradd_world_size(c) != world) {
    printf("FAIL: world size %d, want %d\n", gradd_world_size(c), world);
    return 1;
  }
  if (gradd_num_params(c) != 3 || gradd_local_rank(c) != rank ||
      gradd_gradient(c, 3) != NULL || gradd_gradient_bytes(c, 1) != 8000) {
    printf("FAIL: getters disagree with the registration\n");
    return 1;
  }
  /* A first attach is no restart; gradd_rejoined, the deprecated name of
   * gradd_restarted, still answers the same for this release. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const int rejoined = gradd_rejoined(c);
#pragma GCC diagnostic pop
  if (gradd_restarted(c) != 0 || rejoined != gradd_restarted(c)) {
    printf("FAIL: restarted %d, rejoined %d on a first attach\n",
           gradd_restarted(c), rejoined);
    return 1;
  }
  int rc = gradd_mark_ready(c, 3);
  if (rc != GRADD_OUT_OF_RANGE) {
    printf("FAIL: mark_ready(3) returned %d\n", rc);
    return 1;
  }
  const double rank_term = (2.0 * gradd_rank(c) - (world - 1)) / 2;
  for (int it = 0; it < iterations; ++it) {
    unsigned long long t = gradd_iteration(c);
    if (it == 1) {
      /* Bucket rebuild after the first iteration, as DDP does. */
      int rebuilt = 0;
      if (gradd_rebuild_buckets(c, &rebuilt) != GRADD_OK || !rebuilt ||
          !gradd_buckets_rebuilt(c)) {
        printf("FAIL rebuild_buckets (rebuilt=%d): %s\n", rebuilt,
               gradd_last_error());
        return 1;
      }
    }
    if (it == 0 && gradd_wait_bucket(c, 0) != GRADD_FAILED_PRECONDITION) {
      /* Nothing of bucket 0 is marked yet. */
      printf("FAIL: wait_bucket before any mark did not fail\n");
      return 1;
    }
    for (int p = 2; p >= 0; --p) {
      void* g = gradd_gradient(c, p);
      int is_double = params[p].dtype == GRADD_FLOAT64;
      size_t n = gradd_gradient_bytes(c, p) / (is_double ? 8 : 4);
      for (size_t j = 0; j < n; ++j) {
        double v = Expected(t, p, j) + rank_term;
        if (is_double)
          ((double*)g)[j] = v;
        else
          ((float*)g)[j] = (float)v;
      }
      if (gradd_mark_ready(c, p) != GRADD_OK) {
        printf("FAIL mark_ready: %s\n", gradd_last_error());
        return 1;
      }
    }
    if (it % 2 == 1) {
      /* Every other iteration: bucket by bucket (last first, then again),
       * then the iteration's end. */
      const int buckets = gradd_num_buckets(c);
      if (gradd_wait_bucket(c, buckets) != GRADD_OUT_OF_RANGE ||
          gradd_wait_bucket(c, -1) != GRADD_OUT_OF_RANGE) {
        printf("FAIL: wait_bucket out of range did not say so\n");
        return 1;
      }
      for (int b = buckets - 1; b >= 0; --b) {
        if (gradd_wait_bucket(c, b) != GRADD_OK ||
            gradd_wait_bucket(c, b) != GRADD_OK) {
          printf("FAIL wait_bucket(%d): %s\n", b, gradd_last_error());
          return 1;
        }
      }
      if (gradd_iteration(c) != t) {
        printf("FAIL: wait_bucket ended iteration %llu\n", t);
        return 1;
      }
    }
    if (gradd_wait_all(c) != GRADD_OK) {
      printf("FAIL wait_all: %s\n", gradd_last_error());
      return 1;
    }
    for (int p = 0; p < 3; ++p) {
      const void* g = gradd_gradient(c, p);
      int is_double = params[p].dtype == GRADD_FLOAT64;
      size_t n = gradd_gradient_bytes(c, p) / (is_double ? 8 : 4);
      for (size_t j = 0; j < n; ++j) {
        double got = is_double ? ((const double*)g)[j] : ((const float*)g)[j];
        if (got != Expected(t, p, j)) {
          printf("FAIL: iteration %llu %s[%zu] = %g, want %g\n", t,
                 params[p].name, j, got, Expected(t, p, j));
          return 1;
        }
      }
    }
  }
  if (gradd_detach(c) != GRADD_OK) {
    printf("FAIL detach: %s\n", gradd_last_error());
    return 1;
  }
  if (gradd_wait_all(c) != GRADD_FAILED_PRECONDITION) {
    printf("FAIL: wait_all after detach did not fail\n");
    return 1;
  }
  if (gradd_wait_bucket(c, 0) != GRADD_FAILED_PRECONDITION) {
    printf("FAIL: wait_bucket after detach did not fail\n");
    return 1;
  }
  printf("PASS iterations=%d rank=%d world=%d\n", iterations, gradd_rank(c),
         world);
  gradd_free(c);
  return 0;
}

static int Unused(const char* socket, const char* job, int rank, int world) {
  static const int64_t shape[] = {4};
  gradd_param params[2] = {{"w", shape, 1, GRADD_FLOAT32},
                           {"b", shape, 1, GRADD_FLOAT32}};
  gradd_options opts;
  JobOptions(&opts, socket, job, rank, world);
  opts.find_unused_parameters = 1;
  gradd_client* c = NULL;
  if (gradd_attach(&opts, params, 2, &c) != GRADD_OK) {
    printf("FAIL attach: %s\n", gradd_last_error());
    return 1;
  }
  if (gradd_num_params(c) != 2 || gradd_gradient(c, 2) != NULL) {
    printf("FAIL: the used map is visible\n");
    return 1;
  }
  float* w = (float*)gradd_gradient(c, 0);
  for (int j = 0; j < 4; ++j) w[j] = (float)(world * (rank == 0));
  int rc = rank == 0 ? gradd_mark_ready(c, 0) : gradd_mark_unused(c, 0, 0);
  if (rc != GRADD_OK || gradd_mark_unused(c, 1, 0) != GRADD_OK ||
      gradd_wait_all(c) != GRADD_OK) {
    printf("FAIL iteration: %s\n", gradd_last_error());
    return 1;
  }
  if (gradd_globally_used(c, 0) != 1 || gradd_globally_used(c, 1) != 0 ||
      gradd_globally_used(c, 2) != 0 || w[0] != 1.0f || w[3] != 1.0f) {
    printf("FAIL: used %d %d, w[0] = %g\n", gradd_globally_used(c, 0),
           gradd_globally_used(c, 1), w[0]);
    return 1;
  }
  gradd_free(c);
  printf("PASS unused\n");
  return 0;
}

static int FakeCuda(const char* socket, const char* job, int rank, int world,
                    int iterations) {
  static const int64_t shape0[] = {300};
  static const int64_t shape1[] = {7};
  gradd_param params[2] = {{"w", shape0, 1, GRADD_FLOAT32},
                           {"b", shape1, 1, GRADD_FLOAT32}};
  static const int32_t devices[2] = {GRADD_DEVICE_CUDA, GRADD_DEVICE_CUDA};
  gradd_options opts;
  JobOptions(&opts, socket, job, rank, world);
  opts.param_devices = devices;
  opts.cuda_device = 0;
  gradd_client* c = NULL;
  if (gradd_attach(&opts, params, 2, &c) != GRADD_OK) {
    printf("FAIL attach: %s\n", gradd_last_error());
    return 1;
  }
  if (gradd_gradient_device(c, 0) != GRADD_DEVICE_CUDA ||
      gradd_gradient_device(c, 1) != GRADD_DEVICE_CUDA) {
    printf("FAIL: gradients are not device memory\n");
    return 1;
  }
  const double rank_term = (2.0 * gradd_rank(c) - (world - 1)) / 2;
  for (int it = 0; it < iterations; ++it) {
    unsigned long long t = gradd_iteration(c);
    for (int p = 1; p >= 0; --p) {
      float* g = (float*)gradd_gradient(c, p);
      size_t n = gradd_gradient_bytes(c, p) / sizeof(float);
      for (size_t j = 0; j < n; ++j) {
        g[j] = (float)(Expected(t, p, j) + rank_term);
      }
      if (gradd_mark_ready_on_stream(c, p, NULL) != GRADD_OK) {
        printf("FAIL mark_ready_on_stream: %s\n", gradd_last_error());
        return 1;
      }
    }
    if (gradd_wait_all_on_stream(c, NULL) != GRADD_OK) {
      printf("FAIL wait_all_on_stream: %s\n", gradd_last_error());
      return 1;
    }
    for (int p = 0; p < 2; ++p) {
      const float* g = (const float*)gradd_gradient(c, p);
      size_t n = gradd_gradient_bytes(c, p) / sizeof(float);
      for (size_t j = 0; j < n; ++j) {
        if (g[j] != (float)Expected(t, p, j)) {
          printf("FAIL iteration %llu param %d [%zu] = %g, want %g\n", t, p, j,
                 g[j], Expected(t, p, j));
          return 1;
        }
      }
    }
  }
  gradd_free(c);
  printf("PASS\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "nodaemon") == 0) return NoDaemon(argv[2]);
  if (argc == 3 && strcmp(argv[1], "badhook") == 0) return BadHook(argv[2]);
  if ((argc == 7 || argc == 8) && strcmp(argv[1], "train") == 0) {
    return Train(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]),
                 argc == 8 ? argv[7] : NULL);
  }
  if ((argc == 4 || argc == 5) && strcmp(argv[1], "torchrun") == 0) {
    return Train(NULL, argv[2], -1, 0, atoi(argv[3]),
                 argc == 5 ? argv[4] : NULL);
  }
  if (argc == 7 && strcmp(argv[1], "fakecuda") == 0) {
    return FakeCuda(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]),
                    atoi(argv[6]));
  }
  if (argc == 6 && strcmp(argv[1], "unused") == 0) {
    return Unused(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
  }
  fprintf(stderr,
          "usage: %s nodaemon SOCKET | train SOCKET JOB RANK WORLD N | "
          "torchrun JOB N [HOOK] | "
          "unused SOCKET JOB RANK WORLD\n",
          argv[0]);
  return 2;
}
