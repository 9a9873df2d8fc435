// What observing torch's operators costs below Python (benchmarks/bench_native_record.py): RecordFunction
// callbacks on the dispatcher's operators, thread-local or global, that do nothing, or that record what
// streamcheck's recorder needs of each operator (its name, each tensor argument's bytes and whether the schema
// says it is written, the outputs, the current stream of the tensor's device, the calling Python frame).
// A measurement only: the recorder's observer is streamcheck/record/native/observer.cpp.
#define Py_BUILD_CORE 1
#include <Python.h>
#if PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_frame.h>
#endif

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

struct Access {
  uint64_t lo, hi, base, nbytes;
  int written;
};

struct Record {
  const void* op;
  int64_t stream;
  const void* code;
  int lasti;
  uint32_t first, count;
};

struct OpInfo {
  std::vector<bool> written;  // per schema argument
};

std::mutex ops_mutex;
std::unordered_map<const char*, OpInfo*> ops;  // keyed by the schema's name string (stable while it lives)
std::vector<Record> records;
std::vector<Access> accesses;
thread_local std::vector<std::pair<uint32_t, uint32_t>> open_ops;  // (record index, outputs from) per depth
at::CallbackHandle handle = 0;
int64_t with_gil = 0;
c10::DeviceType device_type = c10::DeviceType::CPU;

OpInfo* op_info(const at::RecordFunction& fn) {
  std::lock_guard<std::mutex> lock(ops_mutex);
  auto found = ops.find(fn.name());
  if (found != ops.end()) return found->second;
  auto* info = new OpInfo();
  if (auto name = fn.operator_name()) {
    if (auto op = c10::Dispatcher::singleton().findOp(*name)) {
      for (const auto& arg : op->schema().arguments()) {
        info->written.push_back(arg.alias_info() != nullptr && arg.alias_info()->isWrite());
      }
    }
  }
  ops.emplace(fn.name(), info);
  return info;
}

void add_tensor(const at::Tensor& t, int written) {
  if (!t.defined() || t.device().type() != device_type) return;
  auto size = t.element_size();
  uint64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    auto n = t.sizes()[d], st = t.strides()[d] * static_cast<int64_t>(size);
    if (n == 0) return;
    if (n > 1) (st >= 0 ? hi : lo) += (n - 1) * st;
  }
  auto ptr = reinterpret_cast<uint64_t>(t.data_ptr());
  const auto& storage = t.storage();
  accesses.push_back({ptr + lo, ptr + hi + size, reinterpret_cast<uint64_t>(storage.data()), storage.nbytes(), written});
}

void add_value(const c10::IValue& v, int written) {
  if (v.isTensor()) {
    add_tensor(v.toTensor(), written);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) add_tensor(t, written);
  } else if (v.isList()) {
    for (const c10::IValue& item : v.toListRef()) {
      if (item.isTensor()) add_tensor(item.toTensor(), written);
    }
  }
}

// The innermost Python frame of this thread, read without the GIL (the thread is inside the operator's C++).
void python_frame(const void** code, int* lasti) {
  *code = nullptr;
  *lasti = -1;
  PyThreadState* state = PyGILState_GetThisThreadState();
  if (state == nullptr) return;
#if PY_VERSION_HEX >= 0x030D0000
  _PyInterpreterFrame* frame = state->current_frame;
#elif PY_VERSION_HEX >= 0x030B0000
  _PyInterpreterFrame* frame = state->cframe->current_frame;
#else
  PyFrameObject* frame = state->frame;
  if (frame != nullptr) {
    *code = frame->f_code;
    *lasti = frame->f_lasti * static_cast<int>(sizeof(_Py_CODEUNIT));
  }
  return;
#endif
#if PY_VERSION_HEX >= 0x030B0000
  while (frame != nullptr && _PyFrame_IsIncomplete(frame)) frame = frame->previous;
  if (frame == nullptr) return;
#if PY_VERSION_HEX >= 0x030D0000
  *code = _PyFrame_GetCode(frame);
#else
  *code = frame->f_code;
#endif
  *lasti = _PyInterpreterFrame_LASTI(frame) * static_cast<int>(sizeof(_Py_CODEUNIT));
#endif
}

std::unique_ptr<at::ObserverContext> noop_start(const at::RecordFunction&) {
  return nullptr;
}

void noop_end(const at::RecordFunction&, at::ObserverContext*) {}

std::unique_ptr<at::ObserverContext> full_start(const at::RecordFunction& fn) {
  OpInfo* info = op_info(fn);
  if (PyGILState_Check()) ++with_gil;
  Record record{info, 0, nullptr, -1, static_cast<uint32_t>(accesses.size()), 0};
  auto inputs = fn.inputs();
  for (size_t i = 0; i < inputs.size(); ++i) {
    add_value(inputs[i], i < info->written.size() && info->written[i]);
  }
  auto* guard = c10::impl::getDeviceGuardImpl(device_type);
  record.stream = guard->getStream(guard->getDevice()).id();
  python_frame(&record.code, &record.lasti);
  open_ops.emplace_back(static_cast<uint32_t>(records.size()), 0);
  records.push_back(record);
  return nullptr;
}

void full_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (open_ops.empty()) return;
  auto index = open_ops.back().first;
  open_ops.pop_back();
  for (const c10::IValue& out : fn.outputs()) add_value(out, 2);
  records[index].count = static_cast<uint32_t>(accesses.size()) - records[index].first;
}

}  // namespace

extern "C" {

int probe_enable(int full, int global) {
  auto callback = full ? at::RecordFunctionCallback(full_start, full_end).needsInputs(true).needsOutputs(true)
                       : at::RecordFunctionCallback(noop_start, noop_end);
  callback.scopes({at::RecordScope::FUNCTION});
  handle = global ? at::addGlobalCallback(callback) : at::addThreadLocalCallback(callback);
  return handle != 0;
}

void probe_disable() {
  at::removeCallback(handle);
  handle = 0;
}

int64_t probe_records() {
  return static_cast<int64_t>(records.size());
}

int64_t probe_with_gil() {
  return with_gil;
}

void probe_clear() {
  records.clear();
  accesses.clear();
  with_gil = 0;
}

}  // extern "C"
