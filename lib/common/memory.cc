#include "common/memory.h"

#include "common/buffer_pool.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace spotvisor {

void ConfigureMemory() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return;  // the user's choice
#ifdef M_MMAP_THRESHOLD
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // a fixed threshold also stops glibc raising it
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
#endif
#ifdef M_ARENA_MAX
  mallopt(M_ARENA_MAX, 4);
#endif
}

void ReleaseFreeMemory() {
  BufferPool::Transfers().Clear();
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace spotvisor
