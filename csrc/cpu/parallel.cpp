#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
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
// Each participant owns a contiguous range of the items, claimed in order through its own
// counter, and then helps with the others' ranges.  Neighbouring items read and write
// neighbouring memory (the heads of one sequence are interleaved in a (B, S, H, D) tensor):
// with one shared counter the two threads took alternate items, and each one's hardware
// prefetches ran into the other's rows (fp32, B = 8, S = 128, H = 2, D = 128, two threads:
// forward 0.63 -> 0.56 ms, backward 1.63 -> 1.38-1.52 ms).  One shared counter whose
// tickets went to the ranges in turn kept the threads apart too, but a thread's next item
// was not always its last one's neighbour: fp32 D = 128 non-causal 0.93-0.98x torch in the
// benchmark against 0.98-1.00x with ranges, in the same hour.  Ranges split the items by
// count, so a caller whose items differ in cost orders them so that every run of items
// holds a like share (the causal forward, attention_fwd.cpp).
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
      parts_ = workers + 1;
      for (int part = 0; part < parts_; ++part) {
        ranges_[part].next.store(n * part / parts_, std::memory_order_relaxed);
        ranges_[part].end = n * (part + 1) / parts_;
      }
      error_ = nullptr;
      active_ = workers;
      open_ = true;
      ++generation_;
    }
    wake_.notify_all();
    work(0);  // the caller takes part as participant 0, until every item is claimed
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
    if (workers + 1 > capacity_) {  // no worker is inside work() between calls
      ranges_.reset(new Range[workers + 1]);
      capacity_ = workers + 1;
    }
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
        work(index + 1);
        joined_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  // Participant `self`'s own range first, then the others' in turn.
  void work(int self) {
    const bool was_in_pool = in_pool_;
    in_pool_ = true;
    for (int k = 0; k < parts_; ++k) {
      Range& range = ranges_[(self + k) % parts_];
      for (int64_t i = range.next.fetch_add(1); i < range.end; i = range.next.fetch_add(1)) {
        try {
          (*fn_)(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex_);
          if (!error_) error_ = std::current_exception();
          for (int part = 0; part < parts_; ++part) ranges_[part].next.store(ranges_[part].end);
        }
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
  // The open call's ranges: participant p's items are [next, end) of ranges_[p], p < parts_.
  struct alignas(64) Range {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::unique_ptr<Range[]> ranges_;
  int capacity_ = 0, parts_ = 0;
  bool open_ = false;
  int active_ = 0;
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
