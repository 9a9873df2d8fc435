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

}  // namespace streamcheck_frames
