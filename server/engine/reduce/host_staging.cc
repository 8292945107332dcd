#include "server/engine/reduce/host_staging.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace gradd {

HostStaging::HostStaging(Options options, StagingDeviceInterface* device,
                         StartOnHost start_on_host)
    : options_(std::move(options)),
      device_(device),
      start_on_host_(std::move(start_on_host)) {
  thread_ = std::thread([this] { Loop(); });
}

HostStaging::~HostStaging() {
  Stop();
  FreeAll();
}

void HostStaging::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

size_t HostStaging::host_bytes() const {
  absl::MutexLock lock(&mu_);
  return host_bytes_;
}

void HostStaging::FreeAll() {
  for (std::vector<Buffer>& ranks : staging_) {
    for (Buffer& b : ranks) {
      if (b.host != nullptr) device_->FreeHost(b.host);
      b = Buffer();
    }
  }
  staging_.clear();
  absl::MutexLock lock(&mu_);
  host_bytes_ = 0;
}

absl::Status HostStaging::Replan() {
  if (!broken_.ok()) return broken_;
  if (staging_.empty()) return absl::OkStatus();  // nothing was staged
  const std::string where =
      absl::StrCat("job '", options_.job_id, "' bucket rebuild");
  if (absl::Status s =
          device_->Drain(absl::Now() + options_.copy_timeout, where);
      !s.ok()) {
    broken_ = absl::Status(s.code(),
                           absl::StrCat("host staging unusable after the plan "
                                        "changed: ",
                                        s.message()));
    return broken_;
  }
  FreeAll();
  return absl::OkStatus();
}

void HostStaging::Start(const BucketWork& work, Completion done) {
  const std::string where =
      absl::StrCat("job '", options_.job_id, "' bucket ", work.bucket,
                   " iteration ", work.iteration);
  auto fail = [&](absl::Status s) { std::move(done)(std::move(s)); };
  if (!broken_.ok()) {
    return fail(absl::Status(broken_.code(),
                             absl::StrCat(where, ": ", broken_.message())));
  }
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      return fail(absl::CancelledError(
          absl::StrCat(where, ": the device reducer is stopping")));
    }
  }
  const std::vector<void*>& buffers = *work.rank_buffers;
  if (work.ranks != nullptr && work.ranks->size() != buffers.size()) {
    return fail(absl::InternalError(
        absl::StrCat(where, ": ", buffers.size(), " buffers but ",
                     work.ranks->size(), " ranks")));
  }
  if (work.bucket < 0) {
    return fail(absl::InternalError(absl::StrCat(where, ": no such bucket")));
  }
  const size_t bytes = work.count * DTypeSize(work.dtype);
  auto item = std::make_shared<Item>();
  item->where = where;
  if (static_cast<size_t>(work.bucket) >= staging_.size()) {
    staging_.resize(work.bucket + 1);
  }
  std::vector<Buffer>& slots = staging_[work.bucket];
  slots.resize(options_.local_world_size);
  for (size_t i = 0; i < buffers.size(); ++i) {
    const int rank =
        work.ranks != nullptr ? (*work.ranks)[i] : static_cast<int>(i);
    if (rank < 0 || rank >= options_.local_world_size) {
      return fail(absl::InternalError(
          absl::StrCat(where, ": local rank ", rank, " is out of range")));
    }
    Buffer& slot = slots[rank];
    if (slot.bytes < bytes || slot.host == nullptr) {
      if (slot.host != nullptr) {
        device_->FreeHost(slot.host);
        absl::MutexLock lock(&mu_);
        host_bytes_ -= slot.bytes;
      }
      slot = Buffer();
      // At least one byte: an empty bucket still gets a distinct buffer.
      absl::StatusOr<void*> host = device_->AllocateHost(
          rank, std::max<size_t>(bytes, 1),
          absl::StrCat(where, " local rank ", rank, ": host staging"));
      if (!host.ok()) return fail(host.status());
      slot.host = *host;
      slot.bytes = std::max<size_t>(bytes, 1);
      absl::MutexLock lock(&mu_);
      host_bytes_ += slot.bytes;
    }
    item->host_buffers.push_back(slot.host);
    item->copies.push_back(
        StagingDeviceInterface::Copy{rank, slot.host, buffers[i], bytes});
  }
  if (absl::Status s = device_->CopyToHost(work.bucket, item->copies, where);
      !s.ok()) {
    return fail(std::move(s));
  }
  item->work = work;
  item->work.device = DeviceKind::kCpu;
  item->deadline = absl::Now() + options_.copy_timeout;
  item->done = std::move(done);
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      queue_.push_back(std::move(item));
      return;
    }
  }
  // Stopped meanwhile: the staging thread may be gone already.
  std::move(item->done)(absl::CancelledError(
      absl::StrCat(where, ": the device reducer is stopping")));
}

void HostStaging::Loop() {
  while (true) {
    std::shared_ptr<Item> item;
    std::deque<std::shared_ptr<Item>> cancelled;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      stopping = stop_;
      if (stopping) {
        cancelled.swap(queue_);
      } else {
        item = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (stopping) {
      // Nobody waits for these any more; each completion still runs once.
      for (std::shared_ptr<Item>& r : cancelled) {
        std::move(r->done)(absl::CancelledError(
            absl::StrCat(r->where, ": the device reducer stopped")));
      }
      return;
    }
    Run(std::move(item));
  }
}

void HostStaging::Run(std::shared_ptr<Item> item) {
  if (absl::Status s = device_->WaitForHost(item->work.bucket, item->copies,
                                            item->deadline, item->where);
      !s.ok()) {
    std::move(item->done)(std::move(s));
    return;
  }
  item->work.rank_buffers = &item->host_buffers;
  // The host reducer writes its result into every staging buffer; the
  // completion copies each back to its rank. `item` lives until then.
  start_on_host_(item->work, [this, item](absl::Status s) mutable {
    if (s.ok()) {
      s = device_->CopyToDevice(item->work.bucket, item->copies, item->where);
    }
    std::move(item->done)(std::move(s));
  });
}

}  // namespace gradd
