// CommHookOptions (client.h) <-> gradd.v1.CommHookSpec.
#ifndef GRADD_CLIENT_SRC_DATA_COMM_HOOK_OPTIONS_H_
#define GRADD_CLIENT_SRC_DATA_COMM_HOOK_OPTIONS_H_

#include "gradd/client.h"
#include "gradd/v1/comm_hook.pb.h"

namespace gradd {

inline v1::CommHookSpec CommHookToProto(const CommHookOptions& o) {
  v1::CommHookSpec spec;
  spec.set_name(o.name);
  spec.set_matrix_approximation_rank(o.matrix_approximation_rank);
  if (o.start_powersgd_iter.has_value()) {
    spec.set_start_powersgd_iter(*o.start_powersgd_iter);
  }
  spec.set_min_compression_rate(o.min_compression_rate);
  if (o.use_error_feedback.has_value()) {
    spec.set_use_error_feedback(*o.use_error_feedback);
  }
  if (o.warm_start.has_value()) spec.set_warm_start(*o.warm_start);
  spec.set_orthogonalization_epsilon(o.orthogonalization_epsilon);
  spec.set_random_seed(o.random_seed);
  spec.set_batch_tensors_with_same_shape(o.batch_tensors_with_same_shape);
  return spec;
}

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_DATA_COMM_HOOK_OPTIONS_H_
