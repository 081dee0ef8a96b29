// Inbound frames: FlatBuffers verification with depth and table limits, then the semantic checks
// of every message type. Nothing here trusts a value before it is checked.
#include <cmath>
#include <cstring>
#include <string>

#include "cleave/core/codec.h"
#include "cleave/transport/message.h"

namespace cleave::transport {

namespace {

using tensor_list = flatbuffers::Vector<flatbuffers::Offset<wire::Tensor>>;

class checker {
 public:
  explicit checker(const frame_limits& limits) : lim_(limits) {}

  const std::string& reason() const { return reason_; }

  bool fail(std::string what) {
    reason_ = std::move(what);
    return false;
  }

  bool string(const flatbuffers::String* s, const char* what) {
    if (s && s->size() > lim_.max_string_bytes)
      return fail(std::string(what) + " of " + std::to_string(s->size()) + " bytes exceeds the limit of " +
                  std::to_string(lim_.max_string_bytes));
    return true;
  }

  template <class T>
  bool count(const flatbuffers::Vector<T>* v, std::uint32_t max, const char* what) {
    if (v && v->size() > max)
      return fail(std::string(what) + ": " + std::to_string(v->size()) + " entries exceed the limit of " +
                  std::to_string(max));
    return true;
  }

  bool node(std::uint32_t id, const char* what) {
    if (id >= lim_.max_node_id)
      return fail(std::string(what) + " " + std::to_string(id) + " out of range [0, " +
                  std::to_string(lim_.max_node_id) + ")");
    return true;
  }

  bool block(std::uint32_t b, const char* what) {
    if (b > lim_.max_blocks)
      return fail(std::string(what) + " " + std::to_string(b) + " out of range [0, " + std::to_string(lim_.max_blocks) +
                  "]");
    return true;
  }

  // A block range [first, end), possibly empty (a relay stage), with end <= bound.
  bool span(std::uint32_t first, std::uint32_t end, std::uint32_t bound, const char* what) {
    if (!(first <= end && end <= bound))
      return fail(std::string(what) + " block range [" + std::to_string(first) + ", " + std::to_string(end) +
                  ") is reversed or beyond " + std::to_string(bound));
    return true;
  }

  // A non-empty block range [first, end) with end <= bound.
  bool range(std::uint32_t first, std::uint32_t end, std::uint32_t bound, const char* what) {
    if (!(first < end && end <= bound))
      return fail(std::string(what) + " block range [" + std::to_string(first) + ", " + std::to_string(end) +
                  ") is empty or beyond " + std::to_string(bound));
    return true;
  }

  bool micro_batch(std::uint32_t mb) {
    if (mb >= lim_.max_micro_batches)
      return fail("micro-batch " + std::to_string(mb) + " out of range [0, " + std::to_string(lim_.max_micro_batches) +
                  ")");
    return true;
  }

  // A tier blocks run on (the admin role runs none: only a Hello may name it).
  bool role(wire::Role r, const char* what, bool admin_allowed = false) {
    if (static_cast<unsigned>(r) > static_cast<unsigned>(wire::Role::MAX) || (r == wire::Role::admin && !admin_allowed))
      return fail(std::string(what) + ": unknown role " + std::to_string(static_cast<unsigned>(r)));
    return true;
  }

  bool measure(float v, const char* what) {
    if (!std::isfinite(v) || v < 0) return fail(std::string(what) + " is negative or not finite");
    return true;
  }

  // Which codecs a tensor may carry: plain tensors none; a step's activation all but topk.
  enum class coded { no, activation, gradient };

  bool tensor(const wire::Tensor* t, const char* what, coded use = coded::no) {
    if (!t) return fail(std::string(what) + ": missing tensor");
    if (!string(t->name(), "tensor name")) return false;
    const auto dt = core::dtype_from_int(static_cast<std::uint32_t>(t->dtype()));
    if (!dt) return fail(std::string(what) + ": unknown dtype " + std::to_string(static_cast<unsigned>(t->dtype())));
    const auto* shape = t->shape();
    const std::uint32_t rank = shape ? shape->size() : 0;
    if (rank > static_cast<std::uint32_t>(core::shape::max_rank))
      return fail(std::string(what) + ": rank " + std::to_string(rank) + " above " +
                  std::to_string(core::shape::max_rank));
    // The Verifier checks a vector's length field, not its elements' alignment.
    if (rank > 0 && reinterpret_cast<std::uintptr_t>(shape->data()) % alignof(std::int64_t) != 0)
      return fail(std::string(what) + ": misaligned shape");
    // The count as receivers compute it (signed, left to right) must not overflow either: a zero
    // dimension makes the product 0, but not the product of the dimensions before it.
    std::uint64_t n = 1;
    std::int64_t nonzero = 1;
    for (std::uint32_t i = 0; i < rank; ++i) {
      const std::int64_t d = shape->Get(i);
      if (d < 0) return fail(std::string(what) + ": negative dimension " + std::to_string(d));
      if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n) ||
          (d > 0 && __builtin_mul_overflow(nonzero, d, &nonzero)))
        return fail(std::string(what) + ": element count overflows");
    }
    if (!encoding(*t, *dt, n, what, use)) return false;
    if (t->codec() == wire::Codec::topk) {
      // Its decoded size is not bounded by its data: a few values could claim a huge tensor.
      if (n > lim_.max_frame_bytes / sizeof(float))
        return fail(std::string(what) + ": topk tensor of " + std::to_string(n) +
                    " values would decode to more than the frame limit");
      n = t->positions()->size();  // the values kept
    }
    std::uint64_t bytes = 0;
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(core::dtype_size(*dt)), &bytes))
      return fail(std::string(what) + ": byte size overflows");
    const std::uint64_t have = t->data() ? t->data()->size() : 0;
    if (bytes != have)
      return fail(std::string(what) + ": shape and dtype need " + std::to_string(bytes) + " bytes, data holds " +
                  std::to_string(have));
    // Receivers read tensor data in place as its element type.
    if (have > 0 && reinterpret_cast<std::uintptr_t>(t->data()->data()) % frame_alignment != 0)
      return fail(std::string(what) + ": data is not 32-byte aligned");
    ++n_tensors_;
    if (n_tensors_ > lim_.max_tensors)
      return fail("more than " + std::to_string(lim_.max_tensors) + " tensors in one message");
    return true;
  }

  // The codec of a tensor of n (decoded) values: allowed here, with the dtype it implies, its
  // scales or positions as it needs them and nothing it does not.
  bool encoding(const wire::Tensor& t, core::dtype dt, std::uint64_t n, const char* what, coded use) {
    const auto c = core::codec_from_int(static_cast<std::uint32_t>(t.codec()));
    if (!c) return fail(std::string(what) + ": unknown codec " + std::to_string(static_cast<unsigned>(t.codec())));
    const std::string name(core::codec_name(*c));
    if (*c != core::codec::f32 && use == coded::no)
      return fail(std::string(what) + ": codec " + name + " not allowed here");
    if (*c == core::codec::topk && use != coded::gradient)
      return fail(std::string(what) + ": codec topk is for gradients only");
    static constexpr core::dtype implied[] = {core::dtype::f32, core::dtype::f16, core::dtype::bf16, core::dtype::i8,
                                              core::dtype::f32};
    if (*c != core::codec::f32 && dt != implied[static_cast<int>(*c)])
      return fail(std::string(what) + ": codec " + name + " with dtype " + std::string(core::dtype_name(dt)));
    if (use != coded::no && dt != core::dtype::f32 && *c == core::codec::f32)
      return fail(std::string(what) + ": dtype " + std::string(core::dtype_name(dt)) + " without a codec");
    if ((t.scales() != nullptr) != (*c == core::codec::int8))
      return fail(std::string(what) + ": scales " + (t.scales() ? "with codec " + name : "missing for int8"));
    if ((t.positions() != nullptr) != (*c == core::codec::topk))
      return fail(std::string(what) + ": positions " + (t.positions() ? "with codec " + name : "missing for topk"));
    if (t.scales()) {
      const auto* s = t.shape();
      const std::uint64_t channels = s && s->size() >= 2 ? static_cast<std::uint64_t>(s->Get(1)) : 1;
      if (t.scales()->size() != channels)
        return fail(std::string(what) + ": " + std::to_string(t.scales()->size()) + " int8 scales for " +
                    std::to_string(channels) + " channels");
      for (float v : *t.scales())  // NaN: a channel that held a non-finite value (it decodes to NaN)
        if (v < 0 || std::isinf(v)) return fail(std::string(what) + ": int8 scale " + std::to_string(v));
    }
    if (t.positions()) {
      const auto& p = *t.positions();
      if (p.size() > n) return fail(std::string(what) + ": more topk positions than values");
      for (std::uint32_t i = 0; i < p.size(); ++i)
        if (p.Get(i) >= n || (i > 0 && p.Get(i) <= p.Get(i - 1)))
          return fail(std::string(what) + ": topk positions out of range or not increasing at " + std::to_string(i));
    }
    return true;
  }

  bool tensors(const tensor_list* v, const char* what) {
    if (!count(v, lim_.max_tensors, what)) return false;
    if (!v) return true;
    for (const auto* t : *v)
      if (!tensor(t, what)) return false;
    return true;
  }

  // Activations and Gradients share their ids.
  template <class T>
  bool step(const T& m) {
    return node(m.device_id(), "device id") && block(m.block(), "block") && micro_batch(m.micro_batch());
  }

  bool check(const wire::Hello& m) {
    if (!role(m.role(), "hello", true) || !node(m.node_id(), "node id") || !string(m.name(), "name") ||
        !count(m.backends(), lim_.max_list, "backends") || !measure(m.gflops(), "gflops"))
      return false;
    if (m.backends())
      for (const auto* b : *m.backends())
        if (!string(b->name(), "backend name") || !measure(b->gflops(), "backend gflops")) return false;
    return true;
  }

  bool check(const wire::Welcome& m) { return node(m.node_id(), "node id"); }

  bool check(const wire::Plan& m) {
    if (m.n_blocks() > lim_.max_blocks)
      return fail("plan of " + std::to_string(m.n_blocks()) + " blocks exceeds the limit of " +
                  std::to_string(lim_.max_blocks));
    if (m.model() && m.model()->size() > lim_.max_model_bytes)
      return fail("model spec of " + std::to_string(m.model()->size()) + " bytes exceeds the limit of " +
                  std::to_string(lim_.max_model_bytes));
    if (!string(m.training(), "training settings") || !count(m.devices(), lim_.max_list, "plan devices")) return false;
    if (m.n_micro_batches() > lim_.max_micro_batches)
      return fail("plan of " + std::to_string(m.n_micro_batches()) + " micro-batches exceeds the limit");
    if (!(m.topk_fraction() >= 0.0f && m.topk_fraction() <= 1.0f)) return fail("plan: topk fraction not in [0, 1]");
    if (!m.devices()) return true;
    for (const auto* d : *m.devices()) {
      if (!node(d->device_id(), "device id") || !count(d->stages(), lim_.max_list, "plan stages") ||
          !count(d->hop_codecs(), lim_.max_list, "plan hop codecs"))
        return false;
      if (d->n_micro_batches() > lim_.max_micro_batches)
        return fail("device plan of " + std::to_string(d->n_micro_batches()) + " micro-batches exceeds the limit");
      if (d->hop_codecs()) {
        const auto& h = *d->hop_codecs();
        if (h.size() % 2) return fail("device plan: hop codecs come in pairs (up, down)");
        for (std::uint32_t i = 0; i < h.size(); ++i) {
          const auto c = core::codec_from_int(static_cast<std::uint32_t>(h.Get(i)));
          if (!c) return fail("device plan: unknown codec " + std::to_string(static_cast<unsigned>(h.Get(i))));
          if (i % 2 == 0 && !core::codec_for_activations(*c)) return fail("device plan: topk for activations");
        }
      }
      if (!d->stages()) continue;
      for (const auto* s : *d->stages())
        if (!node(s->node_id(), "stage node id") || !role(s->role(), "stage") ||
            !span(s->first_block(), s->end_block(), m.n_blocks(), "stage"))
          return false;
    }
    return true;
  }

  bool check(const wire::Activations& m) {
    if (!step(m) || !tensor(m.activation(), "activation", coded::activation)) return false;
    if (m.batch_size() || m.n_micro_batches()) {
      const auto* a = m.activation()->shape();
      if (m.n_micro_batches() == 0 || m.n_micro_batches() > lim_.max_micro_batches ||
          m.n_micro_batches() > m.batch_size() || !a || a->size() == 0 || a->Get(0) < 1 ||
          static_cast<std::uint64_t>(a->Get(0)) > m.batch_size())
        return fail("batch size " + std::to_string(m.batch_size()) + " and " + std::to_string(m.n_micro_batches()) +
                    " micro-batches do not fit the activation");
    }
    if (!m.labels()) return true;
    if (!tensor(m.labels(), "labels")) return false;
    const auto* a = m.activation()->shape();
    const auto* l = m.labels()->shape();
    if (!a || !l || a->size() == 0 || l->size() == 0 || a->Get(0) != l->Get(0))
      return fail("labels and activation disagree on the batch size");
    return true;
  }

  bool check(const wire::Gradients& m) { return step(m) && tensor(m.gradient(), "gradient", coded::gradient); }

  bool check(const wire::RoundStart& m) {
    if (!std::isfinite(m.learning_rate()) || m.learning_rate() < 0)
      return fail("learning rate is not a finite number >= 0");
    return node(m.device_id(), "device id") && nodes(m.devices(), "round devices");
  }

  bool check(const wire::ReplicaUpload& m) {
    if (!node(m.node_id(), "node id") || !nodes(m.devices(), "replica devices") ||
        !measure(static_cast<float>(m.loss_sum()), "loss sum"))
      return false;
    // A part without weights (statistics only) may have an empty range.
    const bool empty = m.first_block() == m.end_block() && (!m.weights() || m.weights()->size() == 0);
    return (empty || range(m.first_block(), m.end_block(), lim_.max_blocks, "replica")) &&
           tensors(m.weights(), "weights");
  }

  bool check(const wire::GlobalWeights& m) {
    return node(m.device_id(), "device id") &&
           range(m.first_block(), m.end_block(), lim_.max_blocks, "global weights") && tensors(m.weights(), "weights");
  }

  bool check(const wire::Leave& m) { return node(m.node_id(), "node id") && string(m.reason(), "reason"); }

  bool nodes(const flatbuffers::Vector<std::uint32_t>* v, const char* what) {
    if (!count(v, lim_.max_list, what)) return false;
    if (v)
      for (auto id : *v)
        if (!node(id, what)) return false;
    return true;
  }

  bool check(const wire::Profile& m) {
    if (!node(m.node_id(), "node id") || !count(m.blocks(), lim_.max_blocks, "block profiles") ||
        !count(m.links(), lim_.max_list, "link profiles"))
      return false;
    if (m.blocks())
      for (const auto* b : *m.blocks())
        if (!block(b->block(), "profiled block") || !measure(b->forward_us(), "forward time") ||
            !measure(b->backward_us(), "backward time"))
          return false;
    if (m.links())
      for (const auto* l : *m.links())
        if (!node(l->peer_id(), "peer id") || !measure(l->rtt_us(), "rtt") ||
            !measure(l->bandwidth_bytes_per_s(), "bandwidth"))
          return false;
    return true;
  }

  bool check(const wire::Migrate& m) {
    return range(m.first_block(), m.end_block(), lim_.max_blocks, "migrated") && node(m.from_node(), "from node") &&
           node(m.to_node(), "to node") && node(m.device_id(), "device id") && role(m.from_role(), "from") &&
           role(m.to_role(), "to") && tensors(m.weights(), "weights") &&
           tensors(m.optimizer_state(), "optimizer state");
  }

  bool check(const wire::Cutover& m) { return node(m.device_id(), "device id"); }

  bool check(const wire::Revocations& m) {
    if (!m.crl() || m.crl()->size() == 0) return fail("no revocation list");
    if (m.crl()->size() > max_crl_bytes)
      return fail("a revocation list of " + std::to_string(m.crl()->size()) + " bytes (at most " +
                  std::to_string(max_crl_bytes) + ")");
    return true;
  }

  bool check(const wire::SecAgg& m) {
    if (static_cast<unsigned>(m.phase()) > static_cast<unsigned>(wire::SecAggPhase::MAX))
      return fail("unknown secure aggregation phase " + std::to_string(static_cast<unsigned>(m.phase())));
    if (!node(m.device_id(), "device id") || !count(m.keys(), lim_.max_list, "keys") ||
        !count(m.blobs(), lim_.max_list, "blobs") || !nodes(m.devices(), "devices") ||
        !nodes(m.dropped(), "dropped devices") || !count(m.blocks(), 2 * lim_.max_blocks, "block bounds") ||
        !count(m.devices(), lim_.max_list, "devices"))
      return false;
    if (m.threshold() > lim_.max_list) return fail("threshold " + std::to_string(m.threshold()) + " out of range");
    if (m.keys())
      for (const auto* k : *m.keys()) {
        if (!node(k->device_id(), "key of device") || !k->mask_public() || k->mask_public()->size() != 32 ||
            !k->encrypt_public() || k->encrypt_public()->size() != 32)
          return fail("key of device " + std::to_string(k->device_id()) + ": public keys must be 32 bytes each");
        if ((k->certificate() && k->certificate()->size() > max_blob_bytes) ||
            (k->signature() && k->signature()->size() > max_blob_bytes))
          return fail("key of device " + std::to_string(k->device_id()) + ": certificate or signature exceeds " +
                      std::to_string(max_blob_bytes) + " bytes");
      }
    if (m.blobs())
      for (const auto* b : *m.blobs())
        if (!node(b->device_id(), "blob of device") || (b->data() && b->data()->size() > max_blob_bytes))
          return fail("blob of device " + std::to_string(b->device_id()) + " exceeds " +
                      std::to_string(max_blob_bytes) + " bytes");
    if (m.blocks()) {
      if (m.blocks()->size() % 2) return fail("an odd number of block bounds");
      for (auto b : *m.blocks())
        if (!block(b, "masked block bound")) return false;
    }
    return true;
  }

  bool check(const wire::Ping&) { return true; }
  bool check(const wire::Pong&) { return true; }
  bool check(const wire::Error& m) { return string(m.message(), "error text"); }

  bool check(const wire::AdminRequest& m) {
    return string(m.action(), "action") && string(m.text(), "text") && bytes(m.data(), "data");
  }

  bool check(const wire::AdminReply& m) { return string(m.text(), "text") && bytes(m.data(), "data"); }

 private:
  static constexpr std::uint32_t max_blob_bytes = 4096;  // a sealed pair of shares is 116
  static constexpr std::uint32_t max_crl_bytes = 8u << 20;  // about 200,000 revoked certificates
  static constexpr std::uint32_t max_admin_bytes = 4u << 20;  // a job file, a piece of a log or model

  bool bytes(const flatbuffers::Vector<std::uint8_t>* v, const char* what) {
    if (v && v->size() > max_admin_bytes)
      return fail(std::string(what) + " of " + std::to_string(v->size()) + " bytes (at most " +
                  std::to_string(max_admin_bytes) + ")");
    return true;
  }
  const frame_limits& lim_;
  std::string reason_;
  std::uint32_t n_tensors_ = 0;
};

template <class T>
bool check_body(checker& c, const wire::Message& m, const char* name) {
  const T* body = m.body_as<T>();
  if (!body) return c.fail(std::string("missing ") + name + " body");
  return c.check(*body);
}

std::string printable_identifier(const std::byte* p) {
  std::string s;
  for (int i = 0; i < 4; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    if (c >= 0x20 && c < 0x7f) {
      s += static_cast<char>(c);
    } else {
      static const char hex[] = "0123456789abcdef";
      s += "\\x";
      s += hex[c >> 4];
      s += hex[c & 15];
    }
  }
  return s;
}

}  // namespace

std::string_view body_name(wire::Body b) {
  if (static_cast<unsigned>(b) > static_cast<unsigned>(wire::Body::MAX)) return "unknown";
  return wire::EnumNameBody(b);
}

std::optional<std::string> check_message(const wire::Message& m, const frame_limits& limits) {
  checker c(limits);
  bool ok = false;
  switch (m.body_type()) {
    case wire::Body::Hello:
      ok = check_body<wire::Hello>(c, m, "Hello");
      break;
    case wire::Body::Welcome:
      ok = check_body<wire::Welcome>(c, m, "Welcome");
      break;
    case wire::Body::Plan:
      ok = check_body<wire::Plan>(c, m, "Plan");
      break;
    case wire::Body::Activations:
      ok = check_body<wire::Activations>(c, m, "Activations");
      break;
    case wire::Body::Gradients:
      ok = check_body<wire::Gradients>(c, m, "Gradients");
      break;
    case wire::Body::RoundStart:
      ok = check_body<wire::RoundStart>(c, m, "RoundStart");
      break;
    case wire::Body::ReplicaUpload:
      ok = check_body<wire::ReplicaUpload>(c, m, "ReplicaUpload");
      break;
    case wire::Body::GlobalWeights:
      ok = check_body<wire::GlobalWeights>(c, m, "GlobalWeights");
      break;
    case wire::Body::Profile:
      ok = check_body<wire::Profile>(c, m, "Profile");
      break;
    case wire::Body::Migrate:
      ok = check_body<wire::Migrate>(c, m, "Migrate");
      break;
    case wire::Body::Ping:
      ok = check_body<wire::Ping>(c, m, "Ping");
      break;
    case wire::Body::Pong:
      ok = check_body<wire::Pong>(c, m, "Pong");
      break;
    case wire::Body::Error:
      ok = check_body<wire::Error>(c, m, "Error");
      break;
    case wire::Body::Leave:
      ok = check_body<wire::Leave>(c, m, "Leave");
      break;
    case wire::Body::Cutover:
      ok = check_body<wire::Cutover>(c, m, "Cutover");
      break;
    case wire::Body::SecAgg:
      ok = check_body<wire::SecAgg>(c, m, "SecAgg");
      break;
    case wire::Body::Revocations:
      ok = check_body<wire::Revocations>(c, m, "Revocations");
      break;
    case wire::Body::AdminRequest:
      ok = check_body<wire::AdminRequest>(c, m, "AdminRequest");
      break;
    case wire::Body::AdminReply:
      ok = check_body<wire::AdminReply>(c, m, "AdminReply");
      break;
    case wire::Body::NONE:
    default:
      c.fail("unknown message type " + std::to_string(static_cast<unsigned>(m.body_type())));
      break;
  }
  if (ok) return std::nullopt;
  return std::string(body_name(m.body_type())) + ": " + c.reason();
}

result<message> decode_frame(aligned_bytes frame, const frame_limits& limits) {
  if (frame.empty() || frame.size() < frame_header_bytes + min_frame_body_bytes)
    return failure(errc::bad_frame, "frame of " + std::to_string(frame.size()) + " bytes is too short");
  const std::uint32_t body = read_frame_length(frame.data());
  if (auto e = check_frame_length(body, limits)) return failure(errc::bad_frame, *e);
  if (static_cast<std::size_t>(body) + frame_header_bytes != frame.size())
    return failure(errc::bad_frame, "length prefix says " + std::to_string(body) + " bytes but the frame holds " +
                                        std::to_string(frame.size() - frame_header_bytes));
  CLEAVE_ASSERT(reinterpret_cast<std::uintptr_t>(frame.data()) % frame_alignment == 0);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(frame.data());
  if (!flatbuffers::BufferHasIdentifier(bytes, wire::MessageIdentifier(), true))
    return failure(errc::bad_frame, "wrong file identifier '" +
                                        printable_identifier(frame.data() + frame_header_bytes + 4) + "' (expected '" +
                                        wire::MessageIdentifier() + "')");
  flatbuffers::Verifier::Options opts;
  opts.max_depth = limits.max_depth;
  opts.max_tables = limits.max_tables;
  opts.check_alignment = true;
  opts.check_nested_flatbuffers = false;
  flatbuffers::Verifier verifier(bytes, frame.size(), opts);
  if (!verifier.VerifySizePrefixedBuffer<wire::Message>(wire::MessageIdentifier()))
    return failure(errc::bad_frame,
                   "frame failed FlatBuffers verification (bad offsets, sizes, alignment, "
                   "or nesting beyond " +
                       std::to_string(limits.max_depth) + " levels / " + std::to_string(limits.max_tables) +
                       " tables)");
  const auto* root = flatbuffers::GetSizePrefixedRoot<wire::Message>(bytes);
  if (auto e = check_message(*root, limits)) return failure(errc::bad_frame, *e);
  message m;
  m.buf_ = std::move(frame);
  m.root_ = root;
  return m;
}

tensor_view view_of(const wire::Tensor& t) {
  tensor_view v;
  v.dtype = static_cast<core::dtype>(t.dtype());
  const auto* s = t.shape();
  const int rank = s ? static_cast<int>(s->size()) : 0;
  CLEAVE_ASSERT(rank <= core::shape::max_rank, "view_of needs a checked message");
  switch (rank) {
    case 0:
      v.shape = core::shape{};
      break;
    case 1:
      v.shape = core::shape{s->Get(0)};
      break;
    case 2:
      v.shape = core::shape{s->Get(0), s->Get(1)};
      break;
    case 3:
      v.shape = core::shape{s->Get(0), s->Get(1), s->Get(2)};
      break;
    default:
      v.shape = core::shape{s->Get(0), s->Get(1), s->Get(2), s->Get(3)};
      break;
  }
  if (t.data()) v.data = {reinterpret_cast<const std::byte*>(t.data()->data()), t.data()->size()};
  if (t.name()) v.name = t.name()->string_view();
  v.codec = static_cast<core::codec>(t.codec());
  if (t.scales()) v.scales = {t.scales()->data(), t.scales()->size()};
  if (t.positions()) v.positions = {t.positions()->data(), t.positions()->size()};
  return v;
}

void tensor_view::decode(float* y) const {
  const std::int64_t n = numel();
  switch (codec) {
    case core::codec::f32:
      CLEAVE_ASSERT(dtype == core::dtype::f32, "decode of a tensor that is not f32");
      if (n) std::memcpy(y, data.data(), data.size());
      return;
    case core::codec::f16:
      return core::decode_f16(reinterpret_cast<const std::uint16_t*>(data.data()), y, n);
    case core::codec::bf16:
      return core::decode_bf16(reinterpret_cast<const std::uint16_t*>(data.data()), y, n);
    case core::codec::int8: {
      std::int64_t dims[core::shape::max_rank] = {};
      for (int i = 0; i < shape.rank(); ++i) dims[i] = shape[i];
      return core::decode_int8(reinterpret_cast<const std::int8_t*>(data.data()), scales.data(),
                               core::channel_layout_of(dims, shape.rank()), y);
    }
    case core::codec::topk:
      return core::decode_topk(reinterpret_cast<const float*>(data.data()), positions.data(),
                               static_cast<std::int64_t>(positions.size()), y, n);
  }
}

}  // namespace cleave::transport
