#include "common/control_block.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/doorbell.h"

namespace gradd {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::string CollectiveKindName(int32_t kind) {
  switch (static_cast<CollectiveKind>(kind)) {
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kAllgather:
      return "allgather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return absl::StrCat("kind ", kind);
}

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u +
         static_cast<uint64_t>(ts.tv_nsec);
}

ControlLayout::ControlLayout(uint32_t local_world_size, uint32_t num_buckets)
    : world_(local_world_size), buckets_(num_buckets) {
  // Rows on their own cache lines: ranks never share a line.
  row_bytes_ =
      RoundUp(std::max<size_t>(1, buckets_) * sizeof(uint64_t), kCacheLine);
  // Each block page-aligned: every one is a separate memfd mapped on its own,
  // with its own protection.
  done_offset_ = RoundUp(sizeof(ControlHeader), kCacheLine);
  board_offset_ = done_offset_ + row_bytes_;
  job_bytes_ = RoundUp(board_offset_ + sizeof(JoinBoard), 4096);
  ready_offset_ = RoundUp(sizeof(RankHeader), kCacheLine);
  bcast_offset_ = ready_offset_ + row_bytes_;
  join_offset_ = bcast_offset_ + sizeof(BroadcastSlot);
  rank_block_bytes_ = RoundUp(join_offset_ + sizeof(JoinSlot), 4096);
  total_bytes_ = job_bytes_ + rank_block_bytes_ * world_;
}

ControlHeader* ControlLayout::header(void* base) const {
  return static_cast<ControlHeader*>(base);
}

RankHeader* ControlLayout::rank_header(void* base, uint32_t rank) const {
  return reinterpret_cast<RankHeader*>(static_cast<char*>(base) +
                                       rank_block_offset(rank));
}

std::atomic<uint64_t>* ControlLayout::ready_row(void* base,
                                                uint32_t rank) const {
  return reinterpret_cast<std::atomic<uint64_t>*>(
      static_cast<char*>(base) + rank_block_offset(rank) + ready_offset_);
}

std::atomic<uint64_t>* ControlLayout::done_seq(void* base) const {
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(base) +
                                                  done_offset_);
}

BroadcastSlot* ControlLayout::bcast(void* base, uint32_t rank) const {
  return reinterpret_cast<BroadcastSlot*>(
      static_cast<char*>(base) + rank_block_offset(rank) + bcast_offset_);
}

JoinBoard* ControlLayout::join_board(void* base) const {
  return reinterpret_cast<JoinBoard*>(static_cast<char*>(base) + board_offset_);
}

JoinSlot* ControlLayout::join_slot(void* base, uint32_t rank) const {
  return reinterpret_cast<JoinSlot*>(static_cast<char*>(base) +
                                     rank_block_offset(rank) + join_offset_);
}

void ControlLayout::Initialize(void* base) const {
  // The memory is a fresh zero-filled memfd: every atomic already holds 0.
  auto* h = new (base) ControlHeader();
  h->magic = kControlMagic;
  h->version = kControlVersion;
  h->num_buckets = buckets_;
  h->local_world_size = world_;
  h->total_bytes = job_bytes_;
  h->heartbeat_ns.store(MonotonicNs(), std::memory_order_release);
}

absl::Status ControlLayout::Validate(const void* base,
                                     size_t mapped_bytes) const {
  if (mapped_bytes < job_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("control block too small: ", mapped_bytes, " bytes, ",
                     job_bytes_, " expected"));
  }
  const auto* h = static_cast<const ControlHeader*>(base);
  if (h->magic != kControlMagic || h->version != kControlVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control block has magic ", h->magic, " version ", h->version,
        "; this library speaks version ", kControlVersion));
  }
  if (h->num_buckets != buckets_ || h->local_world_size != world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("control block shape (", h->local_world_size, " ranks, ",
                     h->num_buckets, " buckets) does not match the plan (",
                     world_, " ranks, ", buckets_, " buckets)"));
  }
  return absl::OkStatus();
}

void PublishError(const ControlLayout& layout, void* base,
                  absl::StatusCode code, std::string_view message) {
  ControlHeader* header = layout.header(base);
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kInternal;
  // First failure wins. Only the daemon writes here, from one thread per job,
  // so a plain check is enough.
  if (header->status.load(std::memory_order_acquire) != 0) return;
  size_t n = std::min(message.size(), kControlErrorBytes - 1);
  std::memcpy(header->error, message.data(), n);
  header->error[n] = '\0';
  header->status.store(static_cast<int32_t>(code), std::memory_order_release);
  WakeClients(layout, base);
}

absl::Status ReadError(const ControlHeader* header) {
  int32_t code = header->status.load(std::memory_order_acquire);
  if (code == 0) return absl::OkStatus();
  std::string message(header->error,
                      strnlen(header->error, kControlErrorBytes));
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

}  // namespace gradd
