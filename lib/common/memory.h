// How spotvisor's own memory is kept where docs/configuration.md says it is.
//
// A sync reads files in chunks of up to 16 MiB (8 MiB parts on S3), on
// threads that live for one sync. glibc's malloc serves a block that large
// with mmap at first, but each free of one raises its mmap threshold (up to
// 32 MiB), so from the second sync on the buffers come from per-thread
// arenas and stay resident after the sync: the daemon grew by about 20 MiB a
// sync and never gave it back (issue #31: 144 -> 410 MiB after 8 syncs).
#pragma once

namespace spotvisor {

// Called once at the start of main: blocks of 1 MiB or more are always
// mmap'ed, so freeing one gives it back to the kernel; at most 2 arenas per
// core. A GLIBC_TUNABLES that sets malloc's own values wins over these.
void ConfigureMemory();
// 10 s after a sync or a restore (Supervisor::ScheduleMemoryRelease): frees the transfer buffers kept for reuse
// (common/buffer_pool.h) and hands the free memory at the top of each arena
// back to the kernel (malloc_trim), so the idle daemon is back near its
// idle size.
void ReleaseFreeMemory();

}  // namespace spotvisor
