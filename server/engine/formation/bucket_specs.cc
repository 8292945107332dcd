#include "server/engine/formation/bucket_specs.h"

namespace gradd {

void AppendBucketSpecs(
    const BucketPlan& plan,
    google::protobuf::RepeatedPtrField<v1::BucketSpec>* out) {
  for (const Bucket& b : plan.buckets) {
    v1::BucketSpec* spec = out->Add();
    spec->set_dtype(static_cast<v1::DType>(b.dtype));
    spec->set_offset(b.offset);
    spec->set_size_bytes(b.size_bytes);
    spec->set_device(static_cast<v1::DeviceKind>(b.device));
    for (int32_t p : b.params) spec->add_param_indices(p);
    for (size_t o : b.param_offsets) spec->add_param_offsets(o);
  }
}

}  // namespace gradd
