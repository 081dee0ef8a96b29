// Cached oneDNN primitives: a key per op configuration, and a plan that binds the caller's
// plain tensors to the layouts a primitive chose, through reorders into a shared scratch arena.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace cleave::backend::detail {

// One primitive configuration: an op tag followed by every dimension and option that shapes it.
class op_key {
 public:
  op_key& operator<<(std::int64_t v);
  op_key& operator<<(float v);  // by bit pattern
  bool operator==(const op_key& o) const;
  std::size_t hash() const;

 private:
  static constexpr int max_values = 24;
  std::array<std::int64_t, max_values> v_{};
  int n_ = 0;
};

// `a` with scratchpad_mode::user: a primitive made with it takes the memory it needs during its
// run from the backend's arena (planned_op::scratchpad), not from oneDNN's per-thread buffer.
inline dnnl::primitive_attr arena_scratchpad(dnnl::primitive_attr a = {}) {
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

// Sets the calling thread's OpenMP thread count, which oneDNN's OMP runtime reads both when it
// creates a primitive (to split the work) and when it runs one.
void set_omp_threads(int n);

struct op_key_hash {
  std::size_t operator()(const op_key& k) const { return k.hash(); }
};

// Grow-only, 64-byte aligned memory for the copies a primitive works on in its own layout.
// A backend runs one op at a time, so all its plans share one arena; contents do not survive
// from one op to the next.
class scratch_arena {
 public:
  // Returns at least `bytes` bytes; grows (discarding the contents) when too small.
  char* reserve(std::size_t bytes);

 private:
  struct free_deleter {
    void operator()(char* p) const;
  };
  std::unique_ptr<char, free_deleter> data_;
  std::size_t bytes_ = 0;
};

// The caller's pointer for one primitive argument (DNNL_ARG_*) in one call.
struct binding {
  int arg;
  void* data;  // nullptr: argument absent in this call (must not be part of the plan)
};

// A primitive with its arguments. Each argument has the caller's layout (`user`) and the
// primitive's (`want`): when they differ the argument is staged in the arena, inputs reordered
// in before the primitive runs and outputs reordered out after it. An accumulating output
// always goes through the arena and is added into the caller's memory (dst += result), since
// oneDNN's backward-weights primitives overwrite.
class planned_op {
 public:
  // `n_threads` for the primitive; a staging reorder gets them too when it moves at least
  // `min_parallel_work` / 4 bytes, else one thread.
  planned_op(const dnnl::engine& eng, int n_threads, double min_parallel_work)
      : eng_(eng), n_threads_(n_threads), min_parallel_work_(min_parallel_work) {}

  // The OpenMP threads the primitive was created for and runs with.
  int n_threads() const { return n_threads_; }
  // The backend's id of the layout the op leaves its activation output in (0: row-major).
  int result_layout = 0;

  void input(int arg, const dnnl::memory::desc& user, const dnnl::memory::desc& want);
  void output(int arg, const dnnl::memory::desc& user, const dnnl::memory::desc& want, bool accumulate = false);
  // Memory the primitive asks for during its run (its primitive descriptor was made with
  // scratchpad_mode::user): a part of the arena, not oneDNN's own per-thread buffer.
  void scratchpad(const dnnl::memory::desc& md);
  void set_primitive(const dnnl::primitive& p) { prim_ = p; }
  // oneDNN's name of the implementation the primitive runs (e.g. "jit_wino_4x3:avx512_core").
  std::string impl() const;
  // Bytes of argument `arg` in the caller's layout.
  std::size_t bytes_of(int arg) const;

  // Binds every argument of the plan (in any order) and runs reorders and the primitive, each
  // with the thread count it was created for.
  void run(const dnnl::stream& s, scratch_arena& arena, std::initializer_list<binding> args);

 private:
  struct slot {
    int arg = 0;
    bool is_output = false;
    dnnl::memory user;    // the caller's layout over the caller's pointer
    dnnl::memory inner;   // what the primitive sees: `user` itself, or a staged copy
    dnnl::reorder stage;  // user -> inner for inputs, inner -> user for outputs
    bool staged = false;
    int n_threads = 1;       // of the staging reorder
    std::size_t offset = 0;  // of the staged copy in the arena
    void* user_ptr = nullptr;
    void* inner_ptr = nullptr;
    bool bound = false;
  };
  void add(int arg, bool is_output, const dnnl::memory::desc& user, const dnnl::memory::desc& want, bool accumulate);

  dnnl::engine eng_;
  int n_threads_;
  double min_parallel_work_;
  dnnl::primitive prim_;
  std::vector<slot> slots_;
  std::unordered_map<int, dnnl::memory> exec_args_;
  std::size_t arena_bytes_ = 0;
  dnnl::memory scratch_;  // empty without a scratchpad
  std::size_t scratch_offset_ = 0;
  void* scratch_ptr_ = nullptr;
};

}  // namespace cleave::backend::detail
