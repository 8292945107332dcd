#include "server/backends/gloo/gloo_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/reduce.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"
#include "server/auth/pair_handshake.h"
#include "server/backends/gloo/authenticated_tcp.h"
#include "server/backends/gloo/mesh_store.h"
#include "server/rendezvous/gloo_store.h"

namespace gradd {
namespace {

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

std::string ArrivedKey(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, "/arrived/", rank);
}

// Gloo's reduction functions have the signature AllreduceOptions::Func wants.
template <typename T>
void SumInto(void* c, const void* a, const void* b, size_t n) {
  gloo::sum<T>(c, a, b, n);
}

// The 16-bit wire types of the communication hooks: each addition in
// float32, rounded back to 16 bits (what Gloo's own float16 sum does, so
// torch's Gloo allreduce of a float16 tensor rounds the same way).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Sum16Into(void* c, const void* a, const void* b, size_t n) {
  uint16_t* out = static_cast<uint16_t*>(c);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i)
    out[i] = FromFloat(ToFloat(x[i]) + ToFloat(y[i]));
}

}  // namespace

GlooBackend::GlooBackend(const Options& options)
    : node_rank_(options.node_rank),
      num_nodes_(options.num_nodes),
      store_(options.store),
      store_prefix_(options.store_prefix),
      failure_probe_timeout_(options.failure_probe_timeout),
      job_id_(options.job_id),
      collective_timeout_(options.collective_timeout),
      algorithm_(options.algorithm),
      bcube_max_bytes_(options.bcube_max_bytes),
      max_segment_bytes_(options.max_segment_bytes),
      fused_min_bytes_(options.fused_min_bytes),
      fused_segment_bytes_(options.fused_segment_bytes),
      node_names_(options.node_names),
      peer_addresses_(options.num_nodes),
      pair_auth_(std::make_shared<PairAuthCounters>()) {
  node_names_.resize(num_nodes_);
  for (int r = 0; r < num_nodes_; ++r) {
    if (node_names_[r].empty()) node_names_[r] = absl::StrCat("node ", r);
  }
}

GlooBackend::~GlooBackend() { Close(); }

std::string GlooBackend::NodeName(int node_rank) const {
  if (node_rank < 0 || node_rank >= num_nodes_) {
    return absl::StrCat("node rank ", node_rank);
  }
  return absl::StrCat("'", node_names_[node_rank], "' (node rank ", node_rank,
                      ")");
}

absl::StatusOr<std::unique_ptr<GlooBackend>> GlooBackend::Create(
    const Options& options) {
  if (options.num_nodes < 1 || options.node_rank < 0 ||
      options.node_rank >= options.num_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: node rank ", options.node_rank,
                     " outside [0, ", options.num_nodes, ")"));
  }
  if (!options.node_names.empty() &&
      static_cast<int>(options.node_names.size()) != options.num_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: ", options.node_names.size(),
                     " node names for ", options.num_nodes, " nodes"));
  }
  if (options.collective_timeout <= absl::ZeroDuration() ||
      options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo backend: timeouts must be > 0");
  }
  std::unique_ptr<GlooBackend> backend(new GlooBackend(options));
  if (options.num_nodes == 1) return backend;  // Nothing to connect.
  if (options.store == nullptr || options.job_id.empty()) {
    return absl::InvalidArgumentError(
        "gloo backend: a rendezvous store and a job id are required for "
        "more than one node");
  }
  RendezvousStoreInterface& store = *options.store;
  const std::string& prefix = options.store_prefix;

  // 1. Everyone arrives (so a missing node is reported as such, not as a
  //    Gloo connect timeout). Node rank 0 draws the mesh's pair key before
  //    it marks its arrival, so the key is there once everyone arrived.
  const int me = options.node_rank;
  const std::string key_key = absl::StrCat(prefix, "/pairkey");
  if (me == 0) {
    absl::StatusOr<std::string> key = RandomPairKey();
    if (!key.ok()) {
      return absl::Status(key.status().code(),
                          absl::StrCat("gloo backend of job '", options.job_id,
                                       "': ", key.status().message()));
    }
    if (absl::Status s = store.Set(options.job_id, key_key, *key); !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("gloo backend of job '", options.job_id,
                       "': publishing the pair key: ", s.message()));
    }
  }
  if (absl::Status s = store.Set(options.job_id, ArrivedKey(prefix, me),
                                 backend->node_names_[me]);
      !s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "gloo backend of job '", options.job_id, "': ", s.message()));
  }
  std::vector<std::string> arrived_keys;
  for (int r = 0; r < options.num_nodes; ++r) {
    arrived_keys.push_back(ArrivedKey(prefix, r));
  }
  if (absl::Status s =
          store.Wait(options.job_id, arrived_keys, options.connect_timeout);
      !s.ok()) {
    std::vector<std::string> missing;
    for (int r = 0; r < options.num_nodes; ++r) {
      if (!store.Get(options.job_id, arrived_keys[r], absl::Milliseconds(200))
               .ok()) {
        missing.push_back(backend->NodeName(r));
      }
    }
    return absl::Status(
        s.code() == absl::StatusCode::kDeadlineExceeded
            ? absl::StatusCode::kDeadlineExceeded
            : absl::StatusCode::kUnavailable,
        absl::StrCat(
            "gloo backend of job '", options.job_id,
            "': nodes did not arrive within ",
            absl::FormatDuration(options.connect_timeout), ": ",
            missing.empty() ? "(unknown)" : absl::StrJoin(missing, ", "), " [",
            s.message(), "]"));
  }

  // 2. The pair key of this mesh (auth/pair_handshake.h): every pair's two
  //    ends prove they hold it before Gloo sees a byte of their connection,
  //    so a stranger racing the real peer to a pair's port is refused and
  //    the real peer still gets in (backends/gloo/authenticated_tcp.h).
  //    The key is only as secret as the store: with mTLS it travels
  //    encrypted between authenticated daemons; with a token alone it
  //    travels in clear text like the token itself; without credentials
  //    anyone who can reach the coordinator can read it, and the proof then
  //    keeps out only blind port racers (docs/operations.md). The token is
  //    not mixed into the key: whoever can read the key off the wire can
  //    read the token off the same wire, and nodes in the middle of a token
  //    roll-out send different tokens.
  absl::StatusOr<std::string> pair_key =
      store.Get(options.job_id, key_key, options.connect_timeout);
  if (!pair_key.ok()) {
    return absl::Status(
        pair_key.status().code() == absl::StatusCode::kDeadlineExceeded
            ? absl::StatusCode::kDeadlineExceeded
            : absl::StatusCode::kUnavailable,
        absl::StrCat("gloo backend of job '", options.job_id,
                     "': reading the pair key of ", backend->NodeName(0), ": ",
                     pair_key.status().message()));
  }
  if (pair_key->size() != kPairKeyBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("gloo backend of job '", options.job_id,
                     "': the pair key of ", backend->NodeName(0), " has ",
                     pair_key->size(), " bytes, not ", kPairKeyBytes));
  }

  // 3. Full mesh over TCP. Gloo throws; nothing escapes this block.
  const std::string mesh_prefix = absl::StrCat(prefix, "/mesh");
  MeshStore gloo_store(&store, options.job_id, mesh_prefix,
                       ToMillis(options.connect_timeout),
                       backend->pair_auth_.get());
  try {
    PairAuthOptions auth;
    auth.key = *std::move(pair_key);
    auth.job_id = options.job_id;
    auth.node_names = backend->node_names_;
    absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
        CreateAuthenticatedTcpDevice(options.advertise_host, std::move(auth),
                                     backend->pair_auth_);
    if (!device.ok()) {
      return absl::Status(device.status().code(),
                          absl::StrCat("gloo backend of job '", options.job_id,
                                       "': ", device.status().message()));
    }
    backend->device_ = *std::move(device);
    auto context = std::make_shared<gloo::rendezvous::Context>(
        options.node_rank, options.num_nodes);
    // Pairs take their I/O timeout from the context when they are created.
    context->setTimeout(ToMillis(options.collective_timeout));
    context->connectFullMesh(gloo_store, backend->device_);
    backend->context_ = std::move(context);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("gloo backend of job '", options.job_id,
                     "': connecting the full mesh failed: ", e.what()));
  }

  // 4. Learn how the transport's errors will name each peer: the listening
  //    address that peer published for its pair with us (authenticated_tcp.h
  //    names a pair's peer by it, whichever end connected).
  for (int r = 0; r < options.num_nodes; ++r) {
    if (r == me) continue;
    std::optional<std::vector<char>> all =
        gloo_store.Published(std::to_string(r));
    if (!all.has_value() || all->empty()) continue;
    const size_t per = all->size() / (options.num_nodes - 1);
    const size_t index = me > r ? me - 1 : me;
    if (per == 0 || (index + 1) * per > all->size()) continue;
    absl::StatusOr<PairAddress> address = PairAddress::Parse(std::vector<char>(
        all->begin() + index * per, all->begin() + (index + 1) * per));
    // Best effort: without it errors name no peer.
    if (address.ok()) backend->peer_addresses_[r].push_back(address->str());
  }
  return backend;
}

uint64_t GlooBackend::RefusedPairConnections() const {
  return pair_auth_->refused.load();
}

absl::Status GlooBackend::CheckUsable() const {
  if (!broken_.ok()) return broken_;
  return absl::OkStatus();
}

std::vector<int> GlooBackend::SilentPeers(absl::Time op_start) {
  std::vector<int> silent;
  if (store_ == nullptr || num_nodes_ < 3) return silent;
  const absl::Time now = absl::Now();
  const absl::Time deadline =
      now + std::min(failure_probe_timeout_,
                     std::max(absl::Milliseconds(200),
                              op_start + collective_timeout_ - now));
  auto key = [&](int r) { return absl::StrCat(store_prefix_, "/failed/", r); };
  if (!store_->Set(job_id_, key(node_rank_), "1").ok()) return silent;
  std::vector<bool> seen(num_nodes_, false);
  seen[node_rank_] = true;
  int unseen = num_nodes_ - 1;
  // Each look at a peer's mark is a blocking Get of up to kProbeStep (the
  // store answers as soon as the mark exists), which also paces the loop. A
  // much shorter budget fails spuriously: a gRPC round trip to the
  // coordinator can itself take over a millisecond on a loaded machine, and
  // a live peer whose mark we could not read in time would be taken for a
  // silent one (with two of them, no verdict at all).
  constexpr absl::Duration kProbeStep = absl::Milliseconds(50);
  while (true) {
    for (int r = 0; r < num_nodes_; ++r) {
      if (seen[r]) continue;
      const absl::Duration budget =
          std::clamp(deadline - absl::Now(), absl::Milliseconds(1), kProbeStep);
      absl::StatusOr<std::string> mark = store_->Get(job_id_, key(r), budget);
      if (mark.ok()) {
        seen[r] = true;
        --unseen;
      } else if (mark.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return silent;  // The store itself is unwell: no verdict.
      }
    }
    if (unseen == 0 || absl::Now() >= deadline) break;
  }
  for (int r = 0; r < num_nodes_; ++r) {
    if (!seen[r]) silent.push_back(r);
  }
  return silent;
}

absl::Status GlooBackend::Fail(absl::string_view op, const std::string& what,
                               absl::Time op_start) {
  // Close our side first so peers still waiting on us fail now, not at their
  // timeout, and can take part in the probe below.
  if (context_ != nullptr) {
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
    }
  }
  std::string peer;
  if (num_nodes_ == 2) peer = NodeName(1 - node_rank_);
  // Without the probe (elastic jobs) no peer is named among three or more:
  // the address in Gloo's message may be a survivor's that closed its
  // connections, and the re-formation names the lost nodes.
  if (peer.empty() && failure_probe_timeout_ > absl::ZeroDuration()) {
    std::vector<int> silent = SilentPeers(op_start);
    if (!silent.empty() && static_cast<int>(silent.size()) < num_nodes_ - 1) {
      std::vector<std::string> names;
      for (int r : silent) names.push_back(NodeName(r));
      peer = absl::StrJoin(names, ", ");
    }
    for (int r = 0; r < num_nodes_ && peer.empty(); ++r) {
      for (const std::string& address : peer_addresses_[r]) {
        if (!address.empty() && absl::StrContains(what, address)) {
          peer = NodeName(r);
          break;
        }
      }
    }
  }
  const bool timed_out =
      absl::StrContains(what, "imed out") || absl::StrContains(what, "imeout");
  std::string message = absl::StrCat("job '", job_id_, "', node ",
                                     NodeName(node_rank_), ": gloo ", op);
  if (timed_out) {
    absl::StrAppend(&message, " timed out after ",
                    absl::FormatDuration(collective_timeout_));
    absl::StrAppend(&message, peer.empty() ? "" : " waiting for peer ", peer);
  } else {
    absl::StrAppend(&message, " failed: ",
                    peer.empty() ? "a peer node" : "peer node " + peer,
                    " is gone or not responding (connection closed or reset)");
  }
  absl::StrAppend(&message, " [", what, "]");
  broken_ = timed_out ? absl::DeadlineExceededError(message)
                      : absl::UnavailableError(message);
  return broken_;
}

void GlooBackend::RunAllreduce(gloo::AllreduceOptions& opts, size_t bytes) {
  Algorithm algorithm = algorithm_;
  if (algorithm == Algorithm::kAuto) {
    algorithm =
        bytes <= bcube_max_bytes_ ? Algorithm::kBcube : Algorithm::kRing;
  }
  opts.setAlgorithm(algorithm == Algorithm::kBcube
                        ? gloo::AllreduceOptions::Algorithm::BCUBE
                        : gloo::AllreduceOptions::Algorithm::RING);
  if (max_segment_bytes_ > 0) opts.setMaxSegmentSize(max_segment_bytes_);
  opts.setTag(next_tag_++);
  opts.setTimeout(ToMillis(collective_timeout_));
  gloo::allreduce(opts);
}

absl::Status GlooBackend::AllreduceSum(void* data, size_t count, DType dtype) {
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  if (absl::Status s = CheckWireDType("gloo AllreduceSum", dtype); !s.ok()) {
    return s;
  }
  if (count == 0 || num_nodes_ == 1) return absl::OkStatus();
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("gloo backend is closed");
  }
  const absl::Time start = absl::Now();
  try {
    gloo::AllreduceOptions opts(context_);
    if (dtype == DType::kFloat32) {
      opts.setOutput(static_cast<float*>(data), count);
      opts.setReduceFunction(&SumInto<float>);
    } else if (dtype == DType::kFloat16) {
      opts.setOutput(static_cast<uint16_t*>(data), count);
      opts.setReduceFunction(&Sum16Into<&HalfToFloat, &FloatToHalf>);
    } else if (dtype == DType::kBFloat16) {
      opts.setOutput(static_cast<uint16_t*>(data), count);
      opts.setReduceFunction(&Sum16Into<&BFloat16ToFloat, &FloatToBFloat16>);
    } else {
      opts.setOutput(static_cast<double*>(data), count);
      opts.setReduceFunction(&SumInto<double>);
    }
    RunAllreduce(opts, count * DTypeSize(dtype));
  } catch (const std::exception& e) {
    return Fail("allreduce", e.what(), start);
  }
  return absl::OkStatus();
}

absl::Status GlooBackend::AllreduceAverage(const LocalAverage& work) {
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  if (absl::Status s = CheckLocalAverage(work); !s.ok()) return s;
  const size_t bytes = work.count * DTypeSize(work.wire_dtype());
  if (num_nodes_ == 1 || bytes <= fused_min_bytes_) {
    return AverageThroughAllreduceSum(work);
  }
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("gloo backend is closed");
  }
  const absl::Time start = absl::Now();
  try {
    FusedRing(work, start + collective_timeout_);
  } catch (const std::exception& e) {
    return Fail("allreduce", e.what(), start);
  }
  return absl::OkStatus();
}

namespace {

// Gloo's own collectives use slot prefixes 0x01-0x08; the fused ring's
// messages carry their own so they can never match one of those.
constexpr uint8_t kFusedRingSlotPrefix = 0x47;
// Receive slots of the fused ring's reduce-scatter: how many segments may
// be in flight towards this node at once.
constexpr int kFusedRecvSlots = 4;

}  // namespace

size_t GlooBackend::FusedSegmentElements(size_t count, size_t elem) const {
  // Shards: after the reduce-scatter node c holds the finished shard
  // (c + 1) % nodes. Shard and segment boundaries fall on multiples of 64
  // elements (cache lines) and are the same on every node.
  const size_t shard = (count + num_nodes_ - 1) / num_nodes_;
  const size_t per_shard = (shard + 63) / 64 * 64;
  return std::max<size_t>(
      64, std::min(per_shard, fused_segment_bytes_ / elem / 64 * 64));
}

void GlooBackend::FusedRing(const LocalAverage& work, absl::Time deadline) {
  const size_t elem = DTypeSize(work.wire_dtype());
  const size_t count = work.count;
  const size_t per_segment = FusedSegmentElements(count, elem);
  const size_t slot_bytes = per_segment * elem;
  if (fused_tmp_bytes_ < slot_bytes * kFusedRecvSlots) {
    fused_tmp_bytes_ = slot_bytes * kFusedRecvSlots;
    fused_tmp_.reset(
        static_cast<char*>(std::aligned_alloc(64, fused_tmp_bytes_)));
    if (fused_tmp_ == nullptr) {
      fused_tmp_bytes_ = 0;
      throw std::bad_alloc();
    }
  }
  // What the ring moves: the buckets' own values in local rank 0's bucket,
  // or a 16-bit wire's values in a buffer of their own.
  void* ring = work.buffers[0];
  if (work.wire_dtype() != work.dtype) {
    if (fused_wire_.size() < count) fused_wire_.resize(count);
    ring = fused_wire_.data();
  }
  std::unique_ptr<gloo::transport::UnboundBuffer> data =
      context_->createUnboundBuffer(ring, count * elem);
  std::unique_ptr<gloo::transport::UnboundBuffer> tmp =
      context_->createUnboundBuffer(fused_tmp_.get(), fused_tmp_bytes_);
  const uint64_t reduce_slot =
      gloo::Slot::build(kFusedRingSlotPrefix, next_tag_++);
  const uint64_t gather_slot =
      gloo::Slot::build(kFusedRingSlotPrefix, next_tag_++);
  try {
    FusedRingSteps(work, deadline, ring, data.get(), tmp.get(), reduce_slot,
                   gather_slot);
  } catch (...) {
    // Receives and sends may still be pending on both buffers, and Gloo's
    // I/O thread signals a buffer when its pair fails or closes: destroying
    // them here, while unwinding, races with that thread. They are retired
    // instead and freed in Close(), after the device (and its thread) is
    // gone. A failed backend runs no further collective, so this happens
    // at most once per backend.
    retired_buffers_.push_back(std::move(data));
    retired_buffers_.push_back(std::move(tmp));
    throw;
  }
}

namespace {

// What FusedRingSteps does with a segment [b, e) of the bucket (element
// indices) at each point of the ring.
struct RingSegmentOps {
  // Reduce-scatter step 0: this node's value of the segment into the ring
  // buffer, to be sent.
  absl::FunctionRef<void(size_t, size_t)> produce;
  // A partial sum of the segment arrived (`recv`): this node's value added
  // to it, into the ring buffer.
  absl::FunctionRef<void(size_t, size_t, const void*)> combine;
  // The ring buffer holds the finished segment: the reduce-scatter's last
  // step made it here (`finish`), or the allgather brought it (`gathered`).
  // Either way it goes into every local rank's bucket.
  absl::FunctionRef<void(size_t, size_t)> finish;
  absl::FunctionRef<void(size_t, size_t)> gathered;
};

}  // namespace

void GlooBackend::FusedRingSteps(const LocalAverage& work, absl::Time deadline,
                                 void* ring,
                                 gloo::transport::UnboundBuffer* data,
                                 gloo::transport::UnboundBuffer* tmp,
                                 uint64_t reduce_slot, uint64_t gather_slot) {
  const int nodes = num_nodes_;
  const int me = node_rank_;
  const int right = (me + 1) % nodes;
  const int left = (me + nodes - 1) % nodes;
  const DType dtype = work.dtype;
  const DType wire = work.wire_dtype();
  const size_t elem = DTypeSize(wire);
  const size_t count = work.count;
  const int locals = static_cast<int>(work.buffers.size());
  const size_t per_shard = ((count + nodes - 1) / nodes + 63) / 64 * 64;
  const size_t per_segment = FusedSegmentElements(count, elem);
  struct Segment {
    int step;  // Of the reduce-scatter or of the allgather.
    size_t begin;
    size_t end;
  };
  auto add_segments = [&](int step, int c, std::vector<Segment>* out) {
    const size_t first = std::min(count, static_cast<size_t>(c) * per_shard);
    const size_t last = std::min(count, first + per_shard);
    for (size_t b = first; b < last; b += per_segment) {
      out->push_back({step, b, std::min(last, b + per_segment)});
    }
  };
  auto bytes = [&](const Segment& s) { return (s.end - s.begin) * elem; };
  const size_t bucket_elem = DTypeSize(dtype);
  auto local = [&](int k, size_t element) {
    return static_cast<char*>(work.buffers[k]) + element * bucket_elem;
  };
  auto at = [&](size_t element) {
    return static_cast<char*>(ring) + element * elem;
  };
  auto wait_budget = [&]() {
    return ToMillis(std::max(deadline - absl::Now(), absl::Milliseconds(1)));
  };
  const size_t slot_bytes = per_segment * elem;
  int sends = 0;
  auto send = [&](uint64_t slot, const Segment& s) {
    data->send(right, slot, s.begin * elem, bytes(s));
    ++sends;
  };

  // What arrives from the left neighbour, in order: reduce-scatter step t
  // (0 .. nodes - 2) brings its partial sum of shard me - t - 1, segment by
  // segment; allgather step t brings finished shard me - t.
  std::vector<Segment> reduce_in;
  std::vector<Segment> gather_in;
  for (int t = 0; t + 1 < nodes; ++t) {
    add_segments(t, (me - t - 1 + 2 * nodes) % nodes, &reduce_in);
  }
  for (int t = 0; t + 1 < nodes; ++t) {
    add_segments(t, (me - t + 2 * nodes) % nodes, &gather_in);
  }

  // Post the receives first so the left neighbour can send as soon as it
  // is ready (Gloo sends once the receiver has posted; receives from one
  // peer on one slot complete in the order they were posted). Partial sums
  // go to the next free receive slot; finished shards land straight in
  // local rank 0's bucket: by the time one arrives this node has finished
  // reading that range, since the finished value depends on this node's
  // partial sum of it.
  size_t posted = 0;
  auto post_reduce_recv = [&]() {
    if (posted == reduce_in.size()) return;
    tmp->recv(left, reduce_slot, (posted % kFusedRecvSlots) * slot_bytes,
              bytes(reduce_in[posted]));
    ++posted;
  };
  for (int i = 0; i < kFusedRecvSlots; ++i) post_reduce_recv();
  for (const Segment& s : gather_in) {
    data->recv(left, gather_slot, s.begin * elem, bytes(s));
  }

  // Reduce-scatter step 0 sends this node's sum of shard `me`, each segment
  // as soon as it is summed.
  // The segment operations. The buckets' own type: the ring buffer is local
  // rank 0's bucket, which doubles as the node's accumulator.
  std::vector<const void*> srcs(work.to_sum + 1);
  std::vector<void*> outs(locals);
  auto local_sum = [&](size_t b, size_t e) {
    if (work.to_sum < 2) return;
    for (int k = 0; k < work.to_sum; ++k) srcs[k] = local(k, b);
    SumToAccumulator(dtype, srcs.data(), work.to_sum, local(0, b), 0, e - b);
  };
  auto plain_combine = [&](size_t b, size_t e, const void* recv) {
    for (int k = 0; k < work.to_sum; ++k) srcs[k] = local(k, b);
    srcs[work.to_sum] = recv;
    SumToAccumulator(dtype, srcs.data(), work.to_sum + 1, local(0, b), 0,
                     e - b);
  };
  auto plain_finish = [&](size_t b, size_t e) {
    for (int k = 0; k < locals; ++k) outs[k] = local(k, b);
    ScatterFromAccumulator(dtype, outs[0], work.divisor, outs.data(), locals, 0,
                           e - b);
  };
  auto plain_gathered = [&](size_t b, size_t e) {
    for (int k = 1; k < locals; ++k) {
      std::memcpy(local(k, b), local(0, b), (e - b) * bucket_elem);
    }
  };
  // A 16-bit wire: the node's float32 sum is divided and rounded into the
  // ring buffer; a partial sum that arrives is added to that in float32
  // and rounded again (AllreduceSum's 16-bit addition) -- one pass over
  // the local ranks' values either way; finished values are converted back
  // into every bucket.
  std::vector<const float*> fsrcs(work.to_sum);
  auto compressed_combine = [&](size_t b, size_t e, const void* recv) {
    for (int k = 0; k < work.to_sum; ++k) {
      fsrcs[k] = reinterpret_cast<const float*>(local(k, b));
    }
    CompressAdd16(wire, fsrcs.data(), work.to_sum, work.divisor,
                  static_cast<const uint16_t*>(recv),
                  reinterpret_cast<uint16_t*>(at(b)), 0, e - b);
  };
  auto compress = [&](size_t b, size_t e) {
    compressed_combine(b, e, nullptr);
  };
  auto decompress = [&](size_t b, size_t e) {
    const void* const from[1] = {at(b)};
    for (int k = 0; k < locals; ++k) {
      SumToAccumulator(wire, from, 1, local(k, b), 0, e - b);
    }
  };
  const bool plain = wire == dtype;
  const RingSegmentOps ops = plain
                                 ? RingSegmentOps{local_sum, plain_combine,
                                                  plain_finish, plain_gathered}
                                 : RingSegmentOps{compress, compressed_combine,
                                                  decompress, decompress};

  std::vector<Segment> own;
  add_segments(0, me, &own);
  for (const Segment& s : own) {
    ops.produce(s.begin, s.end);
    send(reduce_slot, s);
  }

  // Each partial sum that arrives is added to this node's values in one
  // pass and passed on; the last step's sums are final: written to every
  // local rank and sent on as the allgather's first step.
  for (size_t i = 0; i < reduce_in.size(); ++i) {
    const Segment& s = reduce_in[i];
    tmp->waitRecv(wait_budget());
    ops.combine(s.begin, s.end,
                fused_tmp_.get() + (i % kFusedRecvSlots) * slot_bytes);
    post_reduce_recv();  // Into the slot just consumed.
    if (s.step + 2 < nodes) {
      send(reduce_slot, s);
    } else {
      ops.finish(s.begin, s.end);
      send(gather_slot, s);
    }
  }

  // Allgather: each finished segment into the local ranks, and passed on
  // except at the last step.
  for (const Segment& s : gather_in) {
    data->waitRecv(wait_budget());
    ops.gathered(s.begin, s.end);
    if (s.step + 2 < nodes) send(gather_slot, s);
  }
  for (int i = 0; i < sends; ++i) data->waitSend(wait_budget());
}

absl::Status GlooBackend::Broadcast(void* data, size_t bytes, int root_node) {
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  if (root_node < 0 || root_node >= num_nodes_) {
    return absl::InvalidArgumentError(absl::StrCat("gloo Broadcast: root node ",
                                                   root_node, " outside [0, ",
                                                   num_nodes_, ")"));
  }
  if (bytes == 0 || num_nodes_ == 1) return absl::OkStatus();
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("gloo backend is closed");
  }
  const absl::Time start = absl::Now();
  try {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root_node);
    opts.setTag(next_tag_++);
    opts.setTimeout(ToMillis(collective_timeout_));
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    return Fail("broadcast", e.what(), start);
  }
  return absl::OkStatus();
}

absl::Status GlooBackend::AllreduceWith(void* data, size_t count,
                                        size_t elem_bytes, CombineFn combine) {
  if (absl::Status s = CheckUsable(); !s.ok()) return s;
  if (combine == nullptr || (elem_bytes != 1 && elem_bytes != 2 &&
                             elem_bytes != 4 && elem_bytes != 8)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo AllreduceWith: element size ", elem_bytes,
                     " (1, 2, 4 or 8 with a combine function)"));
  }
  if (count == 0 || num_nodes_ == 1) return absl::OkStatus();
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("gloo backend is closed");
  }
  const absl::Time start = absl::Now();
  try {
    gloo::AllreduceOptions opts(context_);
    // The element type only tells Gloo the element size.
    switch (elem_bytes) {
      case 1:
        opts.setOutput(static_cast<uint8_t*>(data), count);
        break;
      case 2:
        opts.setOutput(static_cast<uint16_t*>(data), count);
        break;
      case 4:
        opts.setOutput(static_cast<uint32_t*>(data), count);
        break;
      default:
        opts.setOutput(static_cast<uint64_t*>(data), count);
        break;
    }
    opts.setReduceFunction(combine);
    RunAllreduce(opts, count * elem_bytes);
  } catch (const std::exception& e) {
    return Fail("allreduce", e.what(), start);
  }
  return absl::OkStatus();
}

void GlooBackend::Close() {
  if (context_ != nullptr) {
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
    }
    context_.reset();
  }
  device_.reset();
  // Only now that no I/O thread can signal them (see FusedRing).
  retired_buffers_.clear();
  if (broken_.ok() && num_nodes_ > 1) {
    broken_ = absl::FailedPreconditionError(
        absl::StrCat("gloo backend of job '", job_id_, "' is closed"));
  }
}

}  // namespace gradd
