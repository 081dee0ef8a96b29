// One-line descriptions of received messages, for logs and debugging; reads every field.
#include <string>

#include "cleave/core/tier.h"
#include "cleave/transport/message.h"

namespace cleave::transport {

namespace {

void add(std::string& s, const char* key, std::uint64_t v) {
  s += ' ';
  s += key;
  s += '=';
  s += std::to_string(v);
}

void add_float(std::string& s, const char* key, float v) {
  s += ' ';
  s += key;
  s += '=';
  s += std::to_string(v);
}

void add_text(std::string& s, const char* key, const flatbuffers::String* v) {
  if (!v) return;
  s += ' ';
  s += key;
  s += "=\"";
  s += v->string_view();
  s += '"';
}

void add_tensor(std::string& s, const char* key, const wire::Tensor* t) {
  if (!t) return;
  const tensor_view v = view_of(*t);
  s += ' ';
  s += key;
  s += '=';
  if (!v.name.empty()) {
    s += v.name;
    s += ':';
  }
  s += core::dtype_name(v.dtype);
  s += v.shape.str();
}

void add_tensors(std::string& s, const char* key, const flatbuffers::Vector<flatbuffers::Offset<wire::Tensor>>* list) {
  if (!list) return;
  std::uint64_t bytes = 0;
  for (const auto* t : *list) bytes += view_of(*t).data.size();
  s += ' ';
  s += key;
  s += "=[" + std::to_string(list->size()) + " tensors, " + std::to_string(bytes) + " bytes]";
}

void body(std::string& s, const wire::Hello* b) {
  add(s, "version", b->protocol_version());
  s += " role=";
  s += core::tier_name(static_cast<core::tier>(b->role()));
  add(s, "node", b->node_id());
  add_text(s, "name", b->name());
  if (b->backends())
    for (const auto* be : *b->backends()) {
      add_text(s, "backend", be->name());
      add_float(s, "gflops", be->gflops());
      add(s, "memory", be->memory_bytes());
    }
  add(s, "memory", b->memory_bytes());
  add_float(s, "gflops", b->gflops());
  add(s, "samples", b->n_samples());
}

void body(std::string& s, const wire::Welcome* b) {
  add(s, "version", b->protocol_version());
  add(s, "node", b->node_id());
  add(s, "run", b->run_id());
  add(s, "epoch", b->plan_epoch());
  add(s, "heartbeat_ms", b->heartbeat_ms());
  s += b->per_device_replicas() ? " per-device-replicas" : "";
}

void body(std::string& s, const wire::Plan* b) {
  add(s, "epoch", b->epoch());
  add(s, "blocks", b->n_blocks());
  s += b->u_shape() ? " u-shape" : "";
  add_text(s, "model", b->model());
  add(s, "micro_batch_size", b->micro_batch_size());
  add(s, "micro_batches", b->n_micro_batches());
  add(s, "run", b->run_id());
  if (b->devices())
    for (const auto* d : *b->devices()) {
      add(s, "device", d->device_id());
      if (!d->stages()) continue;
      for (const auto* st : *d->stages()) {
        s += " [" + std::to_string(st->first_block()) + "," + std::to_string(st->end_block()) + ")@";
        s += core::tier_name(static_cast<core::tier>(st->role()));
        s += std::to_string(st->node_id());
        if (st->with_loss()) s += "+loss";
      }
    }
}

// The key fields of a step message.
template <class Step>
void add_step_key(std::string& s, const Step* b) {
  add(s, "epoch", b->epoch());
  add(s, "step", b->step());
  add(s, "mb", b->micro_batch());
  add(s, "device", b->device_id());
  add(s, "block", b->block());
}

void body(std::string& s, const wire::Activations* b) {
  add_step_key(s, b);
  add_tensor(s, "activation", b->activation());
  add_tensor(s, "labels", b->labels());
}

void body(std::string& s, const wire::Gradients* b) {
  add_step_key(s, b);
  add_tensor(s, "gradient", b->gradient());
  add_float(s, "loss", b->loss());
  add(s, "correct", b->n_correct());
}

void body(std::string& s, const wire::RoundStart* b) {
  add(s, "round", b->round());
  add(s, "epoch", b->epoch());
  add(s, "local_steps", b->local_steps());
  add(s, "deadline_ms", b->deadline_ms());
  add_float(s, "lr", b->learning_rate());
}

void body(std::string& s, const wire::ReplicaUpload* b) {
  add(s, "round", b->round());
  add(s, "node", b->node_id());
  s += " blocks=[" + std::to_string(b->first_block()) + "," + std::to_string(b->end_block()) + ")";
  add(s, "samples", b->n_samples());
  add_tensors(s, "weights", b->weights());
}

void body(std::string& s, const wire::GlobalWeights* b) {
  add(s, "round", b->round());
  s += " blocks=[" + std::to_string(b->first_block()) + "," + std::to_string(b->end_block()) + ")";
  add_tensors(s, "weights", b->weights());
}

void body(std::string& s, const wire::Profile* b) {
  add(s, "node", b->node_id());
  add(s, "epoch", b->epoch());
  add(s, "step", b->step());
  add(s, "memory_budget", b->memory_budget_bytes());
  double compute_us = 0;
  if (b->blocks())
    for (const auto* p : *b->blocks()) compute_us += p->forward_us() + p->backward_us();
  add(s, "blocks", b->blocks() ? b->blocks()->size() : 0);
  add_float(s, "compute_us", static_cast<float>(compute_us));
  if (b->links())
    for (const auto* l : *b->links()) {
      add(s, "peer", l->peer_id());
      add_float(s, "rtt_us", l->rtt_us());
      add_float(s, "bandwidth", l->bandwidth_bytes_per_s());
    }
}

void body(std::string& s, const wire::Migrate* b) {
  add(s, "epoch", b->epoch());
  add(s, "step", b->step());
  s += " blocks=[" + std::to_string(b->first_block()) + "," + std::to_string(b->end_block()) + ")";
  add(s, "device", b->device_id());
  add(s, "from", b->from_node());
  add(s, "to", b->to_node());
  add_tensors(s, "weights", b->weights());
  add_tensors(s, "optimizer_state", b->optimizer_state());
}

void body(std::string& s, const wire::Cutover* b) {
  add(s, "device", b->device_id());
  add(s, "epoch", b->epoch());
  add(s, "step", b->step());
}

void body(std::string& s, const wire::SecAgg* b) {
  s += std::string(" phase=") + wire::EnumNameSecAggPhase(b->phase());
  add(s, "round", b->round());
  add(s, "device", b->device_id());
  if (b->words()) add(s, "words", b->words()->size());
}

void body(std::string& s, const wire::Revocations* b) {
  add(s, "bytes", b->crl() ? b->crl()->size() : 0);
}

void body(std::string& s, const wire::AdminRequest* b) {
  add_text(s, "action", b->action());
  add(s, "job", b->job());
}

void body(std::string& s, const wire::AdminReply* b) {
  add(s, "ok", b->ok() ? 1 : 0);
  add(s, "job", b->job());
  add(s, "bytes", b->data() ? b->data()->size() : 0);
}

void body(std::string& s, const wire::Ping* b) {
  add(s, "seq", b->sequence());
}

void body(std::string& s, const wire::Pong* b) {
  add(s, "seq", b->sequence());
}

void body(std::string& s, const wire::Error* b) {
  add(s, "code", static_cast<std::uint64_t>(b->code()));
  add_text(s, "text", b->message());
}

// One line per message type; the body's fields by name.
template <class T>
bool describe_as(std::string& s, const message& m) {
  const auto* b = m.as<T>();
  if (b) body(s, b);
  return b != nullptr;
}

}  // namespace

std::string describe(const message& m) {
  std::string s(body_name(m.type()));
  (void)(describe_as<wire::Hello>(s, m) || describe_as<wire::Welcome>(s, m) || describe_as<wire::Plan>(s, m) ||
         describe_as<wire::Activations>(s, m) || describe_as<wire::Gradients>(s, m) ||
         describe_as<wire::RoundStart>(s, m) || describe_as<wire::ReplicaUpload>(s, m) ||
         describe_as<wire::GlobalWeights>(s, m) || describe_as<wire::Profile>(s, m) ||
         describe_as<wire::Migrate>(s, m) || describe_as<wire::Cutover>(s, m) || describe_as<wire::Ping>(s, m) ||
         describe_as<wire::Pong>(s, m) || describe_as<wire::Error>(s, m) || describe_as<wire::SecAgg>(s, m) ||
         describe_as<wire::Revocations>(s, m) || describe_as<wire::AdminRequest>(s, m) ||
         describe_as<wire::AdminReply>(s, m));
  return s;
}

void for_each_tensor(const message& m, const std::function<void(std::string_view, const tensor_view&)>& fn) {
  using list = flatbuffers::Vector<flatbuffers::Offset<wire::Tensor>>;
  const auto one = [&](std::string_view what, const wire::Tensor* t) {
    if (t) fn(what, view_of(*t));
  };
  const auto all = [&](std::string_view what, const list* l) {
    if (!l) return;
    for (const auto* t : *l) fn(what, view_of(*t));
  };
  if (const auto* b = m.as<wire::Activations>()) {
    one("activation", b->activation());
    one("labels", b->labels());
  } else if (const auto* b = m.as<wire::Gradients>()) {
    one("gradient", b->gradient());
  } else if (const auto* b = m.as<wire::ReplicaUpload>()) {
    all("weights", b->weights());
  } else if (const auto* b = m.as<wire::GlobalWeights>()) {
    all("weights", b->weights());
  } else if (const auto* b = m.as<wire::Migrate>()) {
    all("weights", b->weights());
    all("optimizer_state", b->optimizer_state());
  }
}

}  // namespace cleave::transport
