// ClientImpl (client_impl.h): Broadcast and the collectives' rounds on this
// rank's collective area (common/control_block.h: BroadcastSlot); how a call
// is split into rounds is area_collectives.h's.
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/src/data/area_collectives.h"
#include "client/src/data/client_impl.h"
#include "client/src/data/rank_restart.h"
#include "common/control_block.h"
#include "common/doorbell.h"
#include "common/status_macros.h"

namespace gradd::internal {

absl::Status ClientImpl::Broadcast(void* data, size_t bytes, int root) {
  if (in_join()) {
    // Joined ranks take no part in broadcasts; JoinActive syncs.
    return absl::FailedPreconditionError(absl::StrCat(
        "Broadcast in join mode (", Who(),
        "); use JoinActive's sync, or broadcast after Join() returned"));
  }
  return BroadcastImpl(data, bytes, root);
}

absl::Status ClientImpl::AreaRound(CollectiveKind kind, int32_t dtype,
                                   int32_t op, uint64_t bytes, int32_t root) {
  const uint64_t k = ++broadcast_seq_;
  BroadcastSlot* slot = layout_.bcast(
      control_.data(), static_cast<uint32_t>(options_.local_rank));
  slot->root.store(root, std::memory_order_relaxed);
  slot->bytes.store(bytes, std::memory_order_relaxed);
  slot->kind.store(static_cast<int32_t>(kind), std::memory_order_relaxed);
  slot->dtype.store(dtype, std::memory_order_relaxed);
  slot->op.store(op, std::memory_order_relaxed);
  // Release: the daemon reading ready_seq == k sees the description and
  // the area's contents.
  slot->ready_seq.store(k, std::memory_order_release);
  RingDaemon(header_, me_, bell_.get());
  const std::string what =
      kind == CollectiveKind::kBroadcast
          ? absl::StrCat("broadcast ", k, " from rank ", root)
          : absl::StrCat(CollectiveKindName(static_cast<int32_t>(kind)),
                         " (collective round ", k, ")");
  RETURN_IF_ERROR(Wait(
      [this, k] {
        return header_->bcast_done_seq.load(std::memory_order_acquire) >= k;
      },
      what));
  // Rank restart: round k ended without being run (as WaitAll's aborted
  // iteration; the caller's multi-round collective stops here).
  if (restart_.RoundAborted(k)) {
    RETURN_IF_ERROR(
        Wait([this, k] { return restart_.RoundAbortSettled(k); },
             absl::StrCat("the re-attach that aborted collective round ", k)));
    return restart_.RoundAbortedError(
        k, CollectiveKindName(static_cast<int32_t>(kind)), options_.job_id);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ClientImpl::BeginStateSync() {
  RETURN_IF_ERROR(CheckFailed());
  if (in_join()) {
    return absl::FailedPreconditionError(
        absl::StrCat("BeginStateSync in join mode (", Who(),
                     "); rank restart and join do not mix"));
  }
  if (broadcast_bytes_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginStateSync needs a collective area (", Who(),
        "); attach with ClientOptions::rank_restart_grace_ms > 0 (which "
        "gives the job the default one) or collective_bytes > 0"));
  }
  const RankRestart::SyncOffer offer = restart_.Offer(global_rank_);
  int64_t values[RankRestart::kSyncValues] = {offer.values[0], offer.values[1]};
  RETURN_IF_ERROR(AreaAllreduce(area_, values, RankRestart::kSyncValues,
                                dtype::kInt64, ReduceOp::kMin));
  return restart_.Agreed(offer, values, Who());
}

absl::Status ClientImpl::Area::Usable(absl::string_view what) const {
  RETURN_IF_ERROR(client_->CheckFailed());
  if (client_->in_join()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " in join mode (", Who(),
                     "); only Broadcast (JoinActive's sync) runs there"));
  }
  return absl::OkStatus();
}

}  // namespace gradd::internal
