// The job's control state mapped as one address range (common/control_block.h):
//   [job block][rank block 0]...[rank block world-1]
// so that ControlLayout finds every field from one base. The daemon maps
// every block; a trainer maps the job block read-only and the rank blocks it
// was given read-write, and the rest of the range stays PROT_NONE (it holds
// no fd of the other ranks' blocks, so it could not map them anyway).
// Thread-compatible; unmapped on destruction.
#ifndef GRADD_COMMON_CONTROL_MAPPING_H_
#define GRADD_COMMON_CONTROL_MAPPING_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "common/control_block.h"

namespace gradd {

class ControlMapping {
 public:
  ControlMapping() = default;
  // `rank_fds[r]` is rank r's block, or -1 to leave it unmapped; it has
  // either layout.local_world_size() entries or none.
  static absl::StatusOr<ControlMapping> Map(const ControlLayout& layout,
                                            int job_fd, bool job_writable,
                                            const std::vector<int>& rank_fds);
  // A trainer's view: the job block read-only, its own block read-write.
  static absl::StatusOr<ControlMapping> MapRank(const ControlLayout& layout,
                                                int job_fd, uint32_t rank,
                                                int rank_fd);
  ControlMapping(ControlMapping&& other) noexcept;
  ControlMapping& operator=(ControlMapping&& other) noexcept;
  ControlMapping(const ControlMapping&) = delete;
  ControlMapping& operator=(const ControlMapping&) = delete;
  ~ControlMapping();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  ControlMapping(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace gradd

#endif  // GRADD_COMMON_CONTROL_MAPPING_H_
