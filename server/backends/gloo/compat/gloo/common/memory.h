// Stand-in for Gloo's gloo/common/memory.h, which Debian 12's libgloo-dev
// (0.0~git20220518.5b14351-3) does not install although its installed
// gloo/transport/tcp/{pair,context,unbound_buffer}.h include it. Only
// authenticated_tcp.cc (which extends tcp::Pair) needs those headers, and the
// build puts this directory on its include path only when the real header
// is missing (server/CMakeLists.txt).
//
// ABI: the three holders must have exactly the data members of the
// library's (one std::shared_ptr<T> in NonOwningPtr and
// ShareableNonOwningPtr, one std::weak_ptr<T> in WeakNonOwningPtr), because
// tcp::Pair and tcp::Context embed them and their layout is the library's.
// The member functions keep the library's meaning (a weak reference that is
// upgraded for a short use; the owner waits for such uses before it goes)
// but gradd's code calls none of them: it only needs the class layouts.
#pragma once

#include <memory>
#include <thread>

namespace gloo {

template <typename T>
class WeakNonOwningPtr;
template <typename T>
class ShareableNonOwningPtr;

// A short-lived strong reference taken from a WeakNonOwningPtr.
template <typename T>
class NonOwningPtr final {
 public:
  NonOwningPtr() = default;
  explicit NonOwningPtr(const WeakNonOwningPtr<T>& weak)
      : ptr_(weak.ptr_.lock()) {}
  T* operator->() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  std::shared_ptr<T> ptr_;
};

// A weak reference to an object owned through a ShareableNonOwningPtr.
template <typename T>
class WeakNonOwningPtr final {
 public:
  WeakNonOwningPtr() = default;
  explicit WeakNonOwningPtr(const ShareableNonOwningPtr<T>& owner)
      : ptr_(owner.ptr_) {}

 private:
  std::weak_ptr<T> ptr_;
  friend class NonOwningPtr<T>;
};

// Lends `T*` out as weak references without owning it; on destruction waits
// until no NonOwningPtr taken from those references is left.
template <typename T>
class ShareableNonOwningPtr final {
 public:
  explicit ShareableNonOwningPtr(T* ptr) : ptr_(ptr, [](T*) {}) {}
  ~ShareableNonOwningPtr() {
    std::weak_ptr<T> weak(ptr_);
    ptr_.reset();
    while (!weak.expired()) std::this_thread::yield();
  }
  ShareableNonOwningPtr(const ShareableNonOwningPtr&) = delete;
  ShareableNonOwningPtr& operator=(const ShareableNonOwningPtr&) = delete;

 private:
  std::shared_ptr<T> ptr_;
  friend class WeakNonOwningPtr<T>;
};

}  // namespace gloo
