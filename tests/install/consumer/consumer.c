/* One rank of a job through the installed C ABI (gradd/gradd.h):
 *   consumer_c SOCKET JOB LOCAL_RANK LOCAL_WORLD_SIZE
 * The same job as consumer.cc (the two can be ranks of one job). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gradd/gradd.h"
#include "gradd/version.h"

static int fail(const char* what, int code) {
  fprintf(stderr, "consumer_c: %s: %s: %s\n", what,
          code == GRADD_UNAVAILABLE ? "UNAVAILABLE" : "error",
          gradd_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s SOCKET JOB LOCAL_RANK LOCAL_WORLD_SIZE\n",
            argv[0]);
    return 2;
  }
  gradd_options opts;
  gradd_options_init(&opts);
  opts.socket_path = argv[1];
  opts.job_id = argv[2];
  opts.local_rank = atoi(argv[3]);
  opts.local_world_size = atoi(argv[4]);
  opts.connect_timeout_ms = 2000;
  opts.attach_timeout_ms = 20000;
  const int64_t weight_shape[] = {4, 3};
  const int64_t bias_shape[] = {4};
  const gradd_param params[] = {
      {"fc.weight", weight_shape, 2, GRADD_FLOAT32},
      {"fc.bias", bias_shape, 1, GRADD_FLOAT32},
  };
  gradd_client* c = NULL;
  const int rc = gradd_attach(&opts, params, 2, &c);
  if (rc != GRADD_OK) return fail("attach", rc);
  const float mine = (float)(opts.local_rank + 1);
  const float want = (opts.local_world_size + 1) / 2.0f;
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < gradd_num_params(c); ++i) {
      float* g = (float*)gradd_gradient(c, i);
      for (size_t j = 0; j < gradd_gradient_bytes(c, i) / sizeof(float); ++j)
        g[j] = mine;
      const int rc = gradd_mark_ready(c, i);
      if (rc != GRADD_OK) return fail("mark_ready", rc);
    }
    const int rc = gradd_wait_all(c);
    if (rc != GRADD_OK) return fail("wait_all", rc);
    for (int i = 0; i < gradd_num_params(c); ++i) {
      const float got = ((const float*)gradd_gradient(c, i))[0];
      if (got != want) {
        fprintf(stderr, "consumer_c: param %d is %g, want %g\n", i, got, want);
        return 1;
      }
    }
  }
  gradd_free(c);
  printf("consumer_c OK (gradd %s)\n", GRADD_VERSION_STRING);
  return 0;
}
