/* The join (uneven inputs) part of the C ABI, used from C (C11):
 *
 *   gradd_c_join_trainer SOCKET JOB RANK WORLD DIVIDE
 *     rank r has 2 + r inputs and writes (r + 1) * t in iteration t; every
 *     average is checked exactly against the ranks still active (divided by
 *     WORLD, or by their number with DIVIDE 0); then gradd_join must name
 *     the last joiner (WORLD - 1) and a plain iteration must follow.
 * Prints PASS and exits 0, or prints why and exits 1. */
#include <stdio.h>
#include <stdlib.h>

#include "gradd/gradd.h"

static int Step(gradd_client* c, float value) {
  for (int p = 1; p >= 0; --p) {
    float* g = (float*)gradd_gradient(c, p);
    size_t n = gradd_gradient_bytes(c, p) / sizeof(float);
    for (size_t j = 0; j < n; ++j) g[j] = value;
    if (gradd_mark_ready(c, p) != GRADD_OK) return 1;
  }
  return gradd_wait_all(c) != GRADD_OK;
}

static int Check(gradd_client* c, float want, const char* what) {
  for (int p = 0; p < 2; ++p) {
    const float* g = (const float*)gradd_gradient(c, p);
    size_t n = gradd_gradient_bytes(c, p) / sizeof(float);
    for (size_t j = 0; j < n; ++j) {
      if (g[j] != want) {
        printf("FAIL %s: param %d [%zu] = %g, want %g\n", what, p, j, g[j],
               want);
        return 1;
      }
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    printf("usage: %s SOCKET JOB RANK WORLD DIVIDE\n", argv[0]);
    return 2;
  }
  const int rank = atoi(argv[3]);
  const int world = atoi(argv[4]);
  const int divide = atoi(argv[5]);
  static const int64_t shape0[] = {600};
  static const int64_t shape1[] = {40};
  gradd_param params[2] = {{"w", shape0, 1, GRADD_FLOAT32},
                           {"b", shape1, 1, GRADD_FLOAT32}};
  gradd_options opts;
  gradd_options_init(&opts);
  opts.socket_path = argv[1];
  opts.job_id = argv[2];
  opts.local_rank = rank;
  opts.local_world_size = world;
  opts.first_bucket_cap_mb = 0.001; /* two buckets */
  opts.bucket_cap_mb = 0.001;
  opts.attach_timeout_ms = 20000;
  opts.wait_timeout_ms = 20000;
  gradd_client* c = NULL;
  if (gradd_attach(&opts, params, 2, &c) != GRADD_OK) {
    printf("FAIL attach: %s\n", gradd_last_error());
    return 1;
  }
  if (gradd_join_enter(c, divide, 0) != GRADD_OK || !gradd_in_join(c)) {
    printf("FAIL join_enter: %s\n", gradd_last_error());
    return 1;
  }
  for (int t = 1; t <= 2 + rank; ++t) {
    if (gradd_join_active(c, NULL, 0) != GRADD_OK ||
        Step(c, (float)((rank + 1) * t))) {
      printf("FAIL iteration %d: %s\n", t, gradd_last_error());
      return 1;
    }
    int active = 0;
    float sum = 0;
    for (int r = 0; r < world; ++r) {
      if (t <= 2 + r) {
        ++active;
        sum += (float)((r + 1) * t);
      }
    }
    if (Check(c, sum / (float)(divide ? world : active), "join iteration")) {
      return 1;
    }
  }
  int authoritative = -1;
  if (gradd_join(c, &authoritative) != GRADD_OK || gradd_in_join(c)) {
    printf("FAIL join: %s\n", gradd_last_error());
    return 1;
  }
  if (authoritative != world - 1) {
    printf("FAIL: authoritative rank %d, want %d\n", authoritative, world - 1);
    return 1;
  }
  /* After the join: one plain iteration over every rank. */
  if (Step(c, (float)(2 * rank))) {
    printf("FAIL after join: %s\n", gradd_last_error());
    return 1;
  }
  if (Check(c, (float)(world - 1), "after join")) return 1;
  printf("PASS iteration %llu\n", (unsigned long long)gradd_iteration(c));
  gradd_free(c);
  return 0;
}
