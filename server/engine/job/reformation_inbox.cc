#include "server/engine/job/reformation_inbox.h"

#include <utility>

namespace gradd {

void ReformationInbox::PostFirst(Word word, std::string text) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    if (!words_[word].has_value()) words_[word] = std::move(text);
    set_pending(true);
  }
  Wake();
}

void ReformationInbox::PostError(std::string what) {
  PostFirst(kError, std::move(what));
}

void ReformationInbox::PostRequest(std::string reason) {
  PostFirst(kRequest, std::move(reason));
}

void ReformationInbox::PostResult(absl::StatusOr<ReformationResult> result) {
  std::optional<absl::StatusOr<ReformationResult>> dropped;
  bool closed = false;
  {
    absl::MutexLock lock(&mu_);
    closed = closed_;
    if (closed) {
      dropped = std::move(result);
    } else {
      dropped = std::move(result_);
      result_ = std::move(result);
      set_pending(true);
    }
  }
  // Outside the lock: a dropped result's reducer joins its threads.
  dropped.reset();
  if (!closed) Wake();
}

ReformationInbox::Taken ReformationInbox::Take() {
  Taken taken;
  if (!TakePending()) return taken;
  absl::MutexLock lock(&mu_);
  taken.error.swap(words_[kError]);
  taken.request.swap(words_[kRequest]);
  taken.result.swap(result_);
  return taken;
}

void ReformationInbox::Close() {
  std::optional<absl::StatusOr<ReformationResult>> dropped;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (std::optional<std::string>& word : words_) word.reset();
    dropped.swap(result_);
    set_pending(false);
  }
}

}  // namespace gradd
