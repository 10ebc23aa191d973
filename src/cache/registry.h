// Registry: a process-wide, mutex-guarded map from a key to a shared cache object, so that code
// which is handed only a key (a loaded model, a backend) can bind to the cache the runtime built.
// Only the installer mints keys; an InstallGuard unpublishes its entry when dropped, while holders
// keep their shared ownership. Looking up a key that is not installed is a clear error.
#pragma once

#include "base/status.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace offgraph::cache {

template <class T> class Registry {
public:
  class InstallGuard {
  public:
    InstallGuard() = default;
    InstallGuard(const InstallGuard &) = delete;
    InstallGuard &operator=(const InstallGuard &) = delete;
    InstallGuard(InstallGuard &&o) noexcept : registry_(o.registry_), key_(std::move(o.key_)) {
      o.registry_ = nullptr;
    }
    InstallGuard &operator=(InstallGuard &&o) noexcept {
      if (this != &o) {
        reset();
        registry_ = o.registry_;
        key_ = std::move(o.key_);
        o.registry_ = nullptr;
      }
      return *this;
    }
    ~InstallGuard() { reset(); }

    const std::string &key() const { return key_; }
    // Unpublishes the entry now.
    void reset() {
      if (registry_) registry_->erase(key_);
      registry_ = nullptr;
    }

  private:
    friend class Registry;
    InstallGuard(Registry *r, std::string key) : registry_(r), key_(std::move(key)) {}
    Registry *registry_ = nullptr;
    std::string key_;
  };

  explicit Registry(std::string name) : name_(std::move(name)) {}

  // Publishes `value` under a fresh key that no other install of this process uses.
  Result<InstallGuard> install(std::shared_ptr<T> value) {
    if (!value) return Status::error(name_ + ": refusing to install an empty cache");
    std::lock_guard lock(mutex_);
    std::string key = name_ + "#" + std::to_string(++minted_);
    entries_.emplace(key, std::move(value));
    return InstallGuard(this, std::move(key));
  }

  Result<std::shared_ptr<T>> lookup(const std::string &key) const {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end())
      return Status::error(name_ + ": no cache is installed under key '" + key + "' (" +
                           std::to_string(entries_.size()) + " installed)");
    return it->second;
  }

  size_t size() const {
    std::lock_guard lock(mutex_);
    return entries_.size();
  }

private:
  void erase(const std::string &key) {
    std::lock_guard lock(mutex_);
    entries_.erase(key);
  }

  std::string name_;
  mutable std::mutex mutex_;
  uint64_t minted_ = 0;
  std::map<std::string, std::shared_ptr<T>> entries_;
};

} // namespace offgraph::cache
