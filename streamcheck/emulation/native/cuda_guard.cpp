// A CUDA device guard and CUDA hooks for a CPU-only torch, so that torch's autograd engine runs on
// the emulation's cuda tensors (streamcheck/emulation/native/__init__.py builds and preloads it).
//
// Why: the engine asks the device guard of a tensor's device type for its current stream (a graph
// node keeps its forward op's stream; its backward op runs there), for events between streams, and
// for the device's worker thread; a CPU-only build has no CUDA guard and aborts the process. It
// also asks torch's CUDA hooks whether an accelerator exists, once, at torch's import: so this
// library is loaded before torch (LD_PRELOAD), and the hooks are registered under the key torch
// looks up ("CUDAHooks").
//
// What it holds: per thread, the current device and the current stream of each device (stream id
// = the sim's stream id; 0 is the legacy default stream), read and set by the emulation through
// the extern "C" functions below (ctypes), so the engine's stream guards and the emulation's
// torch.cuda.current_stream() are one state. Events, stream and device synchronizes go to Python
// callbacks: the emulation makes them sim events, waits and host syncs.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

// Engine worker threads are made once per process, one per device the guard reports: a fixed
// count, since the emulated device count changes from run to run.
constexpr c10::DeviceIndex kGuardDevices = 16;

thread_local c10::DeviceIndex current_device = 0;
thread_local std::array<int64_t, kGuardDevices> current_streams{};  // 0: the legacy default stream

std::atomic<int> emulated_devices{0};  // the running emulation's device count; 0: none running

// The emulation's callbacks (ctypes CFUNCTYPE pointers; each takes the GIL). An int result < 0 is a
// failure whose text the callback left with streamcheck_native_set_error.
struct Callbacks {
  int64_t (*record_event)(int64_t event, int device, int64_t stream) = nullptr;  // -> the event's id
  int (*block_event)(int64_t event, int device, int64_t stream) = nullptr;
  int (*query_event)(int64_t event) = nullptr;  // 1 done, 0 pending
  int (*synchronize_event)(int64_t event) = nullptr;
  int (*query_stream)(int device, int64_t stream) = nullptr;
  int (*synchronize_stream)(int device, int64_t stream) = nullptr;
  int (*synchronize_device)(int device) = nullptr;
  double (*elapsed_time)(int64_t start, int64_t stop) = nullptr;  // ms; < 0 failed
};
Callbacks callbacks;
thread_local std::string last_error;

// Destroyed events, for the emulation to forget at its next record: an event is destroyed wherever
// its c10::Event dies, on the engine's thread too, maybe as the interpreter exits, so it never
// calls into Python (taking the GIL then ends the thread inside C++ and aborts the process).
std::mutex destroyed_mutex;
std::vector<int64_t> destroyed;

void check_running(const char* what) {
  TORCH_CHECK(emulated_devices.load() > 0 && callbacks.record_event != nullptr, "streamcheck: ", what,
              " on an emulated CUDA device with no emulation running");
}

void check(int status, const char* what) {
  TORCH_CHECK(status >= 0, "streamcheck: ", what, ": ", last_error);
}

c10::DeviceIndex checked_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kGuardDevices, "streamcheck: cuda:", static_cast<int>(index),
              " is beyond the ", static_cast<int>(kGuardDevices), " devices the emulation's autograd supports");
  return index;
}

int64_t event_id(void* event) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(event));
}

struct EmulatedCudaGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return c10::DeviceType::CUDA;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::CUDA, current_device);
  }
  void setDevice(c10::Device d) const override {
    current_device = checked_index(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < kGuardDevices) {
      current_device = d.index();
    }
  }
  c10::Stream getStream(c10::Device d) const override {
    c10::DeviceIndex index = d.index() < 0 ? current_device : checked_index(d.index());
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, index), current_streams[index]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    c10::DeviceIndex index = d.index() < 0 ? current_device : checked_index(d.index());
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, index), 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    // Called from stream guards' destructors: it must not throw.
    c10::DeviceIndex index = s.device_index();
    if (index < 0 || index >= kGuardDevices) {
      return s;
    }
    c10::Stream old(c10::Stream::UNSAFE, s.device(), current_streams[index]);
    current_streams[index] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return kGuardDevices;
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    check_running("an event record");
    int64_t id = callbacks.record_event(event_id(*event), stream.device_index(), stream.id());
    check(static_cast<int>(id < 0 ? -1 : 0), "an event record");
    *event = reinterpret_cast<void*>(static_cast<intptr_t>(id));
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) {
      return;  // waiting for an event never recorded is a no-op (CUDA)
    }
    check_running("a stream's wait for an event");
    check(callbacks.block_event(event_id(event), stream.device_index(), stream.id()), "a stream's wait for an event");
  }
  bool queryEvent(void* event) const override {
    if (event == nullptr) {
      return true;
    }
    check_running("an event query");
    int done = callbacks.query_event(event_id(event));
    check(done, "an event query");
    return done == 1;
  }
  void synchronizeEvent(void* event) const override {
    if (event == nullptr) {
      return;
    }
    check_running("an event synchronize");
    check(callbacks.synchronize_event(event_id(event)), "an event synchronize");
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    if (event != nullptr) {
      std::lock_guard<std::mutex> lock(destroyed_mutex);
      destroyed.push_back(event_id(event));
    }
  }
  bool queryStream(const c10::Stream& stream) const override {
    check_running("a stream query");
    int done = callbacks.query_stream(stream.device_index(), stream.id());
    check(done, "a stream query");
    return done == 1;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    check_running("a stream synchronize");
    check(callbacks.synchronize_stream(stream.device_index(), stream.id()), "a stream synchronize");
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    check_running("a device synchronize");
    check(callbacks.synchronize_device(device_index), "a device synchronize");
  }
  double elapsedTime(void* start, void* stop, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && stop != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    check_running("an elapsed time");
    double ms = callbacks.elapsed_time(event_id(start), event_id(stop));
    check(ms < 0 ? -1 : 0, "an elapsed time");
    return ms;
  }
  // recordDataPtrOnStream: the base class's no-op. An emulated tensor's DataPtr is empty (a wrapper
  // tensor); the emulation's allocator learns a block's streams from the operators themselves.
};

}  // namespace

namespace at {

// Registered under the name torch looks up ("CUDAHooks"). Whether CUDA is there is read once, at
// torch's import: hence the preload.
struct CUDAHooks final : public CUDAHooksInterface {
  explicit CUDAHooks(CUDAHooksArgs) {}
  void init() const override {}
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasCUDA() const override {
    return true;
  }
  bool hasPrimaryContext(DeviceIndex device_index) const override {
    // The engine stashes the caller's current stream of each device that has one.
    return device_index >= 0 && device_index < emulated_devices.load();
  }
  DeviceIndex deviceCount() const override {
    return static_cast<DeviceIndex>(emulated_devices.load());
  }
  int getNumGPUs() const override {
    return emulated_devices.load();
  }
  DeviceIndex current_device() const override {
    return ::current_device;
  }
  DeviceIndex getCurrentDevice() const override {
    return ::current_device;
  }
  void setCurrentDevice(DeviceIndex device) const override {
    ::current_device = checked_index(device);
  }
  DeviceIndex exchangeDevice(DeviceIndex device) const override {
    DeviceIndex old = ::current_device;
    ::current_device = checked_index(device);
    return old;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  void deviceSynchronize(DeviceIndex device_index) const override {
    check_running("a device synchronize");
    check(callbacks.synchronize_device(device_index), "a device synchronize");
  }
};

REGISTER_CUDA_HOOKS(CUDAHooks);

}  // namespace at

C10_REGISTER_GUARD_IMPL(CUDA, EmulatedCudaGuard);

// The emulation's side (ctypes).
extern "C" {

int streamcheck_native_version() {
  return 1;
}

int streamcheck_native_guard_devices() {
  return kGuardDevices;
}

// The running emulation's device count (0 when it ends: events then refuse).
void streamcheck_native_set_devices(int devices) {
  emulated_devices.store(devices);
}

int streamcheck_native_current_device() {
  return current_device;
}

int streamcheck_native_set_current_device(int device) {
  if (device < 0 || device >= kGuardDevices) {
    return -1;
  }
  current_device = static_cast<c10::DeviceIndex>(device);
  return 0;
}

// The calling thread's current stream of `device`, or -1 for a device beyond the guard's.
int64_t streamcheck_native_current_stream(int device) {
  if (device < 0 || device >= kGuardDevices) {
    return -1;
  }
  return current_streams[device];
}

int streamcheck_native_set_current_stream(int device, int64_t stream) {
  if (device < 0 || device >= kGuardDevices) {
    return -1;
  }
  current_streams[device] = stream;
  return 0;
}

// Every device's current stream of the calling thread back to the legacy stream, device 0 current.
void streamcheck_native_reset_thread() {
  current_streams.fill(0);
  current_device = 0;
}

void streamcheck_native_set_error(const char* text) {
  last_error = text == nullptr ? "" : text;
}

// One destroyed event's id, or 0 when there is none left.
int64_t streamcheck_native_pop_destroyed() {
  std::lock_guard<std::mutex> lock(destroyed_mutex);
  if (destroyed.empty()) {
    return 0;
  }
  int64_t id = destroyed.back();
  destroyed.pop_back();
  return id;
}

void streamcheck_native_set_callbacks(void* record_event, void* block_event, void* query_event,
                                      void* synchronize_event, void* query_stream,
                                      void* synchronize_stream, void* synchronize_device, void* elapsed_time) {
  Callbacks c;
  c.record_event = reinterpret_cast<decltype(c.record_event)>(record_event);
  c.block_event = reinterpret_cast<decltype(c.block_event)>(block_event);
  c.query_event = reinterpret_cast<decltype(c.query_event)>(query_event);
  c.synchronize_event = reinterpret_cast<decltype(c.synchronize_event)>(synchronize_event);
  c.query_stream = reinterpret_cast<decltype(c.query_stream)>(query_stream);
  c.synchronize_stream = reinterpret_cast<decltype(c.synchronize_stream)>(synchronize_stream);
  c.synchronize_device = reinterpret_cast<decltype(c.synchronize_device)>(synchronize_device);
  c.elapsed_time = reinterpret_cast<decltype(c.elapsed_time)>(elapsed_time);
  callbacks = c;
}

}  // extern "C"
