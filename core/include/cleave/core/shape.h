// Tensor shapes: up to 4 dimensions, row-major (NCHW for images).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace cleave::core {

class shape {
 public:
  static constexpr int max_rank = 4;

  shape() = default;
  shape(std::initializer_list<std::int64_t> dims);

  int rank() const { return rank_; }
  std::int64_t operator[](int i) const { return dims_[i]; }
  std::int64_t& operator[](int i) { return dims_[i]; }
  // Product of all dimensions (1 for rank 0).
  std::int64_t numel() const;
  // Product of dimensions from `first` on (elements per item when first == 1).
  std::int64_t numel_from(int first) const;
  std::string str() const;  // "(64,1,28,28)"

  // Returns the same shape with dimension 0 replaced.
  shape with_batch(std::int64_t n) const;
  // A per-sample shape with a leading batch dimension n: (C,H,W) -> (n,C,H,W).
  shape batched(std::int64_t n) const;

  friend bool operator==(const shape& a, const shape& b);

 private:
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
};

}  // namespace cleave::core
