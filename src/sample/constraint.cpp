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
  for (const auto &alt : spec->alternatives) {
    if (alt.empty()) return Status::error("constraint: an empty alternative");
    for (int32_t t : alt)
      if (t < 0 || size_t(t) >= texts->bytes.size())
        return Status::error("constraint: token " + std::to_string(t) +
                             " is outside the vocabulary");
  }
  Constraint c(std::move(spec), std::move(texts));
  c.start();
  return c;
}

void Constraint::start() {
  live_.clear();
  for (size_t a = 0; a < spec_->alternatives.size(); ++a) live_.push_back({a, 0});
}

Status Constraint::mask(std::span<float> logits) const {
  if (!active()) return ok_status();
  std::vector<char> allowed(logits.size(), 0);
  for (const Place &p : live_) {
    const int32_t t = spec_->alternatives[p.alt][p.pos];
    if (size_t(t) >= logits.size())
      return Status::error("constraint: token " + std::to_string(t) + " is outside the logits");
    allowed[size_t(t)] = 1;
  }
  for (size_t t = 0; t < logits.size(); ++t)
    if (!allowed[t]) logits[t] = -std::numeric_limits<float>::infinity();
  return ok_status();
}

void Constraint::accept(int32_t token) {
  if (active()) {
    std::vector<Place> moved;
    bool finished = false;
    for (const Place &p : live_) {
      const auto &alt = spec_->alternatives[p.alt];
      if (alt[p.pos] != token) continue;
      if (p.pos + 1 == alt.size())
        finished = true;
      else
        moved.push_back({p.alt, p.pos + 1});
    }
    // Done once one alternative is written out (or, defensively, when none can go on).
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
