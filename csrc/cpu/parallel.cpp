#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <vector>

namespace fmha {
namespace cpu {

int num_threads() {
  if (const char* env = std::getenv("FMHA_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

namespace {

// Persistent workers: a call hands out its items to the calling thread and up to
// num_threads() - 1 workers, which wait between calls (spinning briefly, then on a
// condition variable), instead of starting threads for every call (the backward makes two
// calls).  A worker joins a call only while it is open; the caller closes it once every
// item is claimed and then waits for the workers that joined, never for one still asleep:
// a small call that the caller finishes alone costs no wake-up (waiting for every worker
// put a sleeping thread's wake-up, tens of microseconds, on each call).
//
// Items are claimed through one shared counter (so a call whose items differ in cost, a
// causal one with its heaviest items first, stays balanced), but the counter's tickets are
// dealt out region by region: with T participants the items form T contiguous regions and
// tickets t, t + 1, ... go to regions 0, 1, ..., T - 1 in turn, so the items that run at
// the same time lie far apart in memory.  Neighbouring items read and write neighbouring
// memory (the heads of one sequence are interleaved in a (B, S, H, D) tensor): taken in
// order, two threads ran alternate items and each one's hardware prefetches ran into the
// other's rows (fp32, B = 8, S = 128, H = 2, D = 128, two threads: forward 0.63 -> 0.56 ms,
// backward 1.63 -> 1.38-1.52 ms).  A contiguous range per thread did as well there, but
// handed one thread all the heavy items of a causal call (B = 1, H = 1, S = 4096: 12% slower).
class Pool {
 public:
  // Never destroyed: workers may outlive static destructors.  A forked child has none of
  // the parent's threads, so it starts a pool of its own (the old one is left as it is).
  static Pool& get() {
    static bool registered = (pthread_atfork(nullptr, nullptr, [] { instance() = nullptr; }), true);
    (void)registered;
    Pool*& pool = instance();
    if (pool == nullptr) pool = new Pool();
    return *pool;
  }

  void run(int64_t n, int workers, const std::function<void(int64_t)>& fn) {
    std::lock_guard<std::mutex> call(call_mutex_);  // one call at a time
    grow(workers);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      n_ = n;
      regions_ = workers + 1;
      next_.store(0);
      error_ = nullptr;
      active_ = workers;
      open_ = true;
      ++generation_;
    }
    wake_.notify_all();
    work();  // the caller takes part as one more worker, until every item is claimed
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = false;  // no worker joins from here on
    }
    while (joined_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // How long an idle worker spins before it sleeps (1 ms: 0.59 ms against 0.69 with the
  // former ~19 us spin for an fp32 forward at B = 8, S = 128, H = 4, D = 64 on two
  // threads, called back to back from Python; 200 us gave 0.60, 3 ms 0.59).
  static constexpr std::chrono::microseconds kSpin{1000};

  static Pool*& instance() {
    static Pool* pool = nullptr;
    return pool;
  }

  void grow(int workers) {
    while ((int)threads_.size() < workers) {
      const int index = (int)threads_.size();
      threads_.emplace_back([this, index] { loop(index); });
      threads_.back().detach();
    }
  }

  void loop(int index) {
    in_pool_ = true;
    uint64_t seen = 0;
    for (;;) {
      // Spin up to kSpin before sleeping: a call that follows within it finds the worker
      // awake (a wake-up from the condition variable took 30-50 us in the project's VM,
      // where the gap between two calls from Python is 25-70 us).  Bounded by the clock, not
      // by a count of PAUSEs, whose cost differs tenfold between CPUs (9 ns here).  No
      // yield inside: torch's OpenMP workers spin on the other cores after their own
      // calls, and a yield handed them the core (bf16 forward, B = 8, S = 128, both
      // libraries alternating: 0.46-0.69x torch with a yield every 64 PAUSEs, 0.73-1.00x
      // without).
      const auto spin_end = std::chrono::steady_clock::now() + kSpin;
      for (int spin = 0; generation_.load(std::memory_order_acquire) == seen; ++spin) {
        if (spin % 64 == 0 && std::chrono::steady_clock::now() > spin_end) break;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
      bool join = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        join = open_ && index < active_;
        if (join) joined_.fetch_add(1, std::memory_order_relaxed);
      }
      if (join) {
        work();
        joined_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  // The item of ticket t: region t % R, its (t / R)-th item, for R regions of n / R items
  // (the first n % R of them one more), the last round of tickets covering only those.
  int64_t item_of(int64_t t) const {
    const int64_t R = regions_, q = n_ / R, rem = n_ % R;
    const int64_t round = t < q * R ? t / R : q, region = t < q * R ? t % R : t - q * R;
    return region * q + std::min(region, rem) + round;
  }

  void work() {
    const bool was_in_pool = in_pool_;
    in_pool_ = true;
    for (int64_t t = next_.fetch_add(1); t < n_; t = next_.fetch_add(1)) {
      try {
        (*fn_)(item_of(t));
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_);
      }
    }
    in_pool_ = was_in_pool;
  }

 public:
  static thread_local bool in_pool_;

 private:
  std::mutex call_mutex_, mutex_, error_mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> joined_{0};  // workers inside the open call's work()
  std::atomic<int64_t> next_{0};  // the next ticket
  bool open_ = false;
  int active_ = 0;
  int regions_ = 1;
  int64_t n_ = 0;
  const std::function<void(int64_t)>* fn_ = nullptr;
  std::exception_ptr error_;
};

thread_local bool Pool::in_pool_ = false;

}  // namespace

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(num_threads(), n);
  // One thread, or a call from inside a work item (nested): run here, in order.
  if (threads <= 1 || Pool::in_pool_) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Pool::get().run(n, (int)threads - 1, fn);
}

}  // namespace cpu
}  // namespace fmha
