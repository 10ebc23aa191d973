#include "sample/constraint.h"

#include <limits>

namespace offgraph::sample {

Constraint::Constraint(std::shared_ptr<const ConstraintSpec> spec,
                       std::shared_ptr<const TokenTexts> texts)
    : spec_(std::move(spec)), texts_(std::move(texts)) {}

Result<Constraint> Constraint::create(std::shared_ptr<const ConstraintSpec> spec,
                                      std::shared_ptr<const TokenTexts> texts) {
  if (!spec || !texts) return Status::error("constraint: no specification or vocabulary");
  if (spec->alternatives.empty()) return Status::error("constraint: no alternatives");
  if (texts->bytes.size() != texts->control.size())
    return Status::error("constraint: token texts and control flags differ in length");
  for (const Alternative &alt : spec->alternatives) {
    if (alt.empty()) return Status::error("constraint: an empty alternative");
    for (const Segment &s : alt) {
      if (s.control >= 0 &&
          (size_t(s.control) >= texts->control.size() || !texts->control[size_t(s.control)]))
        return Status::error("constraint: token " + std::to_string(s.control) +
                             " is not a control token of this vocabulary");
      if (s.control < 0 && s.text.empty())
        return Status::error("constraint: an empty text segment");
    }
  }
  Constraint c(std::move(spec), std::move(texts));
  c.start();
  return c;
}

void Constraint::start() {
  live_.clear();
  for (size_t a = 0; a < spec_->alternatives.size(); ++a) live_.push_back({a, 0, 0});
}

bool Constraint::at_end(const Place &p) const { return p.seg == spec_->alternatives[p.alt].size(); }

bool Constraint::step(const Place &p, int32_t token, Place &out) const {
  const Alternative &alt = spec_->alternatives[p.alt];
  if (at_end(p) || token < 0 || size_t(token) >= texts_->bytes.size()) return false;
  const Segment &seg = alt[p.seg];
  if (texts_->control[size_t(token)]) {
    if (seg.control != token) return false;
    out = {p.alt, p.seg + 1, 0};
    return true;
  }
  // Ordinary text stays inside one text segment: it may finish it, never run past it.
  const std::string &b = texts_->bytes[size_t(token)];
  if (seg.control >= 0 || b.empty() || b.size() > seg.text.size() - p.off ||
      seg.text.compare(p.off, b.size(), b) != 0)
    return false;
  out = p;
  out.off += b.size();
  if (out.off == seg.text.size()) ++out.seg, out.off = 0;
  return true;
}

Status Constraint::mask(std::span<float> logits) const {
  if (!active()) return ok_status();
  bool any = false;
  Place next;
  for (size_t t = 0; t < logits.size(); ++t) {
    bool allowed = false;
    for (const Place &p : live_)
      if (step(p, int32_t(t), next)) {
        allowed = true;
        break;
      }
    if (allowed)
      any = true;
    else
      logits[t] = -std::numeric_limits<float>::infinity();
  }
  if (!any) return Status::error("constraint: no token of the vocabulary continues the output");
  return ok_status();
}

void Constraint::accept(int32_t token) {
  if (active()) {
    std::vector<Place> moved;
    Place next;
    bool finished = false;
    for (const Place &p : live_)
      if (step(p, token, next)) {
        if (at_end(next)) finished = true;
        moved.push_back(next);
      }
    // Done once one alternative is spelled out (or, defensively, when none can go on).
    live_ = finished ? std::vector<Place>{} : std::move(moved);
    tail_.clear();
    return;
  }
  if (spec_->trigger.empty() || token < 0 || size_t(token) >= texts_->bytes.size()) return;
  tail_ += texts_->bytes[size_t(token)];
  const size_t keep = spec_->trigger.size();
  if (tail_.size() > 4 * keep + 64) tail_.erase(0, tail_.size() - keep);
  if (tail_.size() >= keep && tail_.compare(tail_.size() - keep, keep, spec_->trigger) == 0) {
    tail_.clear();
    start();
  }
}

} // namespace offgraph::sample
