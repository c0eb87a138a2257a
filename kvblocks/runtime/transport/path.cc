// SPDX-License-Identifier: Apache-2.0
#include "transport/path.h"

namespace kvblocks {

// A path without pipelining runs the feed's transfers one after another.
void Path::ExecutePipelined(PipeFeed *feed) {
  PipeItem it;
  while (feed->Next(&it)) feed->Done(it, Execute(*it.plan, *it.local, it.pull, it.deadline));
}

}  // namespace kvblocks
