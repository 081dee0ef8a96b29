// Primitive plans: staging of arguments whose layout differs from the caller's, and the arena.
#include "op_cache.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "cleave/core/error.h"
#include "dnnl_check.h"

namespace cleave::backend::detail {

void set_omp_threads(int n) {
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

op_key& op_key::operator<<(std::int64_t v) {
  CLEAVE_ASSERT(n_ < max_values, "op_key: too many values");
  v_[n_++] = v;
  return *this;
}

op_key& op_key::operator<<(float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return *this << static_cast<std::int64_t>(bits);
}

bool op_key::operator==(const op_key& o) const {
  return n_ == o.n_ && std::equal(v_.begin(), v_.begin() + n_, o.v_.begin());
}

std::size_t op_key::hash() const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the values
  for (int i = 0; i < n_; ++i) {
    h ^= static_cast<std::uint64_t>(v_[i]);
    h *= 1099511628211ull;
  }
  return static_cast<std::size_t>(h);
}

void scratch_arena::free_deleter::operator()(char* p) const {
  std::free(p);
}

char* scratch_arena::reserve(std::size_t bytes) {
  if (bytes > bytes_ || !data_) {
    const std::size_t n = std::max<std::size_t>(64, ((bytes + 63) / 64) * 64);
    data_.reset(static_cast<char*>(std::aligned_alloc(64, n)));
    if (!data_) throw std::bad_alloc();
    bytes_ = n;
  }
  return data_.get();
}

void planned_op::input(int arg, const dnnl::memory::desc& user, const dnnl::memory::desc& want) {
  add(arg, false, user, want, false);
}

void planned_op::output(int arg, const dnnl::memory::desc& user, const dnnl::memory::desc& want, bool accumulate) {
  add(arg, true, user, want, accumulate);
}

void planned_op::add(int arg, bool is_output, const dnnl::memory::desc& user, const dnnl::memory::desc& want,
                     bool accumulate) {
  slot s;
  s.arg = arg;
  s.is_output = is_output;
  s.user = CLEAVE_CHECK_DNNL(dnnl::memory(user, eng_, DNNL_MEMORY_NONE));
  s.staged = accumulate || user != want;
  if (s.staged) {
    s.inner = CLEAVE_CHECK_DNNL(dnnl::memory(want, eng_, DNNL_MEMORY_NONE));
    s.offset = arena_bytes_;
    arena_bytes_ += (want.get_size() + 63) / 64 * 64;
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    const auto& src = is_output ? want : user;
    const auto& dst = is_output ? user : want;
    const double work = 4.0 * static_cast<double>(user.get_size() + want.get_size());
    s.n_threads = work >= min_parallel_work_ ? n_threads_ : 1;
    set_omp_threads(s.n_threads);
    s.stage = CLEAVE_CHECK_DNNL(dnnl::reorder(dnnl::reorder::primitive_desc(eng_, src, eng_, dst, attr)));
    set_omp_threads(n_threads_);
  } else {
    s.inner = s.user;
  }
  exec_args_[arg] = s.inner;
  slots_.push_back(std::move(s));
}

void planned_op::scratchpad(const dnnl::memory::desc& md) {
  if (md.get_size() == 0) return;
  scratch_ = CLEAVE_CHECK_DNNL(dnnl::memory(md, eng_, DNNL_MEMORY_NONE));
  scratch_offset_ = arena_bytes_;
  arena_bytes_ += (md.get_size() + 63) / 64 * 64;
  exec_args_[DNNL_ARG_SCRATCHPAD] = scratch_;
}

std::string planned_op::impl() const {
  if (!prim_) return {};
  const char* name = nullptr;
  if (dnnl_primitive_desc_query(prim_.get_primitive_desc(), dnnl_query_impl_info_str, 0, &name) != dnnl_success ||
      name == nullptr)
    return {};
  return name;
}

std::size_t planned_op::bytes_of(int arg) const {
  for (const auto& s : slots_)
    if (s.arg == arg) return s.user.get_desc().get_size();
  CLEAVE_ASSERT(false, "argument " + std::to_string(arg) + " is not part of this primitive");
  return 0;
}

void planned_op::run(const dnnl::stream& strm, scratch_arena& arena, std::initializer_list<binding> args) {
  char* base = arena_bytes_ ? arena.reserve(arena_bytes_) : nullptr;
  for (auto& s : slots_) s.bound = false;
  for (const auto& b : args) {
    if (!b.data) continue;
    auto it = std::find_if(slots_.begin(), slots_.end(), [&](const slot& s) { return s.arg == b.arg; });
    CLEAVE_ASSERT(it != slots_.end(), "argument " + std::to_string(b.arg) + " is not part of this primitive");
    // Setting a handle can zero the padding of a blocked layout: only do it when it changes.
    if (it->user_ptr != b.data) {
      CLEAVE_CHECK_DNNL(it->user.set_data_handle(b.data));
      it->user_ptr = b.data;
    }
    it->bound = true;
  }
  for (auto& s : slots_) {
    CLEAVE_ASSERT(s.bound, "argument " + std::to_string(s.arg) + " of a primitive was not given");
    if (s.staged && s.inner_ptr != base + s.offset) {
      CLEAVE_CHECK_DNNL(s.inner.set_data_handle(base + s.offset));
      s.inner_ptr = base + s.offset;
    }
  }
  if (scratch_ && scratch_ptr_ != base + scratch_offset_) {
    CLEAVE_CHECK_DNNL(scratch_.set_data_handle(base + scratch_offset_));
    scratch_ptr_ = base + scratch_offset_;
  }
  for (auto& s : slots_)
    if (s.staged && !s.is_output) {
      set_omp_threads(s.n_threads);
      CLEAVE_CHECK_DNNL(s.stage.execute(strm, s.user, s.inner));
    }
  set_omp_threads(n_threads_);
  CLEAVE_CHECK_DNNL(prim_.execute(strm, exec_args_));
  for (auto& s : slots_)
    if (s.staged && s.is_output) {
      set_omp_threads(s.n_threads);
      CLEAVE_CHECK_DNNL(s.stage.execute(strm, s.inner, s.user));
    }
}

}  // namespace cleave::backend::detail
