// A BucketPlan as the wire's BucketSpec list: the one conversion behind
// AttachResponse.buckets, RebuildBucketsResponse.buckets and the plan that
// node rank 0 publishes at formation (node_formation.h), so the three
// cannot drift apart.
#ifndef GRADD_SERVER_ENGINE_FORMATION_BUCKET_SPECS_H_
#define GRADD_SERVER_ENGINE_FORMATION_BUCKET_SPECS_H_

#include "common/bucket_planner.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "gradd/v1/node.pb.h"

namespace gradd {

// Appends one BucketSpec per bucket of `plan`, in plan order.
void AppendBucketSpecs(const BucketPlan& plan,
                       google::protobuf::RepeatedPtrField<v1::BucketSpec>* out);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_FORMATION_BUCKET_SPECS_H_
