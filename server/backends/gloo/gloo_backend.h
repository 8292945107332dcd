// GlooBackend: CollectiveBackendInterface on Gloo over TCP, one participant
// per node.
//
// Create() forms the Gloo full mesh through the rendezvous store:
//   1. every node sets "<prefix>/arrived/<rank>" and waits (connect_timeout)
//      for all of them, so a missing node fails here naming its rank/name;
//      (node rank 0 first publishes a fresh random pair key under
//      "<prefix>/pairkey"; every node reads it);
//   2. gloo::rendezvous::Context::connectFullMesh through a GlooStore under
//      "<prefix>/mesh" on gradd's own TCP transport behind Gloo's transport
//      interface (authenticated_tcp.h), listening on advertise_host, with
//      a membership proof on every connection: both ends prove they hold
//      the pair key before a byte of Gloo traffic crosses it; a stranger's
//      connection to the pair port is refused, logged and counted, and the
//      pair waits for its real peer;
//   3. the context's timeout is the collective timeout from then on.
// Use a fresh `store_prefix` every time a job re-creates its backend.
//
// Algorithms: AllreduceSum uses Gloo's bcube allreduce for small buffers and
// ring for large ones (see Options); Broadcast uses gloo::broadcast;
// AllreduceAverage of a large bucket runs gradd's fused ring over Gloo's
// unbound buffers on the same TCP pairs (see there). Each call is bounded
// by collective_timeout.
//
// Errors: every Gloo exception is caught here and returned as a status:
// DEADLINE_EXCEEDED when a peer did not answer within the collective timeout,
// UNAVAILABLE when a peer closed its connection or died. To name the peer,
// a failed node closes its connections (so every peer's collective fails
// promptly too), marks "<prefix>/failed/<rank>" in the store and waits up to
// failure_probe_timeout (never past the collective timeout by more than
// 200 ms) for the other nodes' marks: nodes that do not mark are the ones
// gone or hung, and the error names them. Failing that, a peer address
// found in Gloo's message names the peer. A failure_probe_timeout of 0
// skips both among three or more nodes (elastic jobs, whose re-formation
// finds and names the lost nodes without them): the error names no peer.
// After the first error every later call returns that error again: the job
// must create a new backend.
//
// Thread affinity: one thread calls AllreduceSum/Broadcast/Close (the job's
// network thread); node_rank/num_nodes/NodeName are safe from any thread.
#ifndef GRADD_SERVER_BACKENDS_GLOO_GLOO_BACKEND_H_
#define GRADD_SERVER_BACKENDS_GLOO_GLOO_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "server/backends/collective_backend.h"
#include "server/rendezvous/store_interface.h"

namespace gloo {
class AllreduceOptions;
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace gradd {

struct PairAuthCounters;

class GlooBackend final : public CollectiveBackendInterface {
 public:
  enum class Algorithm { kAuto, kRing, kBcube };

  struct Options {
    // Must outlive the backend: used by Create() and, after a collective
    // fails, to find out which peer is gone (see "Errors" above).
    RendezvousStoreInterface* store = nullptr;
    std::string job_id;
    // Key prefix inside the job's namespace; unique per backend incarnation.
    std::string store_prefix = "gloo";
    int node_rank = 0;
    int num_nodes = 1;
    // Host/IP the other nodes reach this node's Gloo transport on.
    std::string advertise_host = "127.0.0.1";
    // How long Create() waits for every node to arrive and connect.
    absl::Duration connect_timeout = absl::Seconds(60);
    // Bound of every collective.
    absl::Duration collective_timeout = absl::Seconds(30);
    // Node names for error messages, indexed by node rank (optional).
    std::vector<std::string> node_names;
    // Algorithm choice. kAuto: bcube (latency-bound, log rounds) up to
    // bcube_max_bytes, ring (bandwidth-optimal) above. Measured on loopback
    // with 2 and 3 nodes on 16 idle cores: bcube is 20-50% faster up to
    // 512 KiB, even at 1 MiB, and ring is ahead from 4 MiB (2x at 128 MiB).
    // Segment sizes of 256 KiB / 4 MiB made no consistent difference.
    Algorithm algorithm = Algorithm::kAuto;
    size_t bcube_max_bytes = 512 << 10;
    // Largest send/recv per step (0: Gloo's default, 1 MiB).
    size_t max_segment_bytes = 0;
    // AllreduceAverage of buckets above fused_min_bytes runs gradd's fused
    // ring on Gloo's transport (see AllreduceAverage below) in segments of
    // fused_segment_bytes; smaller ones take the default path (local sum,
    // AllreduceSum, write-back). Both must match on every node. Measured
    // with gradd-bench, 2 nodes x 2 trainers, 25 MiB, loopback on 2 cores,
    // interleaved runs: default path 26.8-29.1 ms p50, fused ring with
    // 2-6.5 MiB segments 24.1-25.8 ms (256 KiB: 36 ms, per-message cost;
    // 1 MiB: 26.6-28.6 ms). Spreading segments over 2-3 Gloo connections,
    // each with its own I/O thread, gained nothing there. The receive
    // slots cost 4 x fused_segment_bytes per backend.
    size_t fused_min_bytes = 512 << 10;
    size_t fused_segment_bytes = 2 << 20;
    // Longest the post-failure "who is still here" round may take; 0: no
    // such round.
    absl::Duration failure_probe_timeout = absl::Seconds(1);
  };

  // Errors: INVALID_ARGUMENT (bad options), DEADLINE_EXCEEDED (a node did not
  // arrive; the message lists them), UNAVAILABLE (store or transport failure;
  // a pair whose other end did not prove membership: "pair to <node> ... did
  // not prove membership of the job", or a connect timeout that counts the
  // connections the pair's port refused), FAILED_PRECONDITION (node rank
  // 0's pair key in the store is malformed).
  static absl::StatusOr<std::unique_ptr<GlooBackend>> Create(
      const Options& options);

  ~GlooBackend() override;
  GlooBackend(const GlooBackend&) = delete;
  GlooBackend& operator=(const GlooBackend&) = delete;

  int node_rank() const override { return node_rank_; }
  int num_nodes() const override { return num_nodes_; }
  [[nodiscard]] absl::Status AllreduceSum(void* data, size_t count,
                                          DType dtype) override;
  // Buckets above fused_min_bytes: a ring reduce-scatter + allgather over
  // Gloo's unbound buffers (its TCP pairs) with the node-local work folded
  // in, segment by segment: each segment is summed over the local ranks
  // just before it is first sent, a received partial sum is added to the
  // local ranks' values in the same pass, the node's finished shard is
  // divided and written to every local rank as each segment completes, and
  // every allgathered segment is copied to the other local ranks as it
  // lands. The data moved between nodes is the same as Gloo's ring; the
  // local passes overlap the network instead of preceding and following
  // it, and each byte is read and written fewer times.
  // A 16-bit `wire` (LocalAverage::wire) rides the same ring: each segment
  // is compressed just before it is first sent, a partial sum that arrives
  // is added to this node's compressed values (in float32, rounded back to
  // 16 bits), and finished segments are converted back into every local
  // rank's bucket as they complete -- the compression passes overlap the
  // network, and the link never waits for a whole chunk.
  [[nodiscard]] absl::Status AllreduceAverage(
      const LocalAverage& work) override;
  bool FusesCompressedAverage() const override { return num_nodes_ > 1; }
  [[nodiscard]] absl::Status Broadcast(void* data, size_t bytes,
                                       int root_node) override;
  // gloo::allreduce with `combine` as the reduce function (typed by
  // element size, so that Gloo's segments never split an element).
  [[nodiscard]] absl::Status AllreduceWith(void* data, size_t count,
                                           size_t elem_bytes,
                                           CombineFn combine) override;
  std::string NodeName(int node_rank) const override;

  // Connections to this node's pair ports refused because they did not
  // prove membership of the job (any thread).
  uint64_t RefusedPairConnections() const;

  // Closes the connections: peers' pending and later collectives fail
  // promptly with UNAVAILABLE. Later calls here return FAILED_PRECONDITION.
  void Close();

 private:
  GlooBackend(const Options& options);

  // Turns a Gloo exception message into a status naming the peer if the
  // message carries one of the peers' addresses; marks the backend broken.
  absl::Status Fail(absl::string_view op, const std::string& what,
                    absl::Time op_start);
  // Nodes that did not mark themselves failed within the probe budget.
  std::vector<int> SilentPeers(absl::Time op_start);
  absl::Status CheckUsable() const;
  // Runs gloo::allreduce over `opts` (output and reduce function set) with
  // this backend's algorithm choice for `bytes`, segment size, next tag and
  // timeout; throws what Gloo throws.
  void RunAllreduce(gloo::AllreduceOptions& opts, size_t bytes);
  // The fused ring of AllreduceAverage; throws what Gloo throws. Its
  // buffers outlive Gloo's use of them on every path (see retired_buffers_).
  void FusedRing(const LocalAverage& work, absl::Time deadline);
  // The ring's schedule over the buffers FusedRing made.
  void FusedRingSteps(const LocalAverage& work, absl::Time deadline, void* ring,
                      gloo::transport::UnboundBuffer* data,
                      gloo::transport::UnboundBuffer* tmp, uint64_t reduce_slot,
                      uint64_t gather_slot);
  // Elements per segment of a fused ring over `count` elements of `elem`
  // bytes: the same on every node.
  size_t FusedSegmentElements(size_t count, size_t elem) const;

  const int node_rank_;
  const int num_nodes_;
  RendezvousStoreInterface* const store_;
  const std::string store_prefix_;
  const absl::Duration failure_probe_timeout_;
  const std::string job_id_;
  const absl::Duration collective_timeout_;
  const Algorithm algorithm_;
  const size_t bcube_max_bytes_;
  const size_t max_segment_bytes_;
  const size_t fused_min_bytes_;
  const size_t fused_segment_bytes_;
  // FusedRing's receive slots, kept between calls (network thread only).
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, FreeDeleter> fused_tmp_;
  size_t fused_tmp_bytes_ = 0;
  // The ring buffer of a 16-bit wire (network thread only).
  std::vector<uint16_t> fused_wire_;
  std::vector<std::string> node_names_;
  // peer_addresses_[r]: the "host:port" texts by which Gloo errors name node r.
  std::vector<std::vector<std::string>> peer_addresses_;
  // Refused / authenticated pair connections (written by Gloo's I/O thread).
  const std::shared_ptr<PairAuthCounters> pair_auth_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 0;
  absl::Status broken_;
  // Buffers of a fused ring that failed: Gloo may still signal them until
  // the connections are closed, so they are freed only in Close().
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> retired_buffers_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_BACKENDS_GLOO_GLOO_BACKEND_H_
