#include "server/hooks/comm_hook_factory.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/hooks/compress_hook.h"
#include "server/hooks/powersgd_hook.h"

namespace gradd {
namespace {

constexpr int kMaxRank = 1024;

bool IsPowerSgd(const std::string& name) {
  return name == "powerSGD" || name == "batched_powerSGD";
}

bool Same(const v1::CommHookSpec& a, const v1::CommHookSpec& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

}  // namespace

const std::vector<std::string>& SupportedCommHooks() {
  static const auto* names = new std::vector<std::string>{
      "allreduce", "fp16_compress", "bf16_compress", "powerSGD",
      "batched_powerSGD"};
  return *names;
}

absl::Status ValidateCommHookSpec(const v1::CommHookSpec& spec,
                                  absl::string_view who) {
  const std::string& name = spec.name();
  bool known = name.empty();
  for (const std::string& s : SupportedCommHooks()) known |= name == s;
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": unknown communication hook '", name,
                     "'; gradd runs these in the daemon: ",
                     absl::StrJoin(SupportedCommHooks(), ", ")));
  }
  if (!IsPowerSgd(name)) return absl::OkStatus();
  if (spec.matrix_approximation_rank() < 0 ||
      spec.matrix_approximation_rank() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": matrix_approximation_rank ", spec.matrix_approximation_rank(),
        " is outside 1..", kMaxRank, " (0 = 1)"));
  }
  if (spec.start_powersgd_iter() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": start_powersgd_iter ", spec.start_powersgd_iter(),
                     " is negative"));
  }
  if (!std::isfinite(spec.min_compression_rate()) ||
      spec.min_compression_rate() < 0 ||
      !std::isfinite(spec.orthogonalization_epsilon()) ||
      spec.orthogonalization_epsilon() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who,
        ": min_compression_rate and orthogonalization_epsilon must be "
        "finite and non-negative"));
  }
  const v1::CommHookSpec n = NormalizeCommHookSpec(spec);
  if ((n.use_error_feedback() || n.warm_start()) &&
      n.start_powersgd_iter() <= 1) {
    // torch's PowerSGDState refuses the same.
    return absl::InvalidArgumentError(absl::StrCat(
        who,
        ": start_powersgd_iter must be > 1 when use_error_feedback or "
        "warm_start is on"));
  }
  return absl::OkStatus();
}

v1::CommHookSpec NormalizeCommHookSpec(const v1::CommHookSpec& spec) {
  v1::CommHookSpec n;
  n.set_name(spec.name().empty() ? "allreduce" : spec.name());
  if (!IsPowerSgd(n.name())) return n;
  n.set_matrix_approximation_rank(spec.matrix_approximation_rank() > 0
                                      ? spec.matrix_approximation_rank()
                                      : 1);
  n.set_start_powersgd_iter(
      spec.has_start_powersgd_iter() ? spec.start_powersgd_iter() : 1000);
  n.set_min_compression_rate(
      spec.min_compression_rate() > 0 ? spec.min_compression_rate() : 2);
  n.set_use_error_feedback(
      spec.has_use_error_feedback() ? spec.use_error_feedback() : true);
  n.set_warm_start(spec.has_warm_start() ? spec.warm_start() : true);
  n.set_orthogonalization_epsilon(spec.orthogonalization_epsilon());
  n.set_random_seed(spec.random_seed());
  n.set_batch_tensors_with_same_shape(spec.batch_tensors_with_same_shape());
  return n;
}

std::string DescribeCommHook(const v1::CommHookSpec& spec) {
  const v1::CommHookSpec n = NormalizeCommHookSpec(spec);
  if (!IsPowerSgd(n.name())) return n.name();
  return absl::StrCat(
      n.name(), "(rank ", n.matrix_approximation_rank(), ", start ",
      n.start_powersgd_iter(), ", min_compression_rate ",
      n.min_compression_rate(),
      n.use_error_feedback() ? ", error_feedback" : ", no error_feedback",
      n.warm_start() ? ", warm_start" : ", no warm_start", ", eps ",
      n.orthogonalization_epsilon(), ", seed ", n.random_seed(), ")");
}

absl::StatusOr<std::unique_ptr<CommHookInterface>> MakeCommHook(
    const v1::CommHookSpec& spec, const CommHookContext& context) {
  const std::string& name = spec.name();
  if (name.empty() || name == "allreduce") return nullptr;
  if (name == "fp16_compress" || name == "bf16_compress") {
    return std::make_unique<Compress16Hook>(
        name == "fp16_compress" ? DType::kFloat16 : DType::kBFloat16,
        context.world_size, context.pool);
  }
  if (IsPowerSgd(name)) return MakePowerSgdHook(spec, context);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown communication hook '", name, "'"));
}

CommHookSelection::CommHookSelection(std::string job_id, int local_world_size,
                                     v1::CommHookSpec job_default)
    : job_id_(std::move(job_id)),
      default_(NormalizeCommHookSpec(job_default)),
      chosen_(local_world_size) {}

absl::Status CommHookSelection::Set(int rank, const v1::CommHookSpec& spec) {
  const std::string who =
      absl::StrCat("local rank ", rank, " of job '", job_id_, "'");
  if (absl::Status s = ValidateCommHookSpec(spec, who); !s.ok()) return s;
  const v1::CommHookSpec n = NormalizeCommHookSpec(spec);
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(chosen_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": no such local rank"));
  }
  if (resolved_) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": communication hook '", DescribeCommHook(n),
        "' registered after the job's first gradient bucket started; "
        "register_comm_hook must be called before the first backward"));
  }
  if (chosen_[rank].has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who,
        ": register_comm_hook or register_builtin_comm_hook can only be "
        "called once (already chose '",
        DescribeCommHook(*chosen_[rank]), "')"));
  }
  for (size_t r = 0; r < chosen_.size(); ++r) {
    if (chosen_[r].has_value() && !Same(*chosen_[r], n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("local ranks ", r, " and ", rank, " of job '", job_id_,
                       "' chose different communication hooks: '",
                       DescribeCommHook(*chosen_[r]), "' on local rank ", r,
                       ", '", DescribeCommHook(n), "' on local rank ", rank));
    }
  }
  chosen_[rank] = n;
  return absl::OkStatus();
}

absl::StatusOr<v1::CommHookSpec> CommHookSelection::Resolve() {
  absl::MutexLock lock(&mu_);
  resolved_ = true;
  auto of = [&](size_t r) -> const v1::CommHookSpec& {
    return chosen_[r].has_value() ? *chosen_[r] : default_;
  };
  for (size_t r = 1; r < chosen_.size(); ++r) {
    if (!Same(of(0), of(r))) {
      auto how = [&](size_t k) {
        return chosen_[k].has_value() ? "registered" : "kept the job's";
      };
      return absl::InvalidArgumentError(
          absl::StrCat("local ranks 0 and ", r, " of job '", job_id_,
                       "' use different communication hooks: local rank 0 ",
                       how(0), " '", DescribeCommHook(of(0)), "', local rank ",
                       r, " ", how(r), " '", DescribeCommHook(of(r)), "'"));
    }
  }
  return of(0);
}

}  // namespace gradd
