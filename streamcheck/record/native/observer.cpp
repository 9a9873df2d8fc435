// streamcheck's operator observer: torch's operators seen from the dispatcher's RecordFunction callbacks
// (C++, no Python frame per operator), written as compact records into a buffer that the recorder drains
// (streamcheck/record/native/__init__.py; the records become trace records in record/adapters/torch_ops.py).
//
// Which operators: those a TorchDispatchMode would see (the recorder's Python path is the reference). The
// dispatcher calls RecordFunction for every operator it is asked for, composites and the operators kernels
// call inside themselves too; a dispatch mode sees each call at the Python key, below autograd and autocast,
// and nothing that runs inside it. So, per thread, a stack of open operators:
// - an operator whose kernel is CompositeImplicitAutograd for the observed backend (a "math" kernel: linear,
//   matmul, reshape, to) is transparent: the operators it calls are the ones recorded (the mode's view with
//   autograd on; with it off, torch_ops' mode decomposes such an operator itself, so both paths agree);
// - so is an operator with an autocast kernel while autocast is on (it casts, then calls the operator again);
// - any other operator is recorded once, and what runs inside it is not;
// - views (every return aliases an input, none is written) touch no memory: nothing is recorded.
// What an operator reads and writes comes from its schema's alias annotations (`Tensor(a!)`: written), as
// torch_ops.operator_accesses says; Python describes each operator once (describe_op), so the rules have one
// home.
//
// Special operators (copies that touch host memory, pinned host memory, `.item()`, operators that hand the host
// a value, record_stream, custom operators) keep their inputs and outputs, and at the operator's end the
// observer calls Python, which drains the buffer and replays them through torch_ops' own rules (their values
// reach Python through the `streamcheck_native::special_values` operator, converted by torch itself).
//
// Call sites: each record carries a stack id, the frames from the innermost one to the user's (and the user's
// callers) that the recorder's SiteResolver would keep, interned: read from the thread's Python frame stack
// without the GIL (torch's bindings release it around an operator; the thread stands inside the operator, so its
// frames stand still), each code object classified once by Python (the resolver's rule). Files and lines are
// resolved only for what a report names.
//
// torch's GPU-trace callbacks of events and of the caching allocator's blocks become records of the same buffer
// while the observer records (trace_hook), so they keep their place among the operators.
//
// Locks: the buffer and the tables have their own mutexes, never held while the GIL is taken.
#define Py_BUILD_CORE 1
#include <Python.h>

#include "../../core/native/frames.h"  // the frames and SiteResolver's walk over them, shared with the core's

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

// How many records wait in the buffer (set under records_mutex), read by Python without a call (ctypes' in_dll):
// the recorder flushes before everything it records, and a flush with nothing to take costs no more than the read.
extern "C" {
std::atomic<uint64_t> streamcheck_native_waiting{0};
}

namespace {

// --- what Python says of an operator (torch_ops.native_description), once per operator -------------------
enum OpFlag : uint32_t {
  kView = 1,          // every return aliases an input, none is written: no access
  kMath = 2,          // CompositeImplicitAutograd kernel on the observed backend: transparent
  kAutocast = 4,      // has an autocast kernel for the observed device: transparent while autocast is on
  kNoAccess = 8,      // allocates without touching the bytes: its tensors are registered only
  kLayoutOnly = 16,   // reads only the shape of its unwritten arguments
  kCopy = 32,         // a copy: special when a host tensor takes part
  kSpecial = 64,      // always handled by torch_ops' Python rules
  kReading = 128,     // the host may wait for the device inside it (torch's sync callback is its own)
  kHostOutput = 256,  // may return pinned host memory: always, or when its pin_memory argument is true
  kIgnored = 512,     // not the program's (streamcheck's own, the profiler's)
  kCustom = 1024,     // a custom operator: its implementation is one call of the program's (torch_ops' inside())
};

struct OpInfo {
  uint32_t index = 0;
  uint32_t flags = kIgnored;
  std::vector<uint8_t> written;  // per schema argument
  int device_arg = -1;           // index of the argument named `device`
  int pin_arg = -1;              // index of the argument named `pin_memory`
};

// Roles of a tensor in a record (torch_ops' reads, writes and fresh outputs).
enum Role : uint8_t { kRead = 0, kWritten = 1, kFresh = 2 };

struct Access {
  uint64_t lo, hi;  // the bytes it spans (lo == hi: empty)
  uint64_t base, nbytes;  // its storage, for the recorder's allocation table
  int16_t device;
  uint8_t role;
};

enum RecordFlag : uint32_t {
  kStreamBefore = 1,  // the stream was known before the operator ran (an argument's device, or device=)
  kHasStream = 2,
  kSpecialRecord = 4,
  kTraceRecord = 8,  // a GPU-trace callback of torch's, deferred: op is its kind, stream its stream, slot its event
                     // or block (kHasStream: the stream is the observed device's current one, not one torch passed)
};

// The GPU-trace callbacks trace_hook takes (torch_runtime.TRACE_CALLBACKS's order).
enum TraceKind : uint32_t {
  kEventCreated = 0,
  kEventDeleted = 1,
  kEventRecorded = 2,
  kEventWaited = 3,
  kMemoryAllocated = 4,
  kMemoryDeallocated = 5,
};

struct Record {
  uint32_t op, stack, flags, first, count;
  int16_t device;
  uint64_t thread, stream;
  int64_t slot;  // special: its values in `specials`
};

struct Special {
  std::vector<c10::IValue> inputs, outputs;
};

// --- configuration (set by enable, under the GIL) ----------------------------------------------------------
std::atomic<bool> enabled{false};
c10::DeviceType observed = c10::DeviceType::CUDA;
c10::DispatchKey autocast_key = c10::DispatchKey::AutocastCUDA;
bool native_streams = false;  // the observed device's guard gives streams' native handles (cudaStream_t)
PyObject* describe_op = nullptr;  // (qualified name, overload) -> (index, flags, written, device_arg, pin_arg) or None
PyObject* classify_code = nullptr;  // code -> 0 machinery, 1 library, 2 user, 3 a library's forwarding wrapper
PyObject* special_begin = nullptr;  // (reading, custom) -> None: a special operator that may wait, or a custom one
PyObject* special_end = nullptr;  // (ok, custom) -> None: a special operator ended (drain now), or failed
int user_depth = 8;  // SiteSettings.depth: the user's frame and its callers kept

constexpr int kWalkLimit = 64;  // SiteResolver's depth_limit
using namespace streamcheck_frames;

std::mutex ops_mutex;
std::unordered_map<const char*, OpInfo*> ops;  // keyed by the schema's name string (lives with the operator)
std::vector<OpInfo*> retired;  // earlier recordings' descriptions: a callback running now may still read one

std::mutex records_mutex;
std::vector<Record> records;
std::vector<Access> accesses;
std::unordered_map<int64_t, Special> specials;
int64_t next_slot = 0;

std::mutex pinned_mutex;
std::unordered_map<const void*, bool> pinned;  // storage address -> pinned host memory (is_pinned is a driver query)

std::mutex stacks_mutex;
std::unordered_map<PyObject*, uint8_t> code_kinds;  // holds a reference to each code: its address stays its own
StackTable stacks;

// --- per thread ---------------------------------------------------------------------------------------------
enum FrameKind : uint8_t { kTransparent, kOpaque, kKernel };

struct Frame {
  FrameKind kind = kOpaque;
  OpInfo* op = nullptr;
  std::vector<std::pair<at::Tensor, uint8_t>> tensors;  // the arguments it accesses, with their roles
  std::vector<c10::IValue> inputs;  // kept where it may be special
  bool keep_inputs = false;
  bool special = false;
  bool began = false;  // special_begin was called
  bool custom = false;  // ... for a custom operator
  bool relevant = false;  // a tensor on the device, pinned host memory, or device= names the device
  int16_t device = -1;
  uint64_t stream = 0;
  uint32_t stack = 0;
  int exceptions = 0;
};

struct ThreadState {
  std::vector<Frame> frames;
  size_t depth = 0;
  int paused = 0;  // streamcheck's own work on this thread (recorder.inside, gpu.suppressed)
  at::CallbackHandle handle = 0;
};
thread_local ThreadState thread_state;

bool python_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Python, called from a callback: the GIL taken (this thread may hold it already), and this thread's operators
// paused meanwhile (what Python runs is streamcheck's, never the program's).
struct InPython {
  PyGILState_STATE gil;
  InPython() : gil(PyGILState_Ensure()) {
    ++thread_state.paused;
  }
  ~InPython() {
    if (PyErr_Occurred()) PyErr_Clear();  // the recorder's functions report their own errors
    --thread_state.paused;
    PyGILState_Release(gil);
  }
};

void call_python(PyObject* function, bool first, bool second) {
  if (function == nullptr || !python_usable()) return;
  InPython in_python;
  PyObject* result = PyObject_CallFunctionObjArgs(function, first ? Py_True : Py_False, second ? Py_True : Py_False,
                                                  nullptr);
  Py_XDECREF(result);
}

// The kind of `code`, asking Python (under the GIL) the first time. Called without stacks_mutex held.
uint8_t code_kind(PyObject* code) {
  {
    std::lock_guard<std::mutex> lock(stacks_mutex);
    auto found = code_kinds.find(code);
    if (found != code_kinds.end()) return found->second;
  }
  uint8_t kind = kLibrary;
  if (!python_usable()) return kind;
  InPython in_python;
  PyObject* result = classify_code != nullptr ? PyObject_CallOneArg(classify_code, code) : nullptr;
  if (result != nullptr) {
    kind = static_cast<uint8_t>(PyLong_AsLong(result));
    Py_DECREF(result);
  }
  std::lock_guard<std::mutex> lock(stacks_mutex);
  if (code_kinds.emplace(code, kind).second) Py_INCREF(code);
  return kind;
}

// The stack id of this thread's frames by SiteResolver.__call__'s walk (frames.h); 0: no frame kept.
uint32_t stack_id() {
  PyThreadState* state = PyGILState_GetThisThreadState();
  if (state == nullptr) return 0;  // a thread Python never ran on (the autograd engine's): no site
  std::vector<uint64_t> key;
  key.reserve(24);
  walk_frames(first_frame(state), kWalkLimit, user_depth, code_kind, key);
  if (key.size() == 1) return 0;  // only the user's index: no frame kept
  std::lock_guard<std::mutex> lock(stacks_mutex);
  return stacks.intern(std::move(key));
}

// --- operators --------------------------------------------------------------------------------------------------
OpInfo* describe(const at::RecordFunction& fn) {
  const char* key = fn.name();
  {
    std::lock_guard<std::mutex> lock(ops_mutex);
    auto found = ops.find(key);
    if (found != ops.end()) return found->second;
  }
  // A RecordFunction named by a string (no schema) is nobody's operator but a named region of the program's
  // (torch.compile's "Torch-Compiled Region" and "## Call CompiledFxGraph ##" around the compiled code's
  // operators): transparent, as a composite is, so the operators inside are recorded as a dispatch mode sees
  // them. Its name's address is not stable: not kept.
  static OpInfo region = [] {
    OpInfo info;
    info.flags = kMath;
    return info;
  }();
  static OpInfo ignored;
  auto name = fn.operator_name();
  if (!name) return &region;
  auto handle = c10::Dispatcher::singleton().findOp(*name);
  if (!handle || !handle->hasSchema() || handle->schema().name().c_str() != key) return &ignored;
  auto* info = new OpInfo();
  if (python_usable() && describe_op != nullptr) {
    InPython in_python;
    PyObject* result = PyObject_CallFunction(describe_op, "ss", name->name.c_str(), name->overload_name.c_str());
    if (result != nullptr && result != Py_None) {
      PyObject* written = nullptr;
      unsigned int index = 0, flags = kIgnored;
      int device_arg = -1, pin_arg = -1;
      if (PyArg_ParseTuple(result, "IIOii", &index, &flags, &written, &device_arg, &pin_arg)) {
        info->index = index;
        info->flags = flags;
        info->device_arg = device_arg;
        info->pin_arg = pin_arg;
        Py_ssize_t n = PySequence_Size(written);
        for (Py_ssize_t i = 0; i < n; ++i) {
          PyObject* item = PySequence_GetItem(written, i);
          info->written.push_back(item != nullptr && PyObject_IsTrue(item) == 1);
          Py_XDECREF(item);
        }
      }
    }
    Py_XDECREF(result);
  }
  std::lock_guard<std::mutex> lock(ops_mutex);
  auto placed = ops.emplace(key, info);
  if (!placed.second) {  // another thread described it meanwhile
    delete info;
    return placed.first->second;
  }
  return info;
}

bool is_pinned(const at::Tensor& t) {
  if (t.device().type() != c10::DeviceType::CPU || observed == c10::DeviceType::CPU || t.numel() == 0 ||
      !t.has_storage()) {
    return false;
  }
  const void* ptr = t.storage().data();
  std::lock_guard<std::mutex> lock(pinned_mutex);
  auto found = pinned.find(ptr);
  if (found != pinned.end()) return found->second;
  bool answer = at::globalContext().isPinnedPtr(ptr);
  pinned.emplace(ptr, answer);
  return answer;
}

// A tensor of the observed device whose bytes are there: not a fake tensor of torch.compile's tracing (its device
// says cuda, its storage is meta; a dispatch mode is off while Dynamo traces), nor a wrapper without storage.
bool on_device(const at::Tensor& t) {
  return t.device().type() == observed && t.has_storage() && t.storage().device_type() == observed;
}

// A host tensor whose bytes are on the host (fake and meta tensors are not).
bool on_host(const at::Tensor& t) {
  return t.device().type() == c10::DeviceType::CPU && t.has_storage() &&
         t.storage().device_type() == c10::DeviceType::CPU;
}

template <typename F>
void each_tensor(const c10::IValue& value, F&& f) {
  if (value.isTensor()) {
    f(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) f(t);
  } else if (value.isList()) {  // Tensor?[] (index): a generic list
    for (const c10::IValue& item : value.toListRef()) {
      if (item.isTensor()) f(item.toTensor());
    }
  }
}

// The current stream of `device` of the observed type: its native handle (cudaStream_t) where the guard has one,
// else its id (a device type without streams: CPU, for tests).
uint64_t current_stream(int16_t device) {
  auto* guard = c10::impl::getDeviceGuardImpl(observed);
  c10::Device where(observed, device < 0 ? guard->getDevice().index() : static_cast<c10::DeviceIndex>(device));
  c10::Stream stream = guard->getStream(where);
  if (native_streams) return reinterpret_cast<uint64_t>(guard->getStreamNativeHandle(stream));
  return static_cast<uint64_t>(stream.id());
}

void add_access(std::vector<Access>& out, const at::Tensor& t, uint8_t role) {
  Access a{0, 0, 0, 0, static_cast<int16_t>(t.device().index()), role};
  if (t.has_storage()) {
    const auto& storage = t.storage();
    a.base = reinterpret_cast<uint64_t>(storage.data());
    a.nbytes = storage.nbytes();
  }
  // cuda_device._span: the bytes a strided tensor spans; none if it is empty.
  bool empty = false;
  int64_t size = static_cast<int64_t>(t.element_size()), lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    int64_t n = t.sizes()[d], stride = t.strides()[d] * size;
    if (n == 0) empty = true;
    if (n > 1) (stride >= 0 ? hi : lo) += (n - 1) * stride;
  }
  if (!empty && a.base != 0) {
    auto ptr = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
    a.lo = static_cast<uint64_t>(ptr + lo);
    a.hi = static_cast<uint64_t>(ptr + hi + size);
  }
  out.push_back(a);
}

Frame& push(ThreadState& ts, FrameKind kind) {
  if (ts.depth == ts.frames.size()) ts.frames.emplace_back();
  Frame& f = ts.frames[ts.depth++];
  f.kind = kind;
  return f;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadState& ts = thread_state;
  bool inside = ts.depth > 0 && ts.frames[ts.depth - 1].kind != kTransparent;
  // Operators torch runs with the Python key excluded (torch.tensor()'s own copy of its data) are hidden
  // from dispatch modes: from this observer too, so that both paths record the same operators.
  if (inside || ts.paused > 0 || !enabled.load(std::memory_order_relaxed) ||
      c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python)) {
    push(ts, kOpaque);
    return nullptr;
  }
  OpInfo* op = nullptr;
  try {
    op = describe(fn);
  } catch (...) {
    push(ts, kOpaque);
    return nullptr;
  }
  uint32_t flags = op->flags;
  if (flags & kIgnored) {
    push(ts, kOpaque);
    return nullptr;
  }
  if ((flags & kMath) || ((flags & kAutocast) && c10::impl::tls_is_dispatch_key_included(autocast_key) &&
                          !c10::impl::tls_is_dispatch_key_excluded(autocast_key))) {
    push(ts, kTransparent);
    return nullptr;
  }
  if (flags & kView) {  // no kernel: a view is bytes of its base, seen when it is used
    push(ts, kOpaque);
    return nullptr;
  }
  // The call site first: classifying a new code object calls Python, whose own operators push frames of
  // their own (which may move this thread's frames; none of them is held across it).
  uint32_t stack = 0;
  try {
    stack = stack_id();
  } catch (...) {
  }
  Frame& f = push(ts, kKernel);
  f.op = op;
  f.tensors.clear();
  f.inputs.clear();
  f.special = (flags & kSpecial) != 0;
  f.began = false;
  f.relevant = false;
  f.device = -1;
  f.stream = 0;
  f.stack = stack;
  f.exceptions = std::uncaught_exceptions();
  bool host = false;  // a host tensor takes part (pageable or pinned)
  try {
    auto inputs = fn.inputs();
    bool layout_only = (flags & kLayoutOnly) != 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      uint8_t role = i < op->written.size() && op->written[i] ? kWritten : kRead;
      if (layout_only && role == kRead) continue;
      each_tensor(inputs[i], [&](const at::Tensor& t) {
        // A Python number the binding wrapped (x + 1): no memory of the program's (a dispatch mode
        // gets it back as the number).
        if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
        if (on_device(t)) {
          f.tensors.emplace_back(t, role);
        } else if (on_host(t)) {
          host = true;
          if (is_pinned(t)) f.special = f.relevant = true;
        }
      });
    }
    if ((flags & kCopy) && op->device_arg >= 0 && static_cast<size_t>(op->device_arg) < inputs.size()) {
      const c10::IValue& d = inputs[op->device_arg];
      if (d.isDevice() && d.toDevice().type() == c10::DeviceType::CPU) host = true;  // .cpu(), .to("cpu")
    }
    if ((flags & kCopy) && host && observed != c10::DeviceType::CPU) f.special = true;
    bool host_output = false;
    if ((flags & kHostOutput) && observed != c10::DeviceType::CPU) {
      int pin = op->pin_arg;
      host_output = pin < 0 || (static_cast<size_t>(pin) < inputs.size() && inputs[pin].isBool() &&
                                inputs[pin].toBool());
    }
    f.keep_inputs = f.special || (flags & kCopy) || host_output;
    if (f.keep_inputs) f.inputs.assign(inputs.begin(), inputs.end());
    // Where it runs: its first argument on the device (reads first), else the device its `device=` names.
    for (int pass = 0; pass < 2 && f.device < 0; ++pass) {
      for (auto& [t, role] : f.tensors) {
        if ((role == kRead) == (pass == 0)) {
          f.device = t.device().index();
          break;
        }
      }
    }
    bool known = f.device >= 0;
    if (!known && op->device_arg >= 0 && static_cast<size_t>(op->device_arg) < inputs.size()) {
      const c10::IValue& d = inputs[op->device_arg];
      if (d.isDevice() && d.toDevice().type() == observed) {
        known = true;
        f.device = d.toDevice().index();  // -1: the current device
      }
    }
    if (known && !(flags & kNoAccess)) f.stream = current_stream(f.device);
    if (!known) f.device = -2;  // decided by its first fresh output
    f.relevant = f.relevant || known;
  } catch (...) {
    f.kind = kOpaque;  // never break the program: this operator goes unrecorded
    return nullptr;
  }
  bool reading = f.special && f.relevant && (flags & kReading);
  // A custom operator runs as one call of the program's, as on the Python path: the adapters stay quiet inside
  // it, and its implementation may declare the work they cannot see (streamcheck.declare_access).
  bool custom = (flags & kCustom) != 0;
  if (reading || custom) {
    f.began = true;
    f.custom = custom;
    call_python(special_begin, reading, custom);  // (f is not used after this call)
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  ThreadState& ts = thread_state;
  if (ts.depth == 0) return;  // enabled while this operator was already open
  Frame& f = ts.frames[--ts.depth];
  if (f.kind != kKernel) return;
  bool failed = std::uncaught_exceptions() > f.exceptions;
  uint32_t flags = f.op->flags;
  std::vector<Access> mine;
  Special values;
  bool special = f.special;
  try {
    if (!failed) {
      mine.reserve(f.tensors.size() + 2);
      for (auto& [t, role] : f.tensors) add_access(mine, t, role);
      // Fresh outputs: the returned tensors on the device that are not a written argument (in-place and out=
      // operators return those); of several returns, only the direct tensors (torch_ops._tensors).
      const auto& outputs = fn.outputs();
      auto fresh = [&](const at::Tensor& t) {
        if (!t.defined()) return;
        if (on_device(t)) {
          for (auto& [w, role] : f.tensors) {
            if (role == kWritten && w.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return;
          }
          add_access(mine, t, kFresh);
        } else if (on_host(t) && observed != c10::DeviceType::CPU && f.keep_inputs) {
          bool host_pinned = is_pinned(t);
          if ((flags & kCopy) || host_pinned) special = true;  // .cpu() returns host memory; pin_memory= pinned
          if (host_pinned) f.relevant = true;
        }
      };
      if (outputs.size() == 1) {
        each_tensor(outputs[0], fresh);
      } else {
        for (const c10::IValue& out : outputs) {
          if (out.isTensor()) fresh(out.toTensor());
        }
      }
      if (special) {
        values.inputs = std::move(f.inputs);
        values.outputs.assign(outputs.begin(), outputs.end());
      }
    }
  } catch (...) {
    failed = true;
  }
  f.tensors.clear();
  f.inputs.clear();
  if (failed) {  // the operator's own error reaches the program; nothing is recorded
    if (f.began) call_python(special_end, false, f.custom);
    return;
  }
  // Nothing on the device (and, for a special operator, no pinned memory, no device named): not the recorder's.
  if (mine.empty() && !(special && f.relevant)) {
    if (f.began) call_python(special_end, false, f.custom);
    return;
  }
  Record r{f.op->index, f.stack, 0, 0, 0, f.device, static_cast<uint64_t>(pthread_self()), f.stream, -1};
  if (f.device != -2) {
    if (!(flags & kNoAccess)) r.flags |= kStreamBefore | kHasStream;
  } else if (!(flags & kNoAccess)) {  // a factory: its first fresh output says where it ran
    r.device = -1;
    for (const Access& a : mine) {
      if (a.role == kFresh) {
        r.device = a.device;
        break;
      }
    }
    try {
      r.stream = current_stream(r.device);
      r.flags |= kHasStream;
    } catch (...) {
    }
  }
  if (special) r.flags |= kSpecialRecord;
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    r.first = static_cast<uint32_t>(accesses.size());
    r.count = static_cast<uint32_t>(mine.size());
    accesses.insert(accesses.end(), mine.begin(), mine.end());
    if (special) {
      r.slot = next_slot++;
      specials.emplace(r.slot, std::move(values));
    }
    records.push_back(r);
    streamcheck_native_waiting.store(records.size(), std::memory_order_relaxed);
  }
  if (special) call_python(special_end, true, f.began && f.custom);  // drained now: the records stay in issue order
}

// The special operator's values, for Python (torch converts them): its inputs and its outputs.
std::tuple<std::vector<c10::IValue>, std::vector<c10::IValue>> special_values(int64_t slot) {
  std::lock_guard<std::mutex> lock(records_mutex);
  auto found = specials.find(slot);
  TORCH_CHECK(found != specials.end(), "streamcheck: no special operator ", slot, " is pending");
  auto result = std::make_tuple(std::move(found->second.inputs), std::move(found->second.outputs));
  specials.erase(found);
  return result;
}

// --- the drain ------------------------------------------------------------------------------------------------
void take_pending(std::vector<Record>& taken, std::vector<Access>& taken_accesses) {
  std::lock_guard<std::mutex> lock(records_mutex);
  taken.swap(records);
  taken_accesses.swap(accesses);
  streamcheck_native_waiting.store(0, std::memory_order_relaxed);
}

// A record as the tuple streamcheck_native_take documents.
PyObject* record_tuple(const Record& r, const Access* accesses_of) {
  PyObject* items = PyTuple_New(r.count);
  if (items == nullptr) return nullptr;
  for (uint32_t i = 0; i < r.count; ++i) {
    const Access& a = accesses_of[i];
    PyObject* item = Py_BuildValue("(KKKKhB)", (unsigned long long)a.lo, (unsigned long long)a.hi,
                                   (unsigned long long)a.base, (unsigned long long)a.nbytes, a.device, a.role);
    if (item == nullptr) {
      Py_DECREF(items);
      return nullptr;
    }
    PyTuple_SET_ITEM(items, i, item);
  }
  return Py_BuildValue("(IkKhIILN)", r.op, (unsigned long)r.thread, (unsigned long long)r.stream, r.device, r.stack,
                       r.flags, (long long)r.slot, items);
}

// What the recorder lends the drain (torch_native.NativeRecording._lane), borrowed for one drain: its tables as
// they are (the recorder's lock is held), and the Python functions for what they do not answer.
struct Lane {
  PyObject *pool_at, *streams, *threads, *sites, *names, *op_flags, *launch_type, *ops, *feed, *slow, *site_of,
      *range_in, *register_storage, *fed_badly, *stream_pointer, *event_handles, *event_record_type,
      *stream_wait_type, *name_event_handle, *event_create_type;
  uint32_t no_access;
  // torch_runtime's allocator state (TorchState), and the recorder's allocation table (Recorder.file and
  // Recorder.unfile's lists, made here: the recorder, its sorted starts and allocations, its freed blocks' starts
  // and (start, stop, buffer id, buffer start), the buffers graphs hold, its _Alloc and Range types,
  // torch_ops.TORCH_BLOCK).
  PyObject *pending, *pool_blocks, *pool_threads, *free_type, *strict, *alloc_type;
  PyObject *recorder, *starts, *allocs, *freed_starts, *freed, *graph_held, *alloc_class, *range_type, *block_what;
  int capturing;

  bool unpack(PyObject* lane) {
    unsigned long flag = 0;
    PyObject* memory = nullptr;
    if (!PyArg_ParseTuple(lane, "O!O!O!O!O!O!OO!OOOOOOOkO!OOOOO!", &PyDict_Type, &pool_at, &PyDict_Type, &streams,
                          &PyDict_Type, &threads, &PyDict_Type, &sites, &PyList_Type, &names, &PyList_Type, &op_flags,
                          &launch_type, &PyList_Type, &ops, &feed, &slow, &site_of, &range_in, &register_storage,
                          &fed_badly, &stream_pointer, &flag, &PyDict_Type, &event_handles, &event_record_type,
                          &stream_wait_type, &name_event_handle, &event_create_type, &PyTuple_Type, &memory))
      return false;
    no_access = static_cast<uint32_t>(flag);
    return PyArg_ParseTuple(memory, "O!O!O!pOOOOO!O!O!O!O!OOU", &PyDict_Type, &pending, &PySet_Type, &pool_blocks,
                            &PyDict_Type, &pool_threads, &capturing, &free_type, &strict, &alloc_type, &recorder,
                            &PyList_Type, &starts, &PyList_Type, &allocs, &PyList_Type, &freed_starts, &PyList_Type,
                            &freed, &PyDict_Type, &graph_held, &alloc_class, &range_type, &block_what) != 0;
  }
};

// Owned references released at scope exit.
struct Owned {
  std::vector<PyObject*> held;
  PyObject* keep(PyObject* o) {
    if (o != nullptr) held.push_back(o);
    return o;
  }
  ~Owned() {
    for (PyObject* o : held) Py_DECREF(o);
  }
};

bool contains_identical(const std::vector<PyObject*>& seen, PyObject* o) {
  for (PyObject* s : seen)
    if (s == o) return true;
  return false;
}

PyObject* tuple_of(const std::vector<PyObject*>& items) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  if (t == nullptr) return nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    Py_INCREF(items[i]);
    PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), items[i]);
  }
  return t;
}

PyObject* interned(const char* text) {  // kept for the process, as Python keeps interned strings
  return PyUnicode_InternFromString(text);
}

// Recorder.range_in: the Range of bytes [lo, hi) of allocation `alloc` (the one object its `ranges` keeps per
// bytes; a new one made by Python). A new reference kept by `owned`, or nullptr with a Python error set.
PyObject* range_in(const Lane& lane, PyObject* alloc, const Access& a, Owned& owned) {
  static PyObject* ranges_name = interned("ranges");
  PyObject* ranges = owned.keep(PyObject_GetAttr(alloc, ranges_name));
  PyObject* key = owned.keep(Py_BuildValue("(KK)", (unsigned long long)a.lo, (unsigned long long)a.hi));
  if (ranges == nullptr || key == nullptr) return nullptr;
  PyObject* range = PyDict_Check(ranges) ? PyDict_GetItemWithError(ranges, key) : nullptr;
  if (range != nullptr) {
    Py_INCREF(range);
    return owned.keep(range);
  }
  if (PyErr_Occurred()) return nullptr;
  return owned.keep(PyObject_CallFunction(lane.range_in, "OKK", alloc, (unsigned long long)a.lo,
                                          (unsigned long long)a.hi));
}

// A record's thread id (rec.tid(), the thread acting as `ident`), where the recorder knows the thread: 1, or 0 when
// it needs Python (rec.tid() would record a ThreadStart), -1 on a Python error. New references kept by `owned`.
int thread_of(const Lane& lane, const Record& r, Owned& owned, PyObject*& ident, PyObject*& tid) {
  ident = owned.keep(PyLong_FromUnsignedLongLong(r.thread));
  if (ident == nullptr) return -1;
  // Strong references to what the tables give: the Python called later (range_in, site_of) must not drop them.
  tid = PyDict_GetItemWithError(lane.threads, ident);
  if (tid == nullptr) return PyErr_Occurred() ? -1 : 0;
  owned.keep(Py_NewRef(tid));
  return 1;
}

// A record's stream id (`pointer`: its cudaStream_t, as a Python int), where the recorder knows the stream: 1, 0
// (rec.sid() would register it), -1. `mapped`: the record's stream is the observed device's handle, turned into a
// cudaStream_t by lane.stream_pointer.
int stream_of(const Lane& lane, const Record& r, bool mapped, Owned& owned, PyObject*& pointer, PyObject*& sid) {
  pointer = owned.keep(PyLong_FromUnsignedLongLong(r.stream));
  if (pointer == nullptr) return -1;
  if (mapped && lane.stream_pointer != Py_None) {
    pointer = owned.keep(PyObject_CallOneArg(lane.stream_pointer, pointer));
    if (pointer == nullptr) return -1;
  }
  unsigned long long raw = PyLong_AsUnsignedLongLong(pointer);
  if (raw == (unsigned long long)-1 && PyErr_Occurred()) return -1;
  if (raw <= 2) return 0;  // the legacy and per-thread default streams: Recorder.stream_key's rule
  sid = PyDict_GetItemWithError(lane.streams, pointer);  // Recorder.sid's hot path
  if (sid == nullptr) return PyErr_Occurred() ? -1 : 0;
  owned.keep(Py_NewRef(sid));
  return 1;
}

// A record's call site, from its stack (the site of a stack first seen made by Python): 1, or -1.
int site_of(const Lane& lane, const Record& r, Owned& owned, PyObject*& site) {
  PyObject* stack = owned.keep(PyLong_FromUnsignedLong(r.stack));
  if (stack == nullptr) return -1;
  site = PyDict_GetItemWithError(lane.sites, stack);
  if (site != nullptr) {
    owned.keep(Py_NewRef(site));
    return 1;
  }
  if (PyErr_Occurred()) return -1;
  site = owned.keep(PyObject_CallFunction(lane.site_of, "I", r.stack));
  return site != nullptr ? 1 : -1;
}

// All three, where the recorder's tables know the record's thread and stream: 1, 0 when it needs Python, -1.
int thread_stream_site(const Lane& lane, const Record& r, bool mapped, Owned& owned, PyObject*& ident,
                       PyObject*& pointer, PyObject*& tid, PyObject*& sid, PyObject*& site) {
  int known = thread_of(lane, r, owned, ident, tid);
  if (known > 0) known = stream_of(lane, r, mapped, owned, pointer, sid);
  return known > 0 ? site_of(lane, r, owned, site) : known;
}

// A frozen dataclass of `type` with `fields` set as its own __init__ sets them (object.__setattr__), off the cyclic
// GC's lists: it holds only ints, strings and other such records, so it is never in a cycle (Recorder.record takes
// its own records off them too: streamcheck.core.fast.untrack). A new reference kept by `owned`, or nullptr.
PyObject* frozen_record(PyObject* type, PyObject* const* names, PyObject* const* values, int n, Owned& owned) {
  PyObject* op = owned.keep(PyBaseObject_Type.tp_new(reinterpret_cast<PyTypeObject*>(type),
                                                     owned.keep(PyTuple_New(0)), nullptr));
  if (op == nullptr) return nullptr;
  for (int i = 0; i < n; ++i)
    if (names[i] == nullptr || PyObject_GenericSetAttr(op, names[i], values[i]) != 0) return nullptr;
  PyObject_GC_UnTrack(op);
  return op;
}

// Recorder.record for a record made here (frozen_record), appended to the trace and fed to the checker. 1, or -1.
int append_record(const Lane& lane, PyObject* type, PyObject* const* names, PyObject* const* values, int n) {
  Owned owned;
  PyObject* op = frozen_record(type, names, values, n, owned);
  if (op == nullptr) return -1;
  if (PyList_Append(lane.ops, op) != 0) return -1;
  if (lane.feed != Py_None) {  // Recorder.record: a record the checker refuses is kept, and the error said
    PyObject* fed = PyObject_CallOneArg(lane.feed, op);
    if (fed == nullptr) {
      PyObject *type_, *value, *traceback;
      PyErr_Fetch(&type_, &value, &traceback);
      PyErr_NormalizeException(&type_, &value, &traceback);
      PyObject* handled = PyObject_CallFunctionObjArgs(lane.fed_badly, op, value, nullptr);
      Py_XDECREF(type_);
      Py_XDECREF(value);
      Py_XDECREF(traceback);
      if (handled == nullptr) return -1;
      Py_DECREF(handled);
    } else {
      Py_DECREF(fed);
    }
  }
  return 1;
}

// --- the recorder's allocation table, changed as Recorder.file and Recorder.unfile change it -------------------
// (The drain holds the recorder's lock.) Its sorted lists hold Python ints; a lookup that fails leaves the table as
// it was, and the drain reports the error.

// bisect.bisect_left of `x` in `list`, a sorted list of Python ints (`right`: bisect_right): its place, or -1 with a
// Python error set.
Py_ssize_t bisect(PyObject* list, unsigned long long x, bool right) {
  Py_ssize_t lo = 0, hi = PyList_GET_SIZE(list);
  while (lo < hi) {
    Py_ssize_t mid = lo + (hi - lo) / 2;
    unsigned long long v = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(list, mid));
    if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return -1;
    if (right ? !(x < v) : v < x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Attribute `name` of `o`, an int, as unsigned: 1, or -1 with a Python error set.
int unsigned_attr(PyObject* o, PyObject* name, unsigned long long& out) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == nullptr) return -1;
  out = PyLong_AsUnsignedLongLong(v);
  Py_DECREF(v);
  return out == static_cast<unsigned long long>(-1) && PyErr_Occurred() ? -1 : 1;
}

// `recorder.<name> += 1`: the value before it (`after`: after it), a new reference; nullptr with a Python error set.
PyObject* count_up(PyObject* recorder, PyObject* name, bool after) {
  static PyObject* one = PyLong_FromLong(1);
  PyObject* before = PyObject_GetAttr(recorder, name);
  if (before == nullptr) return nullptr;
  PyObject* next = PyNumber_Add(before, one);
  if (next == nullptr || PyObject_SetAttr(recorder, name, next) != 0) {
    Py_DECREF(before);
    Py_XDECREF(next);
    return nullptr;
  }
  PyObject* result = after ? next : before;
  Py_DECREF(after ? before : next);
  return result;
}

// Recorder._take_freed: the Ranges of the freed bytes that [start, stop) reuses, a tuple; those bytes leave the freed
// list (a split block keeps its other bytes there, so the freed bytes never overlap). nullptr with a Python error set.
PyObject* take_freed(const Lane& lane, unsigned long long start, unsigned long long stop) {
  if (PyList_GET_SIZE(lane.freed) == 0) return PyTuple_New(0);
  Owned owned;
  Py_ssize_t i = bisect(lane.freed_starts, start, true);
  if (i < 0) return nullptr;
  i = i > 0 ? i - 1 : 0;
  static PyObject* names[] = {interned("buffer"), interned("start"), interned("stop")};
  std::vector<PyObject*> reuses;
  while (i < PyList_GET_SIZE(lane.freed)) {
    unsigned long long lo = 0, hi = 0, base = 0;
    PyObject* buffer = nullptr;  // (start, stop, buffer id, the buffer's start)
    if (!PyArg_ParseTuple(PyList_GET_ITEM(lane.freed, i), "KKOK", &lo, &hi, &buffer, &base)) return nullptr;
    if (lo >= stop) break;
    if (hi <= start) {
      ++i;
      continue;
    }
    owned.keep(Py_NewRef(buffer));  // its entry goes next
    PyObject* values[] = {buffer, owned.keep(PyLong_FromUnsignedLongLong(std::max(lo, start) - base)),
                          owned.keep(PyLong_FromUnsignedLongLong(std::min(hi, stop) - base))};
    if (values[1] == nullptr || values[2] == nullptr) return nullptr;
    PyObject* range = frozen_record(lane.range_type, names, values, 3, owned);
    if (range == nullptr) return nullptr;
    reuses.push_back(range);
    if (PySequence_DelItem(lane.freed_starts, i) != 0 || PySequence_DelItem(lane.freed, i) != 0) return nullptr;
    for (auto [rest_lo, rest_hi] : {std::make_pair(lo, start), std::make_pair(stop, hi)}) {  // what is left of it
      if (rest_lo >= rest_hi) continue;
      PyObject* rest_start = owned.keep(PyLong_FromUnsignedLongLong(rest_lo));
      PyObject* entry = owned.keep(Py_BuildValue("(OKOK)", rest_start, rest_hi, buffer, base));
      if (rest_start == nullptr || entry == nullptr || PyList_Insert(lane.freed_starts, i, rest_start) != 0 ||
          PyList_Insert(lane.freed, i, entry) != 0)
        return nullptr;
      ++i;
    }
  }
  return tuple_of(reuses);
}

// Recorder.file for a block of torch's pool at `base` (`start`) of `nbytes` (`size`), allocated on stream `sid`,
// first used by thread `tid`: the new allocation, with its buffer id, the name its record gets and the Ranges of
// freed blocks whose bytes it reuses (all kept by `owned`); nullptr with a Python error set.
PyObject* file_block(const Lane& lane, PyObject* base, PyObject* size, PyObject* sid, PyObject* tid, Owned& owned,
                     PyObject*& buffer, PyObject*& name, PyObject*& reuses) {
  static PyObject *next_buffer = interned("_next_buffer"), *alloc_serial = interned("_alloc_serial"),
                  *torch_pool = interned("torch");
  unsigned long long start = PyLong_AsUnsignedLongLong(base), nbytes = PyLong_AsUnsignedLongLong(size);
  if (PyErr_Occurred()) return nullptr;
  Py_ssize_t i = bisect(lane.starts, start, false);
  if (i < 0) return nullptr;
  buffer = owned.keep(count_up(lane.recorder, next_buffer, false));
  PyObject* serial = owned.keep(count_up(lane.recorder, alloc_serial, true));
  // recorder.allocation_name(TORCH_BLOCK, nbytes), and the record's name: that, formatted with the buffer id
  PyObject* named = owned.keep(PyUnicode_FromFormat("%U #{id} (%llu bytes)", lane.block_what, nbytes));
  name = buffer != nullptr ? owned.keep(PyUnicode_FromFormat("%U #%S (%llu bytes)", lane.block_what, buffer, nbytes))
                           : nullptr;
  if (buffer == nullptr || serial == nullptr || named == nullptr || name == nullptr) return nullptr;
  PyObject* alloc = owned.keep(PyObject_CallFunctionObjArgs(lane.alloc_class, buffer, base, size, sid, serial, tid,
                                                            Py_False, named, torch_pool, nullptr));
  if (alloc == nullptr) return nullptr;
  if (PyList_Insert(lane.starts, i, base) != 0 || PyList_Insert(lane.allocs, i, alloc) != 0 ||
      PyDict_SetItem(lane.pool_at, base, alloc) != 0)
    return nullptr;
  reuses = owned.keep(take_freed(lane, start, start + nbytes));
  return reuses != nullptr ? alloc : nullptr;
}

// Recorder.unfile for allocation `alloc` (a graph holds none of its bytes: the caller asked): 1 when it left the
// table and its bytes are filed as freed, 0 when it was not in the table, -1 on a Python error.
int unfile_block(const Lane& lane, PyObject* alloc) {
  static PyObject *start_name = interned("start"), *stop_name = interned("stop"), *id_name = interned("id"),
                  *external_name = interned("external");
  Owned owned;
  PyObject* start_obj = owned.keep(PyObject_GetAttr(alloc, start_name));
  PyObject* stop_obj = owned.keep(PyObject_GetAttr(alloc, stop_name));
  PyObject* buffer = owned.keep(PyObject_GetAttr(alloc, id_name));
  if (start_obj == nullptr || stop_obj == nullptr || buffer == nullptr) return -1;
  unsigned long long start = PyLong_AsUnsignedLongLong(start_obj);
  if (PyErr_Occurred()) return -1;
  Py_ssize_t i = bisect(lane.starts, start, false);
  if (i < 0) return -1;
  Py_ssize_t n = PyList_GET_SIZE(lane.allocs);
  for (; i < n && PyList_GET_ITEM(lane.allocs, i) != alloc; ++i) {
    unsigned long long there = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(lane.starts, i));
    if (there == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return -1;
    if (there != start) break;
  }
  if (i >= n || PyList_GET_ITEM(lane.allocs, i) != alloc) return 0;
  PyObject* entry = owned.keep(PyTuple_Pack(4, start_obj, stop_obj, buffer, start_obj));
  Py_ssize_t j = bisect(lane.freed_starts, start, false);
  if (entry == nullptr || j < 0) return -1;
  owned.keep(Py_NewRef(alloc));  // the list's reference goes next
  if (PySequence_DelItem(lane.starts, i) != 0 || PySequence_DelItem(lane.allocs, i) != 0) return -1;
  PyObject* filed = PyDict_GetItemWithError(lane.pool_at, start_obj);
  if (filed == nullptr && PyErr_Occurred()) return -1;
  if (filed == alloc) {
    if (PyDict_DelItem(lane.pool_at, start_obj) != 0) return -1;
    n = PyList_GET_SIZE(lane.allocs);
    for (Py_ssize_t k = i; k < n; ++k) {  // another one there (bisect order: the latest first)
      PyObject* other = PyList_GET_ITEM(lane.allocs, k);
      unsigned long long other_start = 0;
      if (unsigned_attr(other, start_name, other_start) < 0) return -1;
      if (other_start != start) break;
      PyObject* external = PyObject_GetAttr(other, external_name);
      int is_external = external != nullptr ? PyObject_IsTrue(external) : -1;
      Py_XDECREF(external);
      if (is_external < 0) return -1;
      if (!is_external) {
        if (PyDict_SetItem(lane.pool_at, start_obj, other) != 0) return -1;
        break;
      }
    }
  }
  if (PyList_Insert(lane.freed_starts, j, start_obj) != 0 || PyList_Insert(lane.freed, j, entry) != 0) return -1;
  return 1;
}

// torch_runtime's rule for an event callback trace_hook took, where the recorder's tables know its thread, stream
// and event: an event created (named in the event table by Python, Recorder.name_event_handle; its EventCreate made
// here), recorded (EventRecord), waited on (StreamWait), deleted (its handle forgotten). 1 when done, 0 when it needs
// Python (a thread or stream not known yet), -1 on a Python error.
int fast_event(const Lane& lane, const Record& r) {
  Owned owned;
  PyObject* handle = owned.keep(PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(r.slot)));
  if (handle == nullptr) return -1;
  if (r.op == kEventDeleted) {  // Recorder.forget_event_handle (the drain holds the recorder's lock)
    if (PyDict_DelItem(lane.event_handles, handle) != 0) {
      if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
      PyErr_Clear();
    }
    return 1;
  }
  PyObject *ident = nullptr, *pointer = nullptr, *tid = nullptr, *sid = nullptr, *site = nullptr;
  if (r.op == kEventCreated) {  // Recorder.event_handle(fresh=True)
    int known = thread_of(lane, r, owned, ident, tid);
    if (known <= 0) return known;
    if (site_of(lane, r, owned, site) < 0) return -1;
    PyObject* named = owned.keep(PyObject_CallOneArg(lane.name_event_handle, handle));
    PyObject *eid = nullptr, *name = nullptr;
    if (named == nullptr || !PyArg_ParseTuple(named, "OO", &eid, &name)) return -1;
    static PyObject* names[] = {interned("thread"), interned("site"), interned("event"), interned("name")};
    PyObject* values[] = {tid, site, eid, name};
    return append_record(lane, lane.event_create_type, names, values, 4);
  }
  PyObject* eid = PyDict_GetItemWithError(lane.event_handles, handle);  // Recorder.event_handle, known
  if (eid == nullptr) return PyErr_Occurred() ? -1 : 0;
  owned.keep(Py_NewRef(eid));
  int known = thread_stream_site(lane, r, false, owned, ident, pointer, tid, sid, site);  // torch passed a cudaStream_t
  if (known <= 0) return known;
  static PyObject* names[] = {interned("thread"), interned("site"), interned("event"), interned("stream")};
  PyObject* values[] = {tid, site, eid, sid};
  return append_record(lane, r.op == kEventRecorded ? lane.event_record_type : lane.stream_wait_type, names, values,
                       4);
}

// torch_runtime's rule for an allocator callback trace_hook took, where the recorder's tables know its thread (and
// stream) and no graph's pool takes part (a capture open, or the thread allocating into a graph's pool: Python's
// rule): a block allocated is filed under the stream current then, until a tensor on it is first seen
// (TorchState.pending); a block freed ends the recording's allocation there, if torch's pool made it: its Free,
// on the allocation's stream, once it left the table (unfile_block). 1 when done, 0 when it needs
// Python, -1 on a Python error.
int fast_memory(const Lane& lane, const Record& r) {
  if (lane.capturing) return 0;
  Owned owned;
  PyObject *ident = nullptr, *tid = nullptr, *site = nullptr;
  int known = thread_of(lane, r, owned, ident, tid);
  if (known <= 0) return known;
  PyObject* depth = PyDict_GetItemWithError(lane.pool_threads, ident);  // graph_pool_threads: a graph tree's warm-up
  if (depth == nullptr && PyErr_Occurred()) return -1;
  if (depth != nullptr) {
    int into_pool = PyObject_IsTrue(depth);
    if (into_pool != 0) return into_pool < 0 ? -1 : 0;
  }
  PyObject* block = owned.keep(PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(r.slot)));
  if (block == nullptr) return -1;
  if (r.op == kMemoryAllocated) {
    PyObject *pointer = nullptr, *sid = nullptr;
    known = stream_of(lane, r, true, owned, pointer, sid);
    if (known <= 0) return known;
    return PyDict_SetItem(lane.pending, block, sid) == 0 ? 1 : -1;
  }
  int in_pool = PySet_Contains(lane.pool_blocks, block);
  if (in_pool != 0) return in_pool < 0 ? -1 : 0;
  if (PyDict_DelItem(lane.pending, block) != 0) {  // never seen as a tensor
    if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
    PyErr_Clear();
  }
  PyObject* alloc = PyDict_GetItemWithError(lane.pool_at, block);  // Recorder.allocation_at
  if (alloc == nullptr) return PyErr_Occurred() ? -1 : 1;
  owned.keep(Py_NewRef(alloc));
  static PyObject *id_name = interned("id"), *stream_name = interned("stream"), *also_name = interned("also"),
                  *pool_name = interned("pool");
  PyObject* pool = owned.keep(PyObject_GetAttr(alloc, pool_name));
  if (pool == nullptr) return -1;
  if (!PyUnicode_Check(pool) || PyUnicode_CompareWithASCIIString(pool, "torch") != 0) return 1;  // not torch's
  PyObject* buffer = owned.keep(PyObject_GetAttr(alloc, id_name));
  PyObject* stream = owned.keep(PyObject_GetAttr(alloc, stream_name));
  PyObject* also = owned.keep(PyObject_GetAttr(alloc, also_name));
  if (buffer == nullptr || stream == nullptr || also == nullptr) return -1;
  int held = PyDict_Contains(lane.graph_held, buffer);  // a graph's nodes use it: its free waits (Python's rule)
  if (held != 0) return held < 0 ? -1 : 0;
  if (site_of(lane, r, owned, site) < 0) return -1;  // (before the table changes: an error leaves it as it was)
  int unfiled = unfile_block(lane, alloc);
  if (unfiled <= 0) return unfiled < 0 ? -1 : 1;  // not in the table (freed already): no Free
  static PyObject* names[] = {interned("thread"), interned("site"), interned("buffer"), interned("stream"),
                               interned("also"),   interned("pool"), interned("strict")};
  PyObject* values[] = {tid, site, buffer, stream, also, pool, lane.strict};
  return append_record(lane, lane.free_type, names, values, 7);
}

// register_storage's rule for a storage first seen: a block whose allocation torch reported (TorchState.pending
// holds the stream it was allocated on) is filed in the recorder's table (file_block) and its Alloc record made, at the operator's thread and site; any other goes to register_storage itself (a block
// allocated before the recording, filed under the current stream). The allocation (kept by `owned`), or nullptr
// with a Python error set.
PyObject* register_block(const Lane& lane, const Access& a, PyObject* base, bool fresh, PyObject* pointer,
                         PyObject* ident, PyObject* tid, PyObject* site, Owned& owned) {
  PyObject* sid = PyDict_GetItemWithError(lane.pending, base);
  if (sid == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    return owned.keep(PyObject_CallFunction(lane.register_storage, "OKOOOO", base, (unsigned long long)a.nbytes,
                                            fresh ? Py_True : Py_False, pointer, ident, site));
  }
  owned.keep(Py_NewRef(sid));
  PyObject* nbytes = owned.keep(PyLong_FromUnsignedLongLong(a.nbytes));
  if (nbytes == nullptr || PyDict_DelItem(lane.pending, base) != 0) return nullptr;
  PyObject *buffer = nullptr, *name = nullptr, *reuses = nullptr;
  PyObject* alloc = file_block(lane, base, nbytes, sid, tid, owned, buffer, name, reuses);
  if (alloc == nullptr) return nullptr;
  static PyObject* device = PyLong_FromLong(0);  // Alloc's default, as Recorder._add_alloc leaves it
  static PyObject* names[] = {interned("thread"), interned("site"),   interned("buffer"), interned("nbytes"),
                               interned("name"),   interned("device"), interned("stream"), interned("reuses")};
  PyObject* values[] = {tid, site, buffer, nbytes, name, device, sid, reuses};
  if (append_record(lane, lane.alloc_type, names, values, 8) < 0) return nullptr;
  return alloc;
}

// torch_native.NativeRecording._launch for an ordinary operator whose thread and stream the recorder's tables know:
// its storages found in the allocation table (a block first seen registered by Python), then its Launch.
// Returns 1 when recorded (or when it records nothing: an allocating operator), 0 when the record needs Python
// (nothing done yet), -1 on a Python error.
int fast_launch(const Lane& lane, const Record& r, const Access* accesses_of) {
  if (r.flags & kSpecialRecord) return 0;
  Owned owned;
  PyObject *ident = nullptr, *pointer = nullptr, *tid = nullptr, *sid = nullptr, *site = nullptr;
  int known = thread_stream_site(lane, r, true, owned, ident, pointer, tid, sid, site);
  if (known <= 0) return known;
  for (uint32_t i = 0; i < r.count; ++i)  // bytes outside any storage: Recorder.span_range's search, in Python
    if (accesses_of[i].base == 0 && accesses_of[i].lo != accesses_of[i].hi) return 0;
  // Each storage the recorder's allocation: known, or registered now by Python (a block first seen: its Alloc
  // record, at this operator's site and thread), in _launch's order (the reads', the writes', the fresh outputs').
  // A record handed to Python after this finds them known.
  std::vector<PyObject*> allocs(r.count, nullptr);
  for (uint8_t role : {kRead, kWritten, kFresh}) {
    for (uint32_t i = 0; i < r.count; ++i) {
      const Access& a = accesses_of[i];
      if (a.role != role || a.base == 0) continue;
      PyObject* base = owned.keep(PyLong_FromUnsignedLongLong(a.base));
      if (base == nullptr) return -1;
      PyObject* alloc = PyDict_GetItemWithError(lane.pool_at, base);
      if (alloc != nullptr) {
        alloc = owned.keep(Py_NewRef(alloc));
      } else if (PyErr_Occurred()) {
        return -1;
      } else {
        alloc = register_block(lane, a, base, role == kFresh, pointer, ident, tid, site, owned);
        if (alloc == nullptr) return -1;
      }
      allocs[i] = alloc;
    }
  }
  uint32_t op_flags = static_cast<uint32_t>(PyLong_AsUnsignedLong(PyList_GET_ITEM(lane.op_flags, r.op)));
  if (op_flags & lane.no_access) return 1;  // its tensors registered, nothing touched
  std::vector<PyObject*> spans[3];
  for (uint32_t i = 0; i < r.count; ++i) {
    const Access& a = accesses_of[i];
    if (a.lo == a.hi || allocs[i] == nullptr || allocs[i] == Py_None) continue;  // an empty tensor spans no bytes
    PyObject* range = range_in(lane, allocs[i], a, owned);
    if (range == nullptr) return -1;
    spans[a.role].push_back(range);
  }
  std::vector<PyObject*> written, read;
  for (int role : {kWritten, kFresh})
    for (PyObject* range : spans[role])
      if (!contains_identical(written, range)) written.push_back(range);
  for (PyObject* range : spans[kRead])  // what it writes is not also read (torch_ops' rule)
    if (!contains_identical(read, range) && !contains_identical(written, range)) read.push_back(range);
  PyObject* reads = owned.keep(tuple_of(read));
  PyObject* writes = owned.keep(tuple_of(written));
  if (reads == nullptr || writes == nullptr) return -1;
  PyObject_GC_UnTrack(reads);  // (append_record says why)
  PyObject_GC_UnTrack(writes);
  static PyObject* names[] = {interned("thread"), interned("site"), interned("stream"), interned("name"),
                               interned("reads"), interned("writes")};
  PyObject* values[] = {tid, site, sid, PyList_GET_ITEM(lane.names, r.op), reads, writes};
  return append_record(lane, lane.launch_type, names, values, 6);
}

c10::List<c10::IValue> any_list(std::vector<c10::IValue>&& values) {
  c10::List<c10::IValue> list(c10::AnyType::get());
  for (auto& v : values) list.push_back(std::move(v));
  return list;
}

std::tuple<c10::List<c10::IValue>, c10::List<c10::IValue>> special_values_op(int64_t slot) {
  auto [inputs, outputs] = special_values(slot);
  return std::make_tuple(any_list(std::move(inputs)), any_list(std::move(outputs)));
}

void set_callable(PyObject*& slot, PyObject* value) {
  Py_XINCREF(value == Py_None ? nullptr : value);
  PyObject* old = slot;
  slot = value == Py_None ? nullptr : value;
  Py_XDECREF(old);
}

}  // namespace

TORCH_LIBRARY(streamcheck_native, m) {
  m.def("special_values(int slot) -> (Any[], Any[])", &special_values_op);
}

// --- the C functions Python calls (ctypes.PyDLL: with the GIL held) ----------------------------------------------
extern "C" {

// Forget the code classifications and the stacks (the resolver's settings changed). The caller drained first.
void streamcheck_native_reset_stacks() {
  std::unordered_map<PyObject*, uint8_t> codes;
  {
    std::lock_guard<std::mutex> lock(stacks_mutex);
    codes.swap(code_kinds);
    stacks.clear();
  }
  for (auto& [code, kind] : codes) Py_DECREF(code);
}

// Start observing `device_type` (c10::DeviceType: 1 CUDA, 0 CPU for tests) with Python's functions; the threads
// that observe are those that call streamcheck_native_observe_thread(1). Returns 0, or -1 with a Python error set.
int streamcheck_native_enable(int device_type, PyObject* describe, PyObject* classify, PyObject* begin, PyObject* end,
                              int depth) {
  observed = static_cast<c10::DeviceType>(device_type);
  autocast_key = observed == c10::DeviceType::CPU ? c10::DispatchKey::AutocastCPU : c10::DispatchKey::AutocastCUDA;
  try {
    auto* guard = c10::impl::getDeviceGuardImpl(observed);
    c10::Stream stream = guard->getStream(guard->getDevice());
    native_streams = false;
    try {
      guard->getStreamNativeHandle(stream);
      native_streams = true;
    } catch (...) {
    }
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "torch has no device guard for %s: %s", c10::DeviceTypeName(observed).c_str(),
                 e.what());
    return -1;
  }
  {  // each recording describes operators into its own table, and classifies code by its own resolver
    std::lock_guard<std::mutex> lock(ops_mutex);
    for (auto& [name, info] : ops) retired.push_back(info);
    ops.clear();
  }
  streamcheck_native_reset_stacks();
  set_callable(describe_op, describe);
  set_callable(classify_code, classify);
  set_callable(special_begin, begin);
  set_callable(special_end, end);
  user_depth = depth < 1 ? 1 : depth;
  enabled.store(true);
  return 0;
}

// Whether the records' streams are the device's native handles (cudaStream_t), as the recorder names streams
// (set by enable; a device type without them, CPU, gives stream ids).
int streamcheck_native_stream_handles() {
  return native_streams;
}

// Stop recording: every thread's callback goes inert at once (each thread removes its own with observe_thread(0)).
void streamcheck_native_disable() {
  enabled.store(false);
}

// Add (1) or remove (0) this thread's RecordFunction callback. Returns whether this thread has one now.
int streamcheck_native_observe_thread(int on) {
  ThreadState& ts = thread_state;
  if (on && ts.handle == 0) {
    ts.handle = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end)
                                               .needsInputs(true)
                                               .needsOutputs(true)
                                               .scopes({at::RecordScope::FUNCTION}));
    ts.depth = 0;
  } else if (!on && ts.handle != 0) {
    at::removeCallback(ts.handle);
    ts.handle = 0;
    ts.depth = 0;
  }
  return ts.handle != 0;
}

// Whether this thread has any RecordFunction callback of its own (streamcheck's, or another's).
int streamcheck_native_thread_has_callbacks() {
  return at::hasThreadLocalCallbacks();
}

// streamcheck's own work on this thread (+1 entering, -1 leaving): its operators are not the program's.
void streamcheck_native_pause(int delta) {
  thread_state.paused += delta;
}

// --- torch's GPU-trace callbacks, in issue order with the operators ---------------------------------------------
// c10 reports an event's creation, record, wait and deletion, and a block of the caching allocator allocated or
// freed, by calling `fire_callbacks` of a registry in torch.cuda._gpu_trace, looked up on the registry object at
// each call (torch/csrc/PyInterpreter.cpp). While the observer records, that attribute is this function: the
// callback becomes a record in the buffer, with its thread and stack (an allocation's with the stream current
// then), and the drain makes its trace record (fast_event, fast_memory; torch_runtime's rule in Python for the
// rest). The registry's other callbacks (PyTorch's sanitizer's, say) are still called.
static PyObject* trace_hook(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  // self: (kind, the registry's own fire_callbacks, its callback list, torch_runtime's callback)
  long kind = PyLong_AsLong(PyTuple_GET_ITEM(self, 0));
  ThreadState& ts = thread_state;
  bool memory = kind >= kMemoryAllocated;
  bool deferred = false;
  // An allocator callback waits in the buffer only on a thread whose operators the observer sees, outside
  // streamcheck's own work (paused): elsewhere torch_runtime's callback records it at once, as on the Python path
  // (a thread the recording never reached is named; a free inside a drain still ends its allocation).
  if (enabled.load(std::memory_order_relaxed) && ts.paused == 0 && nargs >= 1 && (!memory || ts.handle != 0)) {
    unsigned long long slot = PyLong_AsUnsignedLongLong(args[0]);
    unsigned long long stream = !memory && nargs > 1 ? PyLong_AsUnsignedLongLong(args[1]) : 0;
    deferred = !PyErr_Occurred();  // torch passes ints; anything else is not deferred (never an error into torch)
    PyErr_Clear();
    uint32_t flags = kTraceRecord;
    if (deferred && kind == kMemoryAllocated) {
      try {
        stream = current_stream(-1);
        flags |= kHasStream;
      } catch (...) {
        deferred = false;
      }
    }
    if (deferred) {
      uint32_t stack = 0;
      try {
        stack = stack_id();
      } catch (...) {
      }
      Record r{static_cast<uint32_t>(kind), stack, flags, 0, 0, -1, static_cast<uint64_t>(pthread_self()), stream,
               static_cast<int64_t>(slot)};
      std::lock_guard<std::mutex> lock(records_mutex);
      r.first = static_cast<uint32_t>(accesses.size());
      records.push_back(r);
      streamcheck_native_waiting.store(records.size(), std::memory_order_relaxed);
    }
  }
  if (memory && !deferred) {
    // As the registry's own fire_callbacks calls it: an error is said, never raised into torch's allocator.
    PyObject* callback = PyTuple_GET_ITEM(self, 3);
    PyObject* result = PyObject_Vectorcall(callback, args, static_cast<size_t>(nargs), nullptr);
    if (result == nullptr) PyErr_WriteUnraisable(callback);
    Py_XDECREF(result);
  }
  PyObject* others = PyTuple_GET_ITEM(self, 2);
  if (PyList_Check(others) && PyList_GET_SIZE(others) > 0) {
    PyObject* result = PyObject_Vectorcall(PyTuple_GET_ITEM(self, 1), args, static_cast<size_t>(nargs), nullptr);
    if (result == nullptr) return nullptr;
    Py_DECREF(result);
  }
  Py_RETURN_NONE;
}

static PyMethodDef trace_hook_def = {
    "fire_callbacks", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(trace_hook)), METH_FASTCALL,
    "streamcheck's native observer: this GPU-trace callback, a record of its buffer."};

// A callable for a registry's `fire_callbacks`: callbacks of `kind` (TraceKind) become records; `fire` (the
// registry's own fire_callbacks) is called after them while `others` (its callback list) is not empty; `callback`
// (torch_runtime's, taken from that list) is called for an allocator callback that is not deferred.
PyObject* streamcheck_native_trace_hook(int kind, PyObject* fire, PyObject* others, PyObject* callback) {
  PyObject* self = Py_BuildValue("(iOOO)", kind, fire, others, callback);
  if (self == nullptr) return nullptr;
  PyObject* function = PyCFunction_New(&trace_hook_def, self);
  Py_DECREF(self);
  return function;
}

// Append the pending records to `out` (a list) and forget them: tuples
// (op index, thread ident, stream, device, stack id, flags, slot, accesses), accesses a tuple of
// (lo, hi, storage base, storage bytes, device, role).
int streamcheck_native_take(PyObject* out) {
  std::vector<Record> taken;
  std::vector<Access> taken_accesses;
  take_pending(taken, taken_accesses);
  for (const Record& r : taken) {
    PyObject* record = record_tuple(r, taken_accesses.data() + r.first);
    if (record == nullptr || PyList_Append(out, record) != 0) {
      Py_XDECREF(record);
      return -1;
    }
    Py_DECREF(record);
  }
  return 0;
}

// Turn the pending records into trace records, in issue order: each ordinary operator whose thread and stream the
// recorder already knows becomes its Launch here (fast_launch; a storage first seen and not reported by torch's
// allocator is registered by Python), each GPU-trace callback its record (fast_event, fast_memory); any other
// record goes to `lane`'s Python function for one record (torch_native.NativeRecording._record_one). This thread's
// operators are not observed meanwhile. Returns 0, or -1 with a Python error set (the records not turned yet are
// lost; the caller says so).
int streamcheck_native_drain(PyObject* lane_tuple) {
  struct Paused {  // what the drain runs is streamcheck's (is_pinned, the special values): not the program's
    Paused() { ++thread_state.paused; }
    ~Paused() { --thread_state.paused; }
  } paused;
  Lane lane;
  if (!lane.unpack(lane_tuple)) return -1;
  std::vector<Record> taken;
  std::vector<Access> taken_accesses;
  take_pending(taken, taken_accesses);
  for (const Record& r : taken) {
    const Access* accesses_of = taken_accesses.data() + r.first;
    int done = !(r.flags & kTraceRecord)        ? fast_launch(lane, r, accesses_of)
               : r.op >= kMemoryAllocated ? fast_memory(lane, r)
                                          : fast_event(lane, r);
    if (done < 0) return -1;
    if (done > 0) continue;
    PyObject* record = record_tuple(r, accesses_of);
    PyObject* result = record != nullptr ? PyObject_CallOneArg(lane.slow, record) : nullptr;
    Py_XDECREF(record);
    if (result == nullptr) return -1;
    Py_DECREF(result);
  }
  return 0;
}

// Append the frames of stack `id` to `out`: ((code, offset), ...), then the user's frame's index.
int streamcheck_native_stack(unsigned int id, PyObject* out) {
  std::vector<uint64_t> key;
  {
    std::lock_guard<std::mutex> lock(stacks_mutex);
    const std::vector<uint64_t>* found = stacks.key(id);
    if (found == nullptr) return 0;
    key = *found;
  }
  PyObject* pair = stack_tuple(key);  // its codes held by code_kinds since they were classified
  int status = pair != nullptr ? PyList_Append(out, pair) : -1;
  Py_XDECREF(pair);
  return status;
}

// Append this thread's frames as the observer reads them, innermost first: (code, offset) each (the self-check at
// enable compares them with sys._getframe()).
int streamcheck_native_frames_here(PyObject* out) {
  PyThreadState* state = PyGILState_GetThisThreadState();
  return state == nullptr ? 0 : append_frames(state, out);
}

}  // extern "C"
