#include "server/engine/formation/nccl_job_agreement.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace gradd {
namespace {

// absl's HexStringToBytes (this Abseil) does not validate.
bool FromHex(absl::string_view hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  *out = absl::HexStringToBytes(hex);
  return true;
}

std::string Encode(const NcclNodeOffer& offer) {
  std::vector<std::string> gpus;
  for (const std::string& u : offer.gpu_uuids) {
    gpus.push_back(absl::BytesToHexString(u));
  }
  return absl::StrCat("nccl=", offer.nccl ? 1 : 0,
                      ";gpus=", absl::StrJoin(gpus, ","));
}

absl::StatusOr<NcclNodeOffer> Decode(absl::string_view text, int node) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("node rank ", node, " published a malformed NCCL offer '",
                     absl::CEscape(text), "'"));
  };
  std::vector<absl::string_view> parts = absl::StrSplit(text, ';');
  if (parts.size() != 2 || !absl::ConsumePrefix(&parts[0], "nccl=") ||
      !absl::ConsumePrefix(&parts[1], "gpus=") ||
      (parts[0] != "0" && parts[0] != "1")) {
    return bad();
  }
  NcclNodeOffer offer;
  offer.nccl = parts[0] == "1";
  for (absl::string_view hex :
       absl::StrSplit(parts[1], ',', absl::SkipEmpty())) {
    std::string bytes;
    if (!FromHex(hex, &bytes) || bytes.size() != 16) {
      return bad();
    }
    offer.gpu_uuids.push_back(std::move(bytes));
  }
  return offer;
}

}  // namespace

absl::StatusOr<NcclJobAgreement> AgreeNcclJob(
    RendezvousStoreInterface& store, const NcclAgreementOptions& o,
    const NcclNodeOffer& mine,
    absl::FunctionRef<absl::StatusOr<std::string>()> make_unique_id) {
  const absl::Time deadline = absl::Now() + o.timeout;
  auto left = [&] {
    return std::max(deadline - absl::Now(), absl::Milliseconds(1));
  };
  auto node_key = [&](int k) {
    return absl::StrCat(o.prefix, "/nccl/node/", k);
  };
  auto waiting_for = [&](const absl::Status& s, absl::string_view what) {
    return absl::Status(s.code(), absl::StrCat("job '", o.job_id, "': ", what,
                                               ": ", s.message()));
  };
  if (absl::Status s = store.Set(o.job_id, node_key(o.node_rank), Encode(mine));
      !s.ok()) {
    return waiting_for(s, "publishing this node's GPUs for NCCL");
  }
  std::vector<NcclNodeOffer> offers(o.num_nodes);
  for (int k = 0; k < o.num_nodes; ++k) {
    if (k == o.node_rank) {
      offers[k] = mine;
      continue;
    }
    absl::StatusOr<std::string> text = store.Get(o.job_id, node_key(k), left());
    if (!text.ok()) {
      return waiting_for(text.status(), absl::StrCat("waiting for node rank ",
                                                     k, "'s GPUs for NCCL"));
    }
    absl::StatusOr<NcclNodeOffer> offer = Decode(*text, k);
    if (!offer.ok()) return offer.status();
    offers[k] = *std::move(offer);
  }
  NcclJobAgreement out;
  absl::flat_hash_map<std::string, int> owner;  // GPU UUID -> node rank
  for (int k = 0; k < o.num_nodes; ++k) {
    if (k == o.node_rank) out.first_rank = out.world;
    out.world += static_cast<int>(offers[k].gpu_uuids.size());
    if (!offers[k].nccl && out.why_not.empty()) {
      out.why_not = absl::StrCat("node rank ", k, " has no NCCL");
    }
    for (const std::string& uuid : offers[k].gpu_uuids) {
      auto [it, fresh] = owner.emplace(uuid, k);
      if (!fresh && out.why_not.empty()) {
        out.why_not = absl::StrCat("GPU ", absl::BytesToHexString(uuid),
                                   " serves node ranks ", it->second, " and ",
                                   k, " (NCCL needs a GPU per rank)");
      }
    }
  }
  out.use_nccl = out.why_not.empty();
  if (!out.use_nccl) return out;
  const std::string id_key = absl::StrCat(o.prefix, "/nccl/id");
  if (o.node_rank == 0) {
    absl::StatusOr<std::string> id = make_unique_id();
    if (!id.ok()) return id.status();
    out.unique_id = *std::move(id);
    if (absl::Status s =
            store.Set(o.job_id, id_key, absl::BytesToHexString(out.unique_id));
        !s.ok()) {
      return waiting_for(s, "publishing the NCCL unique id");
    }
    return out;
  }
  absl::StatusOr<std::string> hex = store.Get(o.job_id, id_key, left());
  if (!hex.ok()) {
    return waiting_for(hex.status(),
                       "waiting for node rank 0's NCCL unique id");
  }
  if (!FromHex(*hex, &out.unique_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", o.job_id, "': node rank 0 published a malformed NCCL id"));
  }
  return out;
}

}  // namespace gradd
