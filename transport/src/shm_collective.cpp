// The process-group collective over one POSIX shared-memory segment: a control page (a reusable
// barrier with a futex, the members' pids, the reason the group broke) and one data slot per rank.
// all_reduce_sum, per chunk of at most slot_bytes: every rank copies its chunk into its slot; rank r
// sums part r of every slot in rank order into part r of its own slot (nobody else reads or writes
// that part then); every rank copies all parts back out. Three barriers per chunk, as in cpu_group.
#include "conveyor/transport/shm_collective.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>

namespace conveyor::transport {
namespace {

using kernels::dtype;
using steady = std::chrono::steady_clock;

constexpr std::uint64_t shm_magic = 0x4356594d50545348ull;  // "HSTPMYVC"
constexpr int max_ranks = 64;
constexpr std::size_t control_bytes = 4096;

/// The control page. Lives in shared memory: only lock-free atomics and plain data.
struct control_page {
  std::atomic<std::uint64_t> magic;  // written last by the creator
  std::uint32_t size;
  std::uint32_t reserved;
  std::uint64_t slot_bytes;
  alignas(64) std::atomic<std::uint32_t> arrived;
  alignas(64) std::atomic<std::uint32_t> generation;  // the futex word
  std::atomic<std::uint32_t> sleepers;
  std::atomic<std::uint32_t> broken;
  std::atomic<std::int32_t> pids[max_ranks];
  char why[1024];  // written once, by whoever breaks the group (under the broken flag's CAS)
};
static_assert(sizeof(control_page) <= control_bytes);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free);

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word is shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

/// A process that is gone, or a zombie nobody reaped yet (kill(pid, 0) still succeeds for those).
bool process_dead(std::int32_t pid) {
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;
  char buf[512];
  std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
  return paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

std::string name_from_id(std::span<const std::byte> id) {
  std::string name(reinterpret_cast<const char*>(id.data()), id.size());
  if (name.size() < 2 || name.size() > 200 || name[0] != '/') return {};
  for (std::size_t i = 1; i < name.size(); ++i) {
    char c = name[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return {};
  }
  return name;
}

class shm_collective final : public collective {
 public:
  shm_collective(int size, int rank, const shm_group_options& o, void* base, std::size_t bytes)
      : size_(size), rank_(rank), options_(o), base_(base), bytes_(bytes),
        ctl_(static_cast<control_page*>(base)) {}
  ~shm_collective() override { ::munmap(base_, bytes_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  /// Waits until every rank arrived. Once one rank gives up the group is broken for good: the
  /// others' slots may be in any state, so no later operation may trust them.
  status arrive() {
    if (ctl_->broken.load(std::memory_order_acquire)) return broken_error();
    std::uint32_t gen = ctl_->generation.load(std::memory_order_acquire);
    if (ctl_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(size_)) {
      ctl_->arrived.store(0, std::memory_order_relaxed);
      ctl_->generation.fetch_add(1, std::memory_order_seq_cst);
      if (ctl_->sleepers.load(std::memory_order_seq_cst) != 0) futex(&ctl_->generation, FUTEX_WAKE, INT_MAX, nullptr);
      return ok_status();
    }
    auto start = steady::now();
    auto spin_until = start + options_.spin;
    auto deadline = start + options_.timeout;
    auto next_check = start + options_.liveness_check;
    for (;;) {
      if (ctl_->generation.load(std::memory_order_acquire) != gen) return ok_status();
      if (ctl_->broken.load(std::memory_order_acquire)) return broken_error();
      auto now = steady::now();
      if (now < spin_until) continue;
      if (now >= deadline) {
        return break_group("rank " + std::to_string(rank_) + " waited " + std::to_string(options_.timeout.count()) +
                           " ms for the other ranks (did one skip or stop calling the collective?)");
      }
      if (now >= next_check) {
        next_check = now + options_.liveness_check;
        for (int q = 0; q < size_; ++q) {
          std::int32_t pid = ctl_->pids[q].load(std::memory_order_relaxed);
          if (q != rank_ && process_dead(pid)) {
            return break_group("rank " + std::to_string(q) + " (pid " + std::to_string(pid) + ") died");
          }
        }
      }
      // Sleep until the generation moves, a liveness check is due, or the deadline.
      auto until = std::min(next_check, deadline);
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until - now).count();
      timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      ctl_->sleepers.fetch_add(1, std::memory_order_seq_cst);
      futex(&ctl_->generation, FUTEX_WAIT, gen, &ts);  // returns at once if the generation moved
      ctl_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  status all_reduce_sum(void* data, std::size_t count, dtype type) override {
    if (type != dtype::f32 && type != dtype::i32) {
      return make_error(errc::unsupported, "shm collective: all_reduce_sum supports f32 and i32, not " +
                                               std::string(kernels::dtype_name(type)));
    }
    std::size_t esz = kernels::dtype_size(type);
    std::size_t chunk = options_.slot_bytes / esz;
    auto* bytes = static_cast<char*>(data);
    for (std::size_t done = 0; done < count || (count == 0 && done == 0); done += chunk) {
      std::size_t len = std::min(chunk, count - done);
      std::memcpy(slot(rank_), bytes + done * esz, len * esz);
      CONVEYOR_TRY(arrive());
      std::size_t begin = len * rank_ / size_, end = len * (rank_ + 1) / size_;
      if (type == dtype::f32) {
        reduce_part<float>(begin, end);
      } else {
        reduce_part<std::int32_t>(begin, end);
      }
      CONVEYOR_TRY(arrive());
      for (int q = 0; q < size_; ++q) {
        std::size_t b = len * q / size_, e = len * (q + 1) / size_;
        std::memcpy(bytes + (done + b) * esz, slot(q) + b * esz, (e - b) * esz);
      }
      CONVEYOR_TRY(arrive());  // nobody refills its slot while another rank still copies from it
      if (count == 0) break;
    }
    return ok_status();
  }

  status all_gather(const void* in, void* out, std::size_t count, dtype type) override {
    std::size_t esz = kernels::dtype_size(type);
    std::size_t chunk = options_.slot_bytes / esz;
    std::size_t total = count * esz;
    for (std::size_t done = 0; done < count || (count == 0 && done == 0); done += chunk) {
      std::size_t len = std::min(chunk, count - done) * esz;
      // `in` may alias out + rank * count: it is copied to the slot before anything is written.
      std::memcpy(slot(rank_), static_cast<const char*>(in) + done * esz, len);
      CONVEYOR_TRY(arrive());
      for (int q = 0; q < size_; ++q) std::memcpy(static_cast<char*>(out) + q * total + done * esz, slot(q), len);
      CONVEYOR_TRY(arrive());
      if (count == 0) break;
    }
    return ok_status();
  }

  status broadcast(void* data, std::size_t count, dtype type, int root) override {
    if (root < 0 || root >= size_) {
      return make_error(errc::invalid_argument, "shm collective: broadcast root " + std::to_string(root) +
                                                    " outside [0, " + std::to_string(size_) + ")");
    }
    std::size_t esz = kernels::dtype_size(type);
    std::size_t chunk = options_.slot_bytes / esz;
    for (std::size_t done = 0; done < count || (count == 0 && done == 0); done += chunk) {
      std::size_t len = std::min(chunk, count - done) * esz;
      if (rank_ == root) std::memcpy(slot(root), static_cast<char*>(data) + done * esz, len);
      CONVEYOR_TRY(arrive());
      if (rank_ != root) std::memcpy(static_cast<char*>(data) + done * esz, slot(root), len);
      CONVEYOR_TRY(arrive());
      if (count == 0) break;
    }
    return ok_status();
  }

 private:
  char* slot(int q) const { return static_cast<char*>(base_) + control_bytes + q * options_.slot_bytes; }

  /// Part [begin, end) of this chunk = sum over ranks in rank order, into this rank's slot. The
  /// same blocks and order as cpu_group, so the same bits.
  template <class T>
  void reduce_part(std::size_t begin, std::size_t end) {
    constexpr std::size_t block = 2048;
    T acc[block];
    for (std::size_t b = begin; b < end; b += block) {
      std::size_t len = std::min(block, end - b);
      const T* first = reinterpret_cast<const T*>(slot(0)) + b;
      std::copy(first, first + len, acc);
      for (int q = 1; q < size_; ++q) {
        const T* src = reinterpret_cast<const T*>(slot(q)) + b;
        for (std::size_t i = 0; i < len; ++i) acc[i] += src[i];
      }
      std::copy(acc, acc + len, reinterpret_cast<T*>(slot(rank_)) + b);
    }
  }

  error break_group(const std::string& why) {
    std::uint32_t expected = 0;
    if (ctl_->broken.compare_exchange_strong(expected, 2, std::memory_order_acq_rel)) {
      std::snprintf(ctl_->why, sizeof ctl_->why, "%s", why.c_str());
      ctl_->broken.store(1, std::memory_order_release);  // 2 = being written, 1 = why is readable
      futex(&ctl_->generation, FUTEX_WAKE, INT_MAX, nullptr);
    }
    return broken_error();
  }

  error broken_error() const {
    // Another rank may still be writing the reason; it takes a few microseconds at most.
    for (int i = 0; i < 1000 && ctl_->broken.load(std::memory_order_acquire) == 2; ++i) std::this_thread::yield();
    std::string why = ctl_->broken.load(std::memory_order_acquire) == 1 ? std::string(ctl_->why) : "unknown";
    return make_error(errc::internal, "shm collective: the group is broken: " + why);
  }

  int size_;
  int rank_;
  shm_group_options options_;
  void* base_;
  std::size_t bytes_;
  control_page* ctl_;
};

}  // namespace

std::vector<std::byte> make_shm_group_id() {
  std::random_device rd;
  char name[64];
  std::snprintf(name, sizeof name, "/conveyor-tp-%d-%08x%08x", static_cast<int>(::getpid()), rd(), rd());
  std::vector<std::byte> id(std::strlen(name));
  std::memcpy(id.data(), name, id.size());
  return id;
}

result<std::unique_ptr<collective>> join_shm_group(std::span<const std::byte> id, int size, int rank,
                                                   const shm_group_options& options) {
  std::string name = name_from_id(id);
  if (name.empty()) return make_error(errc::invalid_argument, "shm collective: malformed group id");
  if (size < 1 || size > max_ranks || rank < 0 || rank >= size) {
    return make_error(errc::invalid_argument, "shm collective: rank " + std::to_string(rank) + " of " +
                                                  std::to_string(size) + " (1..64 ranks)");
  }
  if (options.slot_bytes < 64 || options.slot_bytes % 64 != 0) {
    return make_error(errc::invalid_argument, "shm collective: slot_bytes must be a positive multiple of 64");
  }
  const std::size_t bytes = control_bytes + static_cast<std::size_t>(size) * options.slot_bytes;
  const auto deadline = steady::now() + options.timeout;
  int fd = -1;
  if (rank == 0) {
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return make_error(errc::io, "shm collective: cannot create " + name + ": " + std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int e = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      return make_error(errc::io, "shm collective: cannot size " + name + " to " + std::to_string(bytes) +
                                      " bytes: " + std::strerror(e));
    }
  } else {
    // Rank 0 may not have created it yet.
    for (;;) {
      fd = ::shm_open(name.c_str(), O_RDWR, 0);
      struct stat st {};
      if (fd >= 0 && ::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == bytes) break;
      if (fd >= 0 && static_cast<std::size_t>(st.st_size) > 0 && static_cast<std::size_t>(st.st_size) != bytes) {
        ::close(fd);
        return make_error(errc::invalid_argument, "shm collective: group " + name + " is " +
                                                      std::to_string(st.st_size) + " bytes, this rank expects " +
                                                      std::to_string(bytes) + " (size or slot_bytes differ)");
      }
      if (fd >= 0) ::close(fd);
      if (steady::now() >= deadline) {
        return make_error(errc::io, "shm collective: rank 0 did not create group " + name + " within " +
                                        std::to_string(options.timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    if (rank == 0) ::shm_unlink(name.c_str());
    return make_error(errc::io, "shm collective: cannot map " + name + ": " + std::strerror(errno));
  }
  auto* ctl = static_cast<control_page*>(base);
  if (rank == 0) {
    // ftruncate zero-filled the page: the atomics start at 0. The magic goes last.
    ctl->size = static_cast<std::uint32_t>(size);
    ctl->slot_bytes = options.slot_bytes;
    ctl->magic.store(shm_magic, std::memory_order_release);
  } else {
    while (ctl->magic.load(std::memory_order_acquire) != shm_magic) {
      if (steady::now() >= deadline) {
        ::munmap(base, bytes);
        return make_error(errc::io, "shm collective: group " + name + " was never initialised by rank 0");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (ctl->size != static_cast<std::uint32_t>(size) || ctl->slot_bytes != options.slot_bytes) {
      ::munmap(base, bytes);
      return make_error(errc::invalid_argument, "shm collective: group " + name + " has " +
                                                    std::to_string(ctl->size) + " ranks of " +
                                                    std::to_string(ctl->slot_bytes) + " slot bytes, this rank expects " +
                                                    std::to_string(size) + " of " + std::to_string(options.slot_bytes));
    }
  }
  ctl->pids[rank].store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
  auto c = std::make_unique<shm_collective>(size, rank, options, base, bytes);
  status joined = c->arrive();  // everyone mapped the segment
  if (rank == 0) ::shm_unlink(name.c_str());  // the mappings keep it alive; a crash leaves nothing behind
  CONVEYOR_TRY(joined);
  return std::unique_ptr<collective>(std::move(c));
}

}  // namespace conveyor::transport
