// A thread's Python frames read as sys._getframe() sees them (code object, offset of the instruction running), and
// SiteResolver.__call__'s walk over them (streamcheck/core/trace.py is the reference): the call-site walk of the
// core's native module (sites.cpp, with the GIL) and of the recorder's torch observer (record/native/observer.cpp,
// without it: the thread stands inside an operator, so its frames stand still).
//
// For Python 3.10 to 3.13. The including file defines Py_BUILD_CORE before including Python.h (3.11's frames are
// internal) and includes this header after it.
#pragma once

#if PY_VERSION_HEX >= 0x030E0000
#error "streamcheck reads the frames of Python 3.10 to 3.13; this Python is newer"
#elif PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_frame.h>
#elif PY_VERSION_HEX < 0x030A0000
#error "streamcheck reads the frames of Python 3.10 to 3.13; this Python is older"
#else
#include <frameobject.h>
#endif

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace streamcheck_frames {

#if PY_VERSION_HEX >= 0x030B0000
using PyFrame = _PyInterpreterFrame;

inline PyFrame* complete(PyFrame* frame) {
  while (frame != nullptr && _PyFrame_IsIncomplete(frame)) frame = frame->previous;
  return frame;
}

inline PyFrame* first_frame(PyThreadState* state) {
#if PY_VERSION_HEX >= 0x030D0000
  return complete(state->current_frame);
#else
  return complete(state->cframe->current_frame);
#endif
}

inline PyFrame* back(PyFrame* frame) {
  return complete(frame->previous);
}

inline PyObject* code_of(PyFrame* frame) {
#if PY_VERSION_HEX >= 0x030D0000
  return reinterpret_cast<PyObject*>(_PyFrame_GetCode(frame));
#else
  return reinterpret_cast<PyObject*>(frame->f_code);
#endif
}

inline int64_t offset_of(PyFrame* frame) {  // frame.f_lasti
  int lasti = _PyInterpreterFrame_LASTI(frame);
  return lasti < 0 ? -1 : static_cast<int64_t>(lasti) * static_cast<int64_t>(sizeof(_Py_CODEUNIT));
}
#else
using PyFrame = PyFrameObject;

inline PyFrame* first_frame(PyThreadState* state) {
  return state->frame;
}

inline PyFrame* back(PyFrame* frame) {
  return frame->f_back;
}

inline PyObject* code_of(PyFrame* frame) {
  return reinterpret_cast<PyObject*>(frame->f_code);
}

inline int64_t offset_of(PyFrame* frame) {
  return frame->f_lasti < 0 ? -1 : static_cast<int64_t>(frame->f_lasti) * static_cast<int64_t>(sizeof(_Py_CODEUNIT));
}
#endif

// What a frame is to the walk (SiteResolver.code_kind's answer).
enum CodeKind : uint8_t { kMachinery = 0, kLibrary = 1, kUser = 2, kForwards = 3 };

// SiteResolver.__call__'s walk from `frame` outwards, at most `limit` frames: streamcheck's frames and the
// libraries' forwarding wrappers skipped, the libraries' frames kept up to the user's, then the user's callers while
// they are the user's, at most `user_depth` frames in all from the user's. Appends (code, offset) of each kept frame
// to `key`, innermost first, and then the index of the user's frame among them (-1: none), which it returns.
// `kind_of(code)` classifies a code object.
template <class KindOf>
int walk_frames(PyFrame* frame, int limit, int user_depth, KindOf&& kind_of, std::vector<uint64_t>& key) {
  int user = -1;
  for (int i = 0; i < limit && frame != nullptr; ++i) {
    PyObject* code = code_of(frame);
    uint8_t kind = kind_of(code);
    if (kind != kMachinery && kind != kForwards) {
      key.push_back(reinterpret_cast<uint64_t>(code));
      key.push_back(static_cast<uint64_t>(offset_of(frame)));
      if (kind == kUser) {
        user = static_cast<int>(key.size() / 2) - 1;
        break;
      }
    }
    frame = back(frame);
  }
  if (user >= 0) {
    frame = back(frame);
    for (int i = 0; i < user_depth - 1 && frame != nullptr;) {
      PyObject* code = code_of(frame);
      uint8_t kind = kind_of(code);
      if (kind == kForwards) {  // torch.compile's wrapper: its caller is the user's
        frame = back(frame);
        continue;
      }
      if (kind != kUser) break;
      key.push_back(reinterpret_cast<uint64_t>(code));
      key.push_back(static_cast<uint64_t>(offset_of(frame)));
      frame = back(frame);
      ++i;
    }
  }
  key.push_back(static_cast<uint64_t>(static_cast<int64_t>(user)));
  return user;
}

// The walked call paths, each interned as a stack id (1, 2, ...; 0 stands for no frame kept). Not locked: the
// GIL (sites.cpp) or the caller's mutex (observer.cpp) guards it.
class StackTable {
 public:
  uint32_t intern(std::vector<uint64_t>&& key) {
    auto found = ids_.find(key);
    if (found != ids_.end()) return found->second;
    keys_.push_back(key);
    auto id = static_cast<uint32_t>(keys_.size());
    ids_.emplace(std::move(key), id);
    return id;
  }

  const std::vector<uint64_t>* key(uint32_t id) const {
    return id == 0 || id > keys_.size() ? nullptr : &keys_[id - 1];
  }

  void clear() {
    ids_.clear();
    keys_.clear();
  }

 private:
  struct Hash {
    size_t operator()(const std::vector<uint64_t>& v) const noexcept {
      uint64_t h = 1469598103934665603ULL;  // FNV-1a over the words
      for (uint64_t x : v) h = (h ^ x) * 1099511628211ULL;
      return static_cast<size_t>(h);
    }
  };
  std::unordered_map<std::vector<uint64_t>, uint32_t, Hash> ids_;
  std::vector<std::vector<uint64_t>> keys_;  // id - 1 -> walk_frames' key
};

// A stack as Python reads it: (((code, offset), ...) innermost first, the user's frame's index (-1: none)), from a
// walk_frames key whose code objects the caller keeps alive. A new reference, or nullptr with an error set.
inline PyObject* stack_tuple(const std::vector<uint64_t>& key) {
  size_t n = (key.size() - 1) / 2;
  PyObject* frames = PyTuple_New(static_cast<Py_ssize_t>(n));
  if (frames == nullptr) return nullptr;
  for (size_t i = 0; i < n; ++i) {
    PyObject* pair = Py_BuildValue("(OL)", reinterpret_cast<PyObject*>(key[2 * i]),
                                   static_cast<long long>(static_cast<int64_t>(key[2 * i + 1])));
    if (pair == nullptr) {
      Py_DECREF(frames);
      return nullptr;
    }
    PyTuple_SET_ITEM(frames, static_cast<Py_ssize_t>(i), pair);
  }
  return Py_BuildValue("(NL)", frames, static_cast<long long>(static_cast<int64_t>(key.back())));
}

// Append the frames of `state` to the list `out` as this header reads them, innermost first, (code, offset) each:
// what streamcheck.core.trace.reads_frames compares with sys._getframe(). 0, or -1 with an error set.
inline int append_frames(PyThreadState* state, PyObject* out) {
  for (PyFrame* frame = first_frame(state); frame != nullptr; frame = back(frame)) {
    PyObject* item = Py_BuildValue("(OL)", code_of(frame), static_cast<long long>(offset_of(frame)));
    if (item == nullptr || PyList_Append(out, item) != 0) {
      Py_XDECREF(item);
      return -1;
    }
    Py_DECREF(item);
  }
  return 0;
}

}  // namespace streamcheck_frames
