// Builds without CUDA have no page-locked allocator: staging uses plain memory.
#include "conveyor/transport/staging_pool.hpp"

namespace conveyor::transport {

void* pinned_alloc(std::size_t) { return nullptr; }
void pinned_free(void*) {}

}  // namespace conveyor::transport
