// oneDNN backend: activations kept in the blocked layouts convolutions write them in.
//
// A convolution primitive on channels in 16s works on nChw16c (nChw8c without AVX-512). Its
// output used to be reordered to NCHW at once and the next convolution's input reordered back:
// two reorders per activation, 9-15% of a ResNet-18 or MobileNetV2 training step. Now an output
// whose blocked layout is unpadded (channels in blocks) stays blocked, noted on its buffer (the
// byte range and the layout's id), and every op reads the note of each tensor it gets:
// convolutions, batch norm, ReLU and clamp, and the element-wise ops whose operands share a
// layout run on it and note their outputs; every other op, download(), and code that reads the
// memory through its pointer (core::backend::make_row_major) reorder it back first, in place.
// A note dies with its buffer; a write by an op that knows only row-major drops it.
#include <algorithm>
#include <cstring>

#include "dnnl_check.h"
#include "host_buffer.h"
#include "onednn_backend.h"

namespace cleave::backend::detail {

using core::tensor;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

namespace {

// The byte ranges of one buffer that hold a tensor in a kept layout.
struct layout_note final : buffer_note {
  struct region {
    std::size_t offset, bytes;
    int layout;
  };
  std::vector<region> regions;
};

host_buffer& host_buf(const core::backend& b, const tensor& t) {
  CLEAVE_ASSERT(t.owner() == &b, "onednn: a tensor of another backend");
  return static_cast<host_buffer&>(*t.buf());
}

layout_note* note_of(const core::backend& b, const tensor& t) {
  if (!t.defined() || t.bytes() == 0) return nullptr;
  auto& hb = host_buf(b, t);
  return static_cast<layout_note*>(hb.note.get());
}

bool overlaps(const layout_note::region& r, const tensor& t) {
  return r.offset < t.offset() + t.bytes() && t.offset() < r.offset + r.bytes;
}

dnnl::memory::desc row_major_of(const dnnl::memory::desc& md) {
  return {md.dims(), dt::f32, tag::nchw};
}

}  // namespace

int onednn_backend::layout_block(int id) const {
  const auto& md = layout_md(id);
  return md == dnnl::memory::desc(md.dims(), dt::f32, tag::nChw16c) ? 16 : 8;
}

int onednn_backend::keep_layout(const dnnl::memory::desc& md) {
  if (!keep_layouts_ || md.dims().size() != 4 || md.data_type() != dt::f32) return 0;
  const auto plain = row_major_of(md);
  if (md.get_size() != plain.get_size()) return 0;  // padded channels
  const bool blocked = md == dnnl::memory::desc(md.dims(), dt::f32, tag::nChw16c) ||
                       md == dnnl::memory::desc(md.dims(), dt::f32, tag::nChw8c);
  if (!blocked) return 0;
  for (std::size_t i = 0; i < layouts_.size(); ++i)
    if (layouts_[i] == md) return static_cast<int>(i + 1);
  layouts_.push_back(md);
  to_row_major_.emplace_back();
  return static_cast<int>(layouts_.size());
}

void onednn_backend::reorder_to_row_major(const void* src, void* dst, int id) {
  const auto& md = layout_md(id);
  const auto plain = row_major_of(md);
  auto& r = to_row_major_[static_cast<std::size_t>(id - 1)];
  set_omp_threads(threads_for(8.0 * static_cast<double>(md.get_size())));
  if (!r) r = CLEAVE_CHECK_DNNL(dnnl::reorder(dnnl::reorder::primitive_desc(eng_, md, eng_, plain)));
  dnnl::memory from = CLEAVE_CHECK_DNNL(dnnl::memory(md, eng_, const_cast<void*>(src)));
  dnnl::memory to = CLEAVE_CHECK_DNNL(dnnl::memory(plain, eng_, dst));
  CLEAVE_CHECK_DNNL(r.execute(stream_, from, to));
  ++layout_reorders_;
}

void onednn_backend::reorder_in_place(void* data, int id) {
  // Through the arena (free between ops), then copied back.
  const std::size_t bytes = layout_md(id).get_size();
  char* tmp = arena_.reserve(bytes);
  reorder_to_row_major(data, tmp, id);
  std::memcpy(data, tmp, bytes);
}

int onednn_backend::settle(const tensor& t, settle_mode mode) {
  auto* note = note_of(*this, t);
  if (!note) return 0;
  int exact = 0;
  auto& regs = note->regions;
  char* base = static_cast<char*>(t.buf()->host_data());
  for (std::size_t i = 0; i < regs.size();) {
    const auto& r = regs[i];
    const bool same = r.offset == t.offset() && r.bytes == t.bytes();
    const bool inside = r.offset >= t.offset() && r.offset + r.bytes <= t.offset() + t.bytes();
    if (!overlaps(r, t) || (mode == settle_mode::read && same)) {
      if (overlaps(r, t)) exact = r.layout;
      ++i;
      continue;
    }
    // Overwritten entirely: nothing to keep. Otherwise its values are needed row-major.
    if (!(mode == settle_mode::overwrite && inside)) reorder_in_place(base + r.offset, r.layout);
    regs.erase(regs.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return exact;
}

bool onednn_backend::describes_images(int id, const tensor& t) const {
  const auto& s = t.shape();
  return s.rank() == 4 && layout_md(id).dims() == dnnl::memory::dims{s[0], s[1], s[2], s[3]};
}

int onednn_backend::image_layout_of(const tensor& t) {
  const int id = layout_of(t);
  if (id == 0) return 0;
  if (describes_images(id, t)) return id;
  row_major({&t});
  return 0;
}

void onednn_backend::row_major(std::initializer_list<const tensor*> ts) {
  for (const tensor* t : ts)
    if (t) settle(*t, settle_mode::row_major);
}

int onednn_backend::shared_layout(const tensor& a, const tensor& b) {
  const int id = layout_of(a);
  if (layout_of(b) == id) return id;
  row_major({&a, &b});
  return 0;
}

void onednn_backend::wrote(const tensor& t, int layout) {
  if (layout == 0 || t.bytes() == 0) return;
  auto& hb = host_buf(*this, t);
  if (!hb.note) hb.note = std::make_unique<layout_note>();
  static_cast<layout_note&>(*hb.note).regions.push_back({t.offset(), t.bytes(), layout});
}

void onednn_backend::make_row_major(const tensor& t) {
  row_major({&t});
}

// ---- memory ------------------------------------------------------------------------------------

void onednn_backend::upload(const tensor& dst, const void* src) {
  claim(dst);
  reference_backend::upload(dst, src);
}

void onednn_backend::download(const tensor& src, void* dst) {
  synchronize();
  if (const int id = layout_of(src); id != 0)  // reordered straight into dst; src keeps its layout
    return reorder_to_row_major(src.host_data(), dst, id);
  reference_backend::download(src, dst);
}

// ---- element-wise: on the operands' shared layout, else row-major -------------------------------

void onednn_backend::fill(const tensor& t, float value) {
  claim(t);
  reference_backend::fill(t, value);
}

void onednn_backend::copy(const tensor& src, const tensor& dst) {
  const int id = src.dtype() == core::dtype::f32 ? layout_of(src) : 0;
  claim(dst);
  reference_backend::copy(src, dst);
  wrote(dst, id);
}

void onednn_backend::cast(const tensor& src, const tensor& dst) {
  row_major({&src});
  claim(dst);
  reference_backend::cast(src, dst);
}

void onednn_backend::add(const tensor& a, const tensor& b, const tensor& y) {
  const int id = shared_layout(a, b);
  claim(y);
  reference_backend::add(a, b, y);
  wrote(y, id);
}

void onednn_backend::mul(const tensor& a, const tensor& b, const tensor& y) {
  const int id = shared_layout(a, b);
  claim(y);
  reference_backend::mul(a, b, y);
  wrote(y, id);
}

void onednn_backend::axpy(float alpha, const tensor& x, const tensor& y) {
  shared_layout(x, y);  // y keeps its note when both share it
  reference_backend::axpy(alpha, x, y);
}

void onednn_backend::dropout_forward(const tensor& x, const tensor& y, const tensor& mask, float p,
                                     std::uint32_t seed) {
  // The mask is drawn per element index in row-major order.
  row_major({&x, &mask});
  claim(y);
  reference_backend::dropout_forward(x, y, mask, p, seed);
}

void onednn_backend::softmax_xent_forward(const tensor& logits, const tensor& labels, const tensor& probs,
                                          const tensor& loss) {
  row_major({&logits, &labels, &probs, &loss});
  reference_backend::softmax_xent_forward(logits, labels, probs, loss);
}

void onednn_backend::softmax_xent_backward(const tensor& probs, const tensor& labels, const tensor& dlogits,
                                           float scale) {
  row_major({&probs, &labels, &dlogits});
  reference_backend::softmax_xent_backward(probs, labels, dlogits, scale);
}

}  // namespace cleave::backend::detail
