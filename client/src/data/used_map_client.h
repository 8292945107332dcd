// find_unused_parameters for the client library: which parameters each rank
// used in an iteration, reduced by the daemon (torch DDP's allreduce of
// `local_used_map`).
//
// UsedMapClient decorates a Client attached with one extra float32
// parameter of num_params() elements registered FIRST (index 0 of the inner
// client; the planner goes in reverse registration order, so it lands in the
// last bucket, which is the last to be ready anyway). The decorator hides it:
// user index i is inner index i + 1. Per iteration:
//
//   MarkReady(i)   map[i] = 1, inner MarkReady(i + 1)
//   MarkUnused(i)  (zero gradient i), inner MarkReady(i + 1); map[i] stays 0
//   SkipUsedMap()  map = all ones, inner MarkReady(0) now
//   WaitAll()      inner MarkReady(0) unless skipped, inner WaitAll();
//                  used[i] = (average of map[i] over ranks) > 0; map = 0
//
// The daemon averages the map like any gradient; an average of 0/1 values is
// > 0 exactly when some rank used the parameter, whatever the world size,
// divide factor or join state.
//
// session/attach.cc registers the hidden parameter (kUsedMapParamName) and
// wraps the attached client with NewUsedMapClient when ClientOptions asks
// for find_unused_parameters.
//
// Threads: as Client (MarkReady / MarkUnused from several threads at once;
// each writes only its own map element).
#ifndef GRADD_CLIENT_SRC_DATA_USED_MAP_CLIENT_H_
#define GRADD_CLIENT_SRC_DATA_USED_MAP_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "gradd/client.h"

namespace gradd {

// Name of the hidden parameter (it appears in the daemon's plan and in
// mismatched-model errors when ranks disagree on find_unused_parameters).
inline constexpr char kUsedMapParamName[] =
    "[gradd] find_unused_parameters used map";

// The decorator over `inner`, whose parameter 0 is the used map (float32,
// names.size() elements) and whose parameter i + 1 is `names[i]`. `who`
// names the job and rank in errors. Exposed for tests (fake inner clients).
std::unique_ptr<Client> NewUsedMapClient(std::unique_ptr<Client> inner,
                                         std::vector<std::string> names,
                                         std::string who);

}  // namespace gradd

#endif  // GRADD_CLIENT_SRC_DATA_USED_MAP_CLIENT_H_
