// Tensor shapes.
#include "cleave/core/shape.h"

#include "cleave/core/error.h"

namespace cleave::core {

shape::shape(std::initializer_list<std::int64_t> dims) {
  CLEAVE_ASSERT(dims.size() <= static_cast<std::size_t>(max_rank), "rank above 4");
  for (auto d : dims) dims_[rank_++] = d;
}

std::int64_t shape::numel() const {
  return numel_from(0);
}

std::int64_t shape::numel_from(int first) const {
  std::int64_t n = 1;
  for (int i = first; i < rank_; ++i) n *= dims_[i];
  return n;
}

std::string shape::str() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ",";
    s += std::to_string(dims_[i]);
  }
  return s + ")";
}

shape shape::with_batch(std::int64_t n) const {
  shape s = *this;
  CLEAVE_ASSERT(rank_ > 0);
  s.dims_[0] = n;
  return s;
}

shape shape::batched(std::int64_t n) const {
  CLEAVE_ASSERT(rank_ < max_rank, "no room for a batch dimension in " + str());
  shape s;
  s.rank_ = rank_ + 1;
  s.dims_[0] = n;
  for (int i = 0; i < rank_; ++i) s.dims_[i + 1] = dims_[i];
  return s;
}

bool operator==(const shape& a, const shape& b) {
  if (a.rank_ != b.rank_) return false;
  for (int i = 0; i < a.rank_; ++i)
    if (a.dims_[i] != b.dims_[i]) return false;
  return true;
}

}  // namespace cleave::core
